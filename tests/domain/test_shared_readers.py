"""One reader per concept: the traffic statistics and the simulated engine classify prompts with the same
code, and the search space and the simulated engine read a model's MTP layers with the same code."""

from __future__ import annotations

import time

import pytest

from tuner.domain import TrafficFormat, TrafficRequest, throttled
from tuner.domain.model_traits import model_traits
from tuner.domain.prompt_kind import SCAN_CHARS, looks_like_code, prompt_kind
from tuner.traffic import sample_stats
from tuner.workers.sim_profiles import ModelProfile, WorkloadProfile

CODE = '''def area(r):
    """Area of a circle."""
    return 3.14159 * r ** 2


class Shape:
    def __init__(self, sides: int) -> None:
        self.sides = sides
'''
PROSE = (
    "The committee met on Tuesday to discuss the harbour project. After a long debate about costs and the "
    "timetable, they agreed to ask the engineers for a second opinion before the spring."
)


def sample(text: str, n: int = 4) -> list[TrafficRequest]:
    return [TrafficRequest(TrafficFormat.COMPLETIONS, prompt=text, output_tokens=64) for _ in range(n)]


@pytest.mark.parametrize(("text", "is_code"), [(CODE, True), (PROSE, False), ("", False)])
def test_traffic_class_and_simulated_workload_agree_on_code(text: str, is_code: bool) -> None:
    assert looks_like_code(text) is is_code
    stats = sample_stats(sample(text or "x"))
    assert (stats.code_fraction == 1.0) is is_code
    assert stats.workload_class.startswith("code/") is is_code
    assert (WorkloadProfile.from_requests(sample(text or "x")).name == "code") is is_code


def test_a_prompt_is_read_up_to_the_scan_limit_only() -> None:
    # Code past the scan limit does not make prose code, and a huge prompt costs a bounded amount of work.
    huge = PROSE * (4 * SCAN_CHARS // len(PROSE)) + CODE * 50
    started = time.perf_counter()
    assert not looks_like_code(huge)
    assert prompt_kind(huge, 64) != "code"
    assert time.perf_counter() - started < 5.0


@pytest.mark.parametrize(
    ("config", "layers"),
    [
        ({"num_nextn_predict_layers": 1}, 1),
        ({"mtp_num_hidden_layers": 2}, 2),
        ({"mtp_config": {"num_nextn_predict_layers": 3}}, 3),
        ({"text_config": {"num_nextn_predict_layers": 1, "hidden_size": 2048}}, 1),  # multimodal wrapper
        ({"num_nextn_predict_layers": 0}, 0),
        ({}, 0),
    ],
)
def test_search_traits_and_simulated_profile_read_the_same_mtp_layers(config: dict, layers: int) -> None:
    assert model_traits(config).mtp_layers == layers
    assert ModelProfile.from_hf_config(config).mtp_layers == layers


def test_moe_experts_are_read_once() -> None:
    config = {"num_local_experts": 8, "num_experts_per_tok": 2, "hidden_size": 1024, "num_hidden_layers": 4}
    traits = model_traits(config)
    profile = ModelProfile.from_hf_config(config)
    assert (traits.moe, traits.num_experts, traits.experts_per_token) == (True, 8, 2)
    assert (profile.moe, profile.num_experts, profile.experts_per_token) == (True, 8, 2)


def test_throttled_asks_at_most_once_per_interval_and_a_yes_sticks() -> None:
    answers = iter([False, True, False])
    calls: list[int] = []

    def ask() -> bool:
        calls.append(1)
        return next(answers)

    check = throttled(ask, every_s=0.05)
    assert check() is False and check() is False  # the second within the interval: not asked
    assert len(calls) == 1
    time.sleep(0.06)
    assert check() is True
    time.sleep(0.06)
    assert check() is True and len(calls) == 2  # once cancelled, always cancelled: never asked again
