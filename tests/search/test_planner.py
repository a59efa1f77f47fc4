"""The planner's contract on a small controllable evaluator (tests/search/fake_engine.py)."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from tests.search.fake_engine import FakeEngine
from tests.search.support import LEVELS, run, space
from tuner.domain import SLO, Budget, FailureClass, Method, ModelRef, SpecConfig, TrialSpec, TrialStatus
from tuner.search import OptunaPlanner


def test_baseline_first_then_probes_then_confirmations():
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=20), study_name="t")
    sampler = planner.study.sampler
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert sampler._multivariate and sampler._group and sampler._constant_liar
    history = run(planner, FakeEngine())
    first = history[0][0]
    assert first.purpose == "baseline" and first.spec.is_off
    assert history[1][0].spec.num_speculative_tokens == 8  # fixed-length probe at the deepest depth
    confirms = [p for p, _ in history if p.purpose == "confirm"]
    # a noise-free engine leaves "speculate or not" clear: only the schedule (never in the search) is run, and
    # again only while it and the static best are within three noise widths
    assert confirms and all(p.spec.schedule is not None for p in confirms)
    assert len(confirms) <= planner.confirm_runs
    assert planner.finished
    out = planner.outcome()
    assert out.deployed.method is Method.EAGLE3 and out.speedup.runs >= 1
    assert out.speedup.low - 1e-9 <= out.speedup.mean <= out.speedup.high + 1e-9
    assert set(out.speedup.per_level) == {"c1", "c8", "c32", "c128"}
    assert out.baseline_trial == 0 and out.best_trial is not None
    assert out.skipped and all(s.reason for s in out.skipped)
    assert len(out.per_level_winners) == 4
    search = [p for p, _ in history if p.purpose != "confirm"]
    # this fake's steps are far from what the model assumes (its first predictions miss by 15-20%): the
    # error band widens and the search measures more of the grid, never all of it
    assert len(search) < space().grid_size


def test_outcome_before_confirmation_is_best_so_far_and_says_unconfirmed():
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=20))
    engine = FakeEngine()
    ref = None
    while (p := planner.ask()) is not None and p.purpose != "confirm":
        r = engine(TrialSpec(model=ModelRef("m"), spec=p.spec, levels=LEVELS, requests=(), reference_outputs=ref))
        ref = ref or r.reference_outputs
        planner.tell(p.number, r)
    out = planner.outcome()
    assert not out.best.is_off
    assert any(n.startswith("unconfirmed") for n in out.notes)


def test_tell_is_idempotent_and_abandon_requeues_the_same_config():
    planner = OptunaPlanner(space(), LEVELS)
    engine = FakeEngine()
    base = planner.ask()
    result = engine(TrialSpec(model=ModelRef("m"), spec=base.spec, levels=LEVELS, requests=()))
    planner.tell(base.number, result)
    planner.tell(base.number, result)  # ignored
    assert sum(1 for t in planner.study.trials if t.state.name == "COMPLETE") == 1
    probe = planner.ask()
    planner.abandon(probe.number, "runner died")
    planner.abandon(probe.number, "again")  # ignored
    assert planner.study.trials[probe.number].state.name == "FAIL"
    again = planner.ask()
    assert again.spec == probe.spec and again.number != probe.number
    assert not any(t.state.name == "RUNNING" and t.number == probe.number for t in planner.study.trials)


def test_ask_batch_gives_distinct_parallel_proposals():
    planner = OptunaPlanner(space(), LEVELS)
    batch = planner.ask_batch(3)
    assert len(batch) == 3 and len({p.spec.key() for p in batch}) == 3 and batch[0].spec.is_off


def test_unsupported_is_never_proposed_again_and_free():
    engine = FakeEngine(fail=lambda s: FailureClass.UNSUPPORTED if s.method is Method.EAGLE3 else None)
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=3), confirm_runs=0)
    history = run(planner, engine)
    eagle = [p for p, _ in history if p.spec.method is Method.EAGLE3]
    assert len(eagle) == 1
    launched = [p for p, r in history if not (r.failure and r.failure.cls is FailureClass.UNSUPPORTED)]
    assert len(launched) == 3  # the refused trial did not use the budget of 3
    out = planner.outcome()
    assert any("unsupported" in s.reason for s in out.skipped)


def test_oom_narrows_depths_below_the_failed_one():
    engine = FakeEngine(
        fail=lambda s: FailureClass.OOM if s.method is Method.EAGLE3 and s.num_speculative_tokens > 3 else None
    )
    planner = OptunaPlanner(space([Method.EAGLE3]), LEVELS, budget=Budget(max_trials=12))
    history = run(planner, engine)
    depths = [
        p.spec.num_speculative_tokens for p, _ in history if p.spec.method is Method.EAGLE3 and p.purpose != "confirm"
    ]
    assert depths[0] == 8 and depths[1] == 4  # halved after the first OOM
    failed = {p.spec.num_speculative_tokens for p, r in history if r.status is TrialStatus.FAILED}
    assert all(d not in failed or d == min(x for x in failed if x >= d) for d in depths)
    assert len(failed) == len([d for d in depths if d > 3])  # no failed depth tried twice
    out = planner.outcome()
    assert out.best.method is Method.EAGLE3 and out.best.num_speculative_tokens <= 3
    assert any("out of memory" in n for n in out.notes)


def test_crash_at_start_excludes_the_arm_without_retry():
    engine = FakeEngine(fail=lambda s: FailureClass.CRASH if s.method is Method.EAGLE3 else None)
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12))
    history = run(planner, engine)
    assert sum(1 for p, _ in history if p.spec.method is Method.EAGLE3) == 1
    assert planner.outcome().best.method in (Method.NGRAM, Method.OFF)


def test_diverged_is_never_best_nor_schedule():
    engine = FakeEngine(diverge=frozenset({Method.EAGLE3}))
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12))
    run(planner, engine)
    out = planner.outcome()
    assert out.best.method is not Method.EAGLE3
    assert out.schedule is None or out.schedule.method is not Method.EAGLE3
    assert all(w.spec.method is not Method.EAGLE3 for w in out.per_level_winners)


def test_off_when_nothing_beats_the_baseline():
    engine = FakeEngine(acceptance={Method.EAGLE3: 0.1, Method.NGRAM: 0.05})
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12))
    history = run(planner, engine)
    out = planner.outcome()
    assert out.best.is_off and out.schedule is None
    assert any(n.startswith("off") for n in out.notes)
    # whatever was confirmed (here a schedule predicted slightly above noise) was not recommended
    assert all(p.spec.is_off or p.spec.schedule is not None for p, _ in history if p.purpose == "confirm")


def test_a_baseline_level_without_tpot_leaves_untried_configs_unpredicted_not_a_crash():
    """A level whose streams each arrived in one client read has TPOT 0 (a loaded CPU server flushes a
    whole short output at once): the planner must go on measuring, not fail the job on a missing step time."""
    engine = FakeEngine()

    def burst_at_c8(spec: TrialSpec, ctx=None):
        r = engine(spec, ctx)
        if not spec.spec.is_off:
            return r
        zero = dataclasses.replace(r.level("c8").tpot_ms, mean=0.0)
        levels = tuple(dataclasses.replace(lr, tpot_ms=zero) if lr.level.label == "c8" else lr for lr in r.levels)
        return dataclasses.replace(r, levels=levels)

    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=8))
    history = run(planner, burst_at_c8)
    assert len(history) >= 3 and planner.finished
    assert {p.spec.method for p, _ in history} >= {Method.OFF, Method.EAGLE3, Method.NGRAM}
    assert planner.outcome().best is not None


def test_a_client_bound_level_decides_nothing_and_the_answer_says_so():
    """c128 measured while the replay could not keep up: it gets no per-level winner, no weight in the
    objective, and a note naming the trial and the reason."""
    engine = FakeEngine()

    def bound_at_c128(spec: TrialSpec, ctx=None):
        r = engine(spec, ctx)
        levels = tuple(
            dataclasses.replace(lr, client_bound=True, client_bound_reason="client event loop lagged 90 ms")
            if lr.level.label == "c128"
            else lr
            for lr in r.levels
        )
        return dataclasses.replace(r, levels=levels)

    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=12))
    run(planner, bound_at_c128)
    out = planner.outcome()
    assert {w.level for w in out.per_level_winners} == {"c1", "c8", "c32"}
    note = next(n for n in out.notes if n.startswith("c128 decided nothing"))
    assert "trial 0" in note and "lagged 90 ms" in note
    assert "c128=" not in out.notes[0]  # the objective's weights leave it out
    assert not out.best.is_off  # the other levels still decide


def test_slo_violations_are_infeasible():
    # deep configs blow the p99 TPOT budget at c128: the winner must meet it where the baseline does
    def p99(spec: SpecConfig, level, tpot):
        return 1000.0 if spec.num_speculative_tokens > 2 and level.value >= 32 else 1.5 * tpot

    engine = FakeEngine(per_c_cost=0.0005, p99_tpot=p99)
    planner = OptunaPlanner(space([Method.EAGLE3]), LEVELS, slo=SLO(p99_tpot_ms=500.0), budget=Budget(max_trials=12))
    run(planner, engine)
    out = planner.outcome()
    assert out.best.method is Method.EAGLE3 and out.best.num_speculative_tokens <= 2
    infeasible = [
        t for t in planner.study.trials if t.state.name == "COMPLETE" and any(v > 0 for v in t.constraints.values())
    ]
    assert infeasible  # the probe at depth 8 was recorded as infeasible for TPE
    for w in out.per_level_winners:
        if w.level in ("c32", "c128"):
            assert w.spec.num_speculative_tokens <= 2


def test_schedule_varies_k_over_levels_and_per_level_winners_differ_note():
    engine = FakeEngine(per_c_cost=0.01)
    planner = OptunaPlanner(space([Method.EAGLE3]), LEVELS, budget=Budget(max_trials=12), max_num_seqs=256)
    history = run(planner, engine)
    out = planner.outcome()
    assert out.schedule is not None
    sched = out.schedule.schedule
    assert sched[0][0] == 1 and sched[-1][1] == 256
    assert all(0 <= k <= out.schedule.num_speculative_tokens for _, _, k in sched)
    assert len({k for _, _, k in sched}) > 1
    assert [p for p, _ in history if p.purpose == "confirm" and p.spec.schedule is not None]
    assert planner.schedule_speedup() is not None and planner.schedule_speedup().runs >= 1
    assert any(n.startswith("per-level winners differ") for n in out.notes)


def test_resume_from_storage_reruns_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    engine = FakeEngine()
    first = OptunaPlanner(space(), LEVELS, storage=url, study_name="job-1")
    ref = None
    for _ in range(3):
        p = first.ask()
        r = engine(TrialSpec(model=ModelRef("m"), spec=p.spec, levels=LEVELS, requests=(), reference_outputs=ref))
        ref = ref or r.reference_outputs
        first.tell(p.number, r)
    dangling = first.ask()  # the process "dies" with this one running
    finished = {p.spec.key() for p, _ in first.history()}
    second = OptunaPlanner(space(), LEVELS, storage=url, study_name="job-1")
    assert [p.number for p in second.pending()] == [dangling.number]
    for p in second.pending():
        second.abandon(p.number, "resumed")
    history = run(second, engine)
    assert not [p for p, _ in history if p.purpose != "confirm" and p.spec.key() in finished]
    assert history[0][0].spec == dangling.spec  # the abandoned config runs again, first
    assert second.finished and len(second.history()) == len(history) + 3
    with pytest.raises(ValueError):
        OptunaPlanner(space([Method.NGRAM]), LEVELS, storage=url, study_name="job-1")


def test_parallel_asks_wait_for_pending_instead_of_guessing():
    planner = OptunaPlanner(space([Method.EAGLE3]), LEVELS, budget=Budget(max_trials=12), confirm_runs=1)
    engine = FakeEngine()
    batch = planner.ask_batch(5)
    assert [p.spec.is_off for p in batch][:1] == [True]
    assert len({p.spec.key() for p in batch}) == len(batch)
    pending = {p.spec.key() for p in batch}
    ref = None

    def more(asked: list) -> list:
        # never the same config twice while one run of it is pending (a close call re-measures after it)
        keys = [p.spec.key() for p in asked]
        assert not pending & set(keys) and len(keys) == len(set(keys))
        pending.update(keys)
        return asked

    while batch:
        p = batch.pop(0)
        r = engine(TrialSpec(model=ModelRef("m"), spec=p.spec, levels=LEVELS, requests=(), reference_outputs=ref))
        ref = ref or r.reference_outputs
        planner.tell(p.number, r)
        pending.discard(p.spec.key())
        batch += more(planner.ask_batch(2))
        if not batch and not planner.finished:
            nxt = planner.ask()
            if nxt is not None:
                batch += more([nxt])
    assert planner.finished and not planner.outcome().best.is_off
    told = [p.spec.key() for p, _ in planner.history() if p.purpose == "search"]
    repeats = len(told) - len(set(told))
    assert repeats <= 2 * len(LEVELS)  # close calls only: at most MAX_SEARCH_REPEATS per level


@pytest.mark.parametrize("objective", ["tpot", "goodput"])
def test_other_objectives(objective):
    planner = OptunaPlanner(space(), LEVELS, objective=objective, budget=Budget(max_trials=12))
    run(planner, FakeEngine())
    out = planner.outcome()
    assert out.best.method is Method.EAGLE3 and out.speedup.mean > 1
    assert any(f"objective {objective}" in n for n in out.notes)


def test_rate_levels_get_no_schedule():
    from tuner.domain import LoadKind, LoadLevel

    rate_levels = (LoadLevel(kind=LoadKind.RATE, value=2.0, num_requests=32),)
    planner = OptunaPlanner(space([Method.EAGLE3]), rate_levels, budget=Budget(max_trials=6), confirm_runs=1)
    engine = FakeEngine()
    ref = None
    while (p := planner.ask()) is not None:
        r = engine(TrialSpec(model=ModelRef("m"), spec=p.spec, levels=rate_levels, requests=(), reference_outputs=ref))
        ref = ref or r.reference_outputs
        planner.tell(p.number, r)
    out = planner.outcome()
    assert out.schedule is None and any("not closed-loop" in n for n in out.notes)


def test_keep_outputs_false_keeps_greedy_outputs_out_of_the_study():
    """The service's planner: the baseline's outputs (derived from user prompts) never reach Optuna's tables,
    and the planner still hands them to later trials."""
    planner = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=3), study_name="k", keep_outputs=False)
    first = planner.ask()
    assert first is not None and first.spec.is_off
    result = FakeEngine()(TrialSpec(model=ModelRef("m"), spec=first.spec, levels=LEVELS, requests=()))
    assert result.reference_outputs
    planner.tell(first.number, result)
    stored = planner.study.trials[first.number].user_attrs["result"]
    assert stored["reference_outputs"] is None and stored["levels"]
    assert planner.baseline_reference() == result.reference_outputs
    kept = OptunaPlanner(space(), LEVELS, budget=Budget(max_trials=3), study_name="k2")
    p = kept.ask()
    assert p is not None
    kept.tell(p.number, result)
    assert kept.study.trials[p.number].user_attrs["result"]["reference_outputs"]
