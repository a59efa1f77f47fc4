"""The schedule and the outcome's contract: one method+draft (the static best's), confirmed against the static
best, and ``outcome.speedup`` always the speedup of ``outcome.deployed``."""

from __future__ import annotations

import inspect
import math

import pytest

from tests.search.fake_engine import FakeEngine, levels
from tuner.domain import Budget, Method, ModelRef, SpecConfig, TrialSpec
from tuner.search import OptunaPlanner, build_space, tune

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256}
LEVELS = levels(1, 8, 32, 128)
E3, NG = Method.EAGLE3, Method.NGRAM


def space(methods=(E3, NG)):
    return build_space(
        "m",
        LLAMA,
        hardware="h100",
        vllm_version="0.34.0",
        methods=list(methods),
        drafts={E3: ["d/eagle3"]},
        ngram_lookups=[(2, 4)],
    )


def run(planner: OptunaPlanner, engine: FakeEngine, before_confirm=None):
    """Drive the planner to the end; ``before_confirm(planner)`` is called once, before the first confirmation."""
    history, ref = [], None
    while (p := planner.ask()) is not None:
        if before_confirm is not None and p.purpose == "confirm":
            before_confirm(planner)
            before_confirm = None
        r = engine(TrialSpec(model=ModelRef("m"), spec=p.spec, levels=LEVELS, requests=(), reference_outputs=ref))
        ref = ref or r.reference_outputs
        planner.tell(p.number, r)
        history.append((p, r))
    return history


def truth(engine: FakeEngine, spec: SpecConfig) -> float:
    """The noise-free objective: geometric mean over the levels of the fake engine's speedup."""
    return math.exp(sum(math.log(engine.speedup(spec, lv)) for lv in LEVELS) / len(LEVELS))


def best_depth(engine: FakeEngine, level, depths=range(1, 9)) -> int:
    return max(
        depths, key=lambda k: engine.speedup(SpecConfig(method=E3, num_speculative_tokens=k, model="d/e"), level)
    )


# ngram (K = 8 best at every level) beats EAGLE-3 (whose best K falls with concurrency) at every level
NGRAM_WINS = dict(acceptance={E3: 0.8, NG: 0.97}, cost={E3: 0.05, NG: 0.0}, per_c_cost=0.004)
# ngram wins overall, and its own schedule (K = 0 at c128) beats it by ~7%
NGRAM_SCHEDULE_PAYS = dict(acceptance={E3: 0.8, NG: 0.95}, cost={E3: 0.05, NG: 0.0}, per_c_cost=0.01)


def test_no_schedule_from_another_method_when_the_static_best_keeps_one_k():
    engine = FakeEngine(**NGRAM_WINS)
    assert best_depth(engine, LEVELS[0]) != best_depth(engine, LEVELS[-1])  # an EAGLE-3 schedule would vary K
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12), max_num_seqs=256)
    history = run(planner, engine)
    assert any(p.spec.method is E3 for p, _ in history)  # EAGLE-3 was measured
    out = planner.outcome()
    assert out.best.method is NG
    assert out.schedule is None and out.deployed == out.best
    assert any(n.startswith("no schedule for ngram lookup=2-4: K = 8 is best at every level") for n in out.notes)
    assert not [p for p, _ in history if p.spec.schedule is not None]  # no foreign schedule confirmed


def test_kept_schedule_is_the_static_bests_method_and_reports_its_own_speedup():
    engine = FakeEngine(**NGRAM_SCHEDULE_PAYS)
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12), max_num_seqs=256)
    run(planner, engine)
    out = planner.outcome()
    assert out.schedule is not None and out.deployed is out.schedule
    assert (out.schedule.method, out.schedule.model) == (out.best.method, out.best.model)
    assert (out.schedule.prompt_lookup_min, out.schedule.prompt_lookup_max) == (2, 4)
    # the schedule is never run in the search: it gets its own runs, as many as its margin over the static
    # best leaves the decision open (three noise widths over the square root of the runs)
    assert out.speedup == planner.schedule_speedup() and 1 <= out.speedup.runs <= 3
    assert out.speedup.mean == pytest.approx(truth(engine, out.schedule))
    assert out.speedup.mean > truth(engine, out.best) * 1.05
    assert any(n.startswith(f"schedule {out.schedule.label()}") for n in out.notes)


def test_schedule_worse_than_the_static_best_is_dropped_and_speedup_is_the_static_bests():
    engine = FakeEngine(**NGRAM_SCHEDULE_PAYS, schedule_factor=0.9)  # predicted ahead, measured ~4% behind
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12), max_num_seqs=256)
    history = run(planner, engine)
    out = planner.outcome()
    measured = planner.schedule_speedup()
    assert sum(1 for p, _ in history if p.purpose == "confirm" and p.spec.schedule) >= 1  # it was run
    assert measured is not None and measured.mean < out.speedup.mean * (1 - 0.01)
    assert out.schedule is None and out.deployed == out.best and out.best.method is NG
    assert out.speedup.runs >= 1 and out.speedup.mean == pytest.approx(truth(engine, out.best))
    assert any(n.startswith("no schedule:") and "the static best is deployed" in n for n in out.notes)


