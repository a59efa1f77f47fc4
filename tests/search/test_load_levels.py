"""One rule for default load levels, through the API and the library alike."""

from __future__ import annotations

from tuner.api.schemas import TuneIn
from tuner.domain import TrafficFormat, TrafficRequest
from tuner.load_levels import REQUESTS_PER_SLOT, default_levels
from tuner.search import default_levels as library_levels

SAMPLE = [TrafficRequest(TrafficFormat.COMPLETIONS, prompt=f"p{i}", output_tokens=8) for i in range(300)]


def test_both_doors_give_the_same_levels() -> None:
    assert tuple(library_levels(SAMPLE)) == default_levels(len(SAMPLE))


def test_windows_scale_with_concurrency_and_reach_max_num_seqs() -> None:
    levels = default_levels(len(SAMPLE), max_num_seqs=256)
    assert [lv.concurrency for lv in levels] == [1, 8, 32, 128, 256]
    assert all(lv.num_requests >= REQUESTS_PER_SLOT * lv.concurrency for lv in levels)
    assert [lv.concurrency for lv in default_levels(20)] == [1, 8]  # a level needs as many distinct requests


def test_explicit_concurrency_scales_unless_the_count_is_given() -> None:
    scaled = TuneIn(model="m", traffic="0" * 32, concurrency=[1, 64]).levels()
    assert [lv.num_requests for lv in scaled] == [32, 256]
    given = TuneIn(model="m", traffic="0" * 32, concurrency=[1, 64], num_requests=40).levels()
    assert [lv.num_requests for lv in given] == [40, 40]
