"""Per-concurrency-range answers: the best measured at each level, said plainly when it is "off"."""

from __future__ import annotations

import pytest

from tuner.domain import LevelWinner, Method, SpecConfig, Speedup, TuneOutcome
from tuner.recommendations import _level_answer, level_ranges

DEPLOYED = SpecConfig(Method.EAGLE3, 4, model="d", schedule=((1, 16, 4), (17, 1024, 0)))
OTHER = SpecConfig(Method.NGRAM, 3)


def outcome(per_level: dict[str, float]) -> TuneOutcome:
    speedup = Speedup(mean=1.3, low=1.25, high=1.35, runs=3, per_level=per_level)
    return TuneOutcome(
        best=SpecConfig(Method.EAGLE3, 4, model="d"),
        schedule=DEPLOYED,
        per_level_winners=(),
        speedup=speedup,
        baseline_trial=0,
        best_trial=3,
        noise=0.03,
    )


@pytest.mark.parametrize(
    ("winner", "expect_spec", "confirmed", "says"),
    [
        (LevelWinner("c1", DEPLOYED, 1.8, 9), DEPLOYED, True, "runs on fresh servers"),
        # the deployed schedule runs K=0 at c128 and measured 0.89x there: that range deploys nothing
        (LevelWinner("c128", DEPLOYED, 0.89, 9), SpecConfig(), False, "0.890x there over 3 runs on fresh servers"),
        (LevelWinner("c64", SpecConfig(), 1.0, 0), SpecConfig(), False, "nothing beat the baseline there"),
        (LevelWinner("c8", OTHER, 1.01, 5), SpecConfig(), False, "within noise"),
        (LevelWinner("c8", OTHER, 1.40, 5), OTHER, False, "one search trial (unconfirmed)"),
    ],
)
def test_level_answer(winner: LevelWinner, expect_spec: SpecConfig, confirmed: bool, says: str) -> None:
    out = outcome({"c1": 1.8, "c8": 1.5, "c64": 1.02, "c128": 0.89})
    spec, speedup, why = _level_answer(out, winner)
    assert spec.key() == expect_spec.key()
    assert (speedup is not None) is confirmed
    assert says in why and why.startswith(("No speculation", "Speedup"))


def test_level_ranges_split_at_geometric_midpoints() -> None:
    ranges = level_ranges([1, 8, 32, 128])
    assert [(r.low, r.high) for r in ranges] == [(1, 2), (3, 16), (17, 64), (65, None)]