def test_schedule_slightly_behind_the_static_best_is_not_deployed():
    """Within noise but measured behind on the same kind of runs: the simpler static config is deployed."""
    engine = FakeEngine(**NGRAM_SCHEDULE_PAYS, schedule_factor=0.91)  # ~2.5% behind: within a 5% noise
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12), max_num_seqs=256, noise=0.05)
    run(planner, engine)
    out = planner.outcome()
    measured = planner.schedule_speedup()
    assert measured is not None and measured.mean < out.speedup.mean
    assert out.schedule is None and out.deployed == out.best
    assert out.speedup.mean == pytest.approx(truth(engine, out.best))


def test_a_deployed_schedule_reports_its_own_speedup():
    engine = FakeEngine(**NGRAM_SCHEDULE_PAYS, schedule_factor=1.05)
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12), max_num_seqs=256)
    run(planner, engine)
    out = planner.outcome()
    assert out.schedule is not None and out.deployed == out.schedule
    assert out.speedup.mean == pytest.approx(truth(engine, out.schedule))
    assert out.speedup.mean > truth(engine, out.best)


def test_no_schedule_without_confirmation_runs():
    engine = FakeEngine(**NGRAM_SCHEDULE_PAYS)
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12), max_num_seqs=256, confirm_runs=0)
    history = run(planner, engine)
    out = planner.outcome()
    assert not [p for p, _ in history if p.purpose == "confirm"]
    assert out.schedule is None and out.best.method is NG
    runs = sum(1 for p, _ in history if p.spec.key() == out.best.key())  # its search run and close-call repeats
    assert out.speedup.runs == runs and out.speedup.mean == pytest.approx(truth(engine, out.best))
    assert any("confirm_runs is 0" in n for n in out.notes)


def test_schedule_can_beat_off_when_every_static_config_loses():
    engine = FakeEngine(per_c_cost=0.03)  # EAGLE-3 pays at c1-c8 and loses badly at c32-c128
    planner = OptunaPlanner(space([E3]), LEVELS, budget=Budget(max_trials=12), max_num_seqs=256)
    run(planner, engine)
    out = planner.outcome()
    assert out.best.is_off and out.schedule is not None and out.schedule.method is E3
    assert out.schedule.schedule[-1][2] == 0  # K = 0 where speculation loses
    assert out.speedup.mean == pytest.approx(truth(engine, out.schedule)) and out.speedup.mean > 1.1
    assert not any(n.startswith("do not speculate") for n in out.notes)
    # K = 0 is not off: vLLM's spec-decode bookkeeping still costs. The schedule loses to off at c32 and c128,
    # half the weight, not most: it is deployed, and the outcome says where it loses and by how much
    assert set(out.deployed_losses) == {"c32", "c128"} and all(v < 1 for v in out.deployed_losses.values())
    assert any("is slower than off at c32" in n and "deploy the per-range answers there" in n for n in out.notes)
    winners = {w.level: w.spec for w in out.per_level_winners}
    assert winners["c32"].is_off and winners["c128"].is_off


def test_a_config_losing_to_off_where_most_of_the_weight_is_is_not_deployed():
    engine = FakeEngine(per_c_cost=0.03)
    weights = {"c1": 1.0, "c8": 1.0, "c32": 2.0, "c128": 2.0}  # the high levels carry two thirds
    planner = OptunaPlanner(space([E3]), LEVELS, budget=Budget(max_trials=12), max_num_seqs=256, level_weights=weights)
    run(planner, engine)
    out = planner.outcome()
    assert out.deployed.is_off and not out.deployed_losses
    assert any(n.startswith("not deployed:") and "67% of the weight" in n for n in out.notes)


def test_noise_is_measured_from_confirmation_runs():
    engine = FakeEngine(**NGRAM_SCHEDULE_PAYS)  # noise free: repeats agree, so the measured noise is the 1% floor
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12))
    before = []
    history = run(planner, engine, before_confirm=lambda pl: before.extend(pl.outcome().notes))
    searched = [p.spec.key() for p, _ in history if p.purpose != "confirm"]
    # the default until a config has run twice (a close call in the search, or a confirmation)
    assert any(f"noise taken as {'1.0' if len(set(searched)) < len(searched) else '3.0'}%" in n for n in before)
    assert any("noise taken as 1.0%" in n for n in planner.outcome().notes)


def test_three_confirmation_runs_by_default():
    assert inspect.signature(tune).parameters["confirm_runs"].default == 3
    assert inspect.signature(OptunaPlanner).parameters["confirm_runs"].default == 3
