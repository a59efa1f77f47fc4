"""Schedule ranges, acceptance curves, the cost model, default levels and the objective."""

import math

import pytest

from tuner.domain import LatencyStats, LevelResult, LoadLevel, Proposer, SpecConfig, SpecDecodeStats, TrafficRequest
from tuner.search import AcceptanceCurve, batch_ranges, build_schedule, default_levels
from tuner.search.cost_model import StepPoint, TokenCurve, fit_step_model
from tuner.search.objective import combine, slo_violation


def test_batch_ranges_from_levels():
    assert batch_ranges([1, 8, 32, 128]) == [(1, 4), (5, 16), (17, 64), (65, 1024)]
    assert batch_ranges([1, 2], max_num_seqs=256) == [(1, 1), (2, 256)]
    assert batch_ranges([4, 6]) == [(1, 4), (5, 1024)]


def test_schedule_merges_equal_k_allows_zero_and_matches_k_at():
    sched = build_schedule({1: 5, 8: 5, 32: 2, 128: 0}, max_num_seqs=512)
    assert sched == ((1, 16, 5), (17, 64, 2), (65, 512, 0))
    spec = SpecConfig(method="eagle3", num_speculative_tokens=5, model="d", schedule=sched)
    assert [spec.k_at(b) for b in (1, 16, 17, 64, 65, 512)] == [5, 5, 2, 2, 0, 0]
    assert spec.to_vllm()["num_speculative_tokens_per_batch_size"] == [[1, 16, 5], [17, 64, 2], [65, 512, 0]]


def test_acceptance_curve_predicts_every_shallower_depth():
    a = (0.8, 0.7, 0.6, 0.5)
    drafts = 100_000
    per, surv = [], 1.0
    for x in a:
        surv *= x
        per.append(round(drafts * surv))
    curve = AcceptanceCurve.pooled([SpecDecodeStats(drafts, drafts * 4, sum(per), tuple(per), 4, drafts)] * 3)
    assert curve.conditional == pytest.approx(a, abs=1e-3)
    for k in range(1, 5):
        expected = 1 + sum(math.prod(a[:j]) for j in range(1, k + 1))
        assert curve.tau(k) == pytest.approx(expected, abs=1e-3)


def test_variable_length_curve_uses_decode_steps_when_known():
    sd = SpecDecodeStats(
        num_drafts=500,
        num_draft_tokens=1500,
        num_accepted_tokens=600,
        accepted_per_position=(300, 200, 100),
        num_speculative_tokens=3,
        decode_steps=1000,
    )
    biased = AcceptanceCurve.pooled([sd])
    true = AcceptanceCurve.pooled([sd], use_steps=True)
    assert biased.tau(3) == pytest.approx(sd.acceptance_length)
    assert true.tau(3) == pytest.approx(1.6)


def test_token_curve_is_monotone_and_extends_past_its_last_knot():
    curve = TokenCurve.isotonic([(1, 6.0, 1), (8, 5.0, 1), (32, 7.0, 1), (128, 15.0, 1)])
    assert [round(y, 3) for _, y in curve.knots] == [5.5, 7.0, 15.0]  # 1 and 8 pooled: never decreasing
    assert curve(0.5) == 5.5 and curve(80) == pytest.approx(11.0)
    assert curve(256) == pytest.approx(15.0 + 128 * 8 / 96)  # the last segment's slope, compute-bound


def _roofline(n: float, knee: float = 48.0) -> float:
    # flat until the batch's tokens cross the knee, then growing with them: not linear in batched tokens
    return 6.0 * (1 + (n / knee) ** 4) ** 0.25


@pytest.mark.parametrize("knee", [48.0, 192.0, 768.0])
def test_the_step_model_learns_a_roofline_knee_from_the_baseline_and_one_depth(knee):
    """Baseline at four concurrencies and one chain drafter at depth 8 (k x (0.4 + 0.005 c) of its own):
    the shallower depths' extra step time, which a model linear in batched tokens gets wrong on both sides
    of the knee, comes out within 30% (or 0.1 ms); the linear interpolation between the baseline's batches is
    what is left of the error."""
    cs = (1, 8, 32, 128)
    points = [StepPoint(c, _roofline(c, knee)) for c in cs]
    points += [StepPoint(c, _roofline(c * 9, knee) + 8 * (0.4 + 0.005 * c), "e3", Proposer.CHAIN, 8, 8.0) for c in cs]
    model = fit_step_model(points)
    assert all(abs(r) < 0.05 for r in model.residuals)
    for c in cs:
        for k in (1, 2, 4):
            true = _roofline(c * (1 + k), knee) - _roofline(c, knee) + k * (0.4 + 0.005 * c)
            assert model.extra("e3", Proposer.CHAIN, c, k, float(k)) == pytest.approx(true, rel=0.3, abs=0.1)


def test_default_levels_follow_the_sample():
    many = [TrafficRequest(format="completions", prompt="x")] * 300
    assert [lv.label for lv in default_levels(many)] == ["c1", "c8", "c32", "c128"]
    assert all(lv.num_requests >= lv.value for lv in default_levels(many))
    few = [TrafficRequest(format="completions", prompt="x")] * 10
    assert [lv.label for lv in default_levels(few)] == ["c1", "c8"]


def test_geometric_objective_and_slo_violation():
    assert combine({"c1": 2.0, "c128": 0.5}, {"c1": 1.0, "c128": 1.0}) == pytest.approx(1.0)
    assert combine({"c1": 2.0, "c128": 0.5}, {"c1": 3.0, "c128": 1.0}) == pytest.approx(2**0.5)
    lr = LevelResult(level=LoadLevel(), tpot_ms=LatencyStats(p99=30.0), ttft_ms=LatencyStats(p99=100.0))
    from tuner.domain import SLO

    assert slo_violation(lr, SLO(p99_tpot_ms=20.0)) == pytest.approx(0.5)
    assert slo_violation(lr, SLO(p99_tpot_ms=40.0, p99_ttft_ms=200.0)) < 0
