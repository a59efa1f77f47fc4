"""The job loop with test doubles for the search and the evaluator (tests/fakes.py): a job run to its
recommendation, recovery of a dead runner's job, cancel, orphaned servers, slots; and fencing: a runner cut off
from the database long enough to lose its job is fenced at its next write, stops its trials and writes nothing.
(That the new owner does not kill what the live, fenced runner still holds is the executors' ``reclaim``, tested
in their contract suite on real leases; the claims themselves are tests/test_tuning.py's.)"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from tests.fakes import GHOST, LEVELS, SPECS, FakeEvaluator, ListPlanner, runner, submit
from tuner import recommendations, runs, tuning
from tuner.domain import Engine, JobStatus, Method, ModelRef, Proposal, SpecConfig, TrialSpec
from tuner.job_runner import JobRunner
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow, RecommendationRow, TrialRow
from tuner.workers.process_group import group_alive, kill_process_group


def _start(r: JobRunner, ev: FakeEvaluator) -> threading.Thread:
    """``r.run_once()`` on a thread, handed back once the evaluator runs the job's first trial (the baseline)."""
    t = threading.Thread(target=r.run_once)
    t.start()
    deadline = time.monotonic() + 15
    while not ev.calls:  # the trial is recorded before its evaluator is called
        assert time.monotonic() < deadline, "the baseline never started"
        time.sleep(0.02)
    return t


def test_job_runs_to_a_recommendation(db_url: str, tmp_path: Path) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    planner, ev = ListPlanner(SPECS), FakeEvaluator()
    assert runner(factory, planner, ev, log_dir=tmp_path).run_once() == job_id
    with factory() as s:
        job = s.get(JobRow, job_id)
        assert job.status == "succeeded", job.error
        trials = tuning.list_trials(s, job_id)
        assert [t.number for t in trials] == [0, 1, 2, 3]
        assert all(t.status == "succeeded" and t.engine == "simulated" for t in trials)
        # the baseline ran first and alone; its outputs were the reference for the others
        assert ev.calls[0] == (0, "off")
        rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED)
        assert rec["simulated"] is True and rec["engine"] == "simulated"
        assert (
            rec["speculative_config"]["method"] == "ngram" and rec["speculative_config"]["num_speculative_tokens"] == 4
        )
        assert rec["summary"].startswith("[SIMULATED]")
        assert rec["serve_args"][:3] == ["vllm", "serve", "org/m"]
        assert "--speculative-config" in rec["serve_args"]
        # simulated results never answer a query that does not ask for them
        try:
            recommendations.find(s, model="org/m")
            raise AssertionError("a simulated recommendation answered a measured query")
        except Exception as e:
            assert "no measured recommendation" in str(e)
        by_c = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, concurrency=8)
        assert by_c["scope"] != "all" and by_c["concurrency"]["low"] <= 8


def test_stale_job_is_recovered_without_rerunning_finished_trials(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    # A dead runner claimed the job, finished the baseline and trial 1, and died during trial 2.
    planner = ListPlanner(SPECS)
    dead_ev = FakeEvaluator()
    with transaction(factory) as s:
        tuning.claim_job(s, GHOST, stale_after_s=60)
    for number, spec in [(0, SpecConfig()), (1, SPECS[0])]:
        result = dead_ev(TrialSpec(model=ModelRef("org/m"), spec=spec, levels=LEVELS, requests=()))
        with transaction(factory) as s:
            runs.start_trial(s, job_id, Proposal(number, spec), levels=[], worker=GHOST)
            runs.finish_trial(s, job_id, number, result)
    with transaction(factory) as s:
        runs.start_trial(s, job_id, Proposal(2, SPECS[1]), levels=[], worker=GHOST)
        runs.set_trial_pgid(s, job_id, 2, 999_999)
        s.get(JobRow, job_id).heartbeat_at = s.get(JobRow, job_id).heartbeat_at.replace(year=2000)
    # The recovering runner's planner resumes from storage: it has seen what the dead one told it.
    planner.tell(0, runs.trial_result(_trial(factory, job_id, 0)))
    planner.tell(1, runs.trial_result(_trial(factory, job_id, 1)))
    planner.resume({2: SPECS[1], 3: SPECS[2]})  # the dead runner asked for 3 and died before recording its launch
    ev = FakeEvaluator()
    reclaims: list[tuple[str, int]] = []
    assert runner(factory, planner, ev, reclaims=reclaims).run_once() == job_id
    assert reclaims == [(job_id, 0)]  # the dead runner's servers are reclaimed before anything runs
    with factory() as s:
        job = s.get(JobRow, job_id)
        assert job.status == "succeeded", job.error
        assert job.attempts == 2
        rows = tuning.list_trials(s, job_id)
        by_number = {r.number: r for r in rows}
        assert by_number[2].status == "failed" and by_number[2].failure_class == "infrastructure"
        assert "died" in by_number[2].failure_reason
        assert planner.abandoned == [2, 3]  # 3 was asked for but never launched: failed too, never left running
        assert 3 not in by_number
        # finished trials were never run again; the abandoned config ran once more under a new number
        assert sorted(label for _, label in ev.calls) == sorted([SPECS[1].label(), SPECS[2].label()])
        assert all(n not in (0, 1, 2, 3) for n, _ in ev.calls)
        assert by_number[4].status == "succeeded" and by_number[4].config == by_number[2].config
        assert len(s.scalars(select(RecommendationRow).where(RecommendationRow.job_id == job_id)).all()) >= 1


def _trial(factory: sessionmaker[Session], job_id: str, number: int) -> TrialRow:
    with factory() as s:
        return s.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.number == number)).one()


def test_cancel_from_another_process_stops_running_trials(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    ev = FakeEvaluator(delay_s=30)
    t = _start(runner(factory, ListPlanner(SPECS), ev), ev)
    with transaction(make_session_factory(make_engine(db_url))) as s:  # a different engine: another process
        tuning.request_cancel(s, job_id)
    t.join(15)
    assert not t.is_alive()
    with factory() as s:
        assert s.get(JobRow, job_id).status == JobStatus.CANCELLED.value
        assert [tr.status for tr in tuning.list_trials(s, job_id)] == ["cancelled"]


def test_a_running_trial_shows_its_stage_and_level(db_url: str) -> None:
    from tuner.api.routes.tune import trial_out

    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    ev = FakeEvaluator(delay_s=30)
    t = _start(runner(factory, ListPlanner(SPECS), ev), ev)
    try:
        deadline = time.monotonic() + 15
        while (row := _trial(factory, job_id, 0)).stage is None:
            assert time.monotonic() < deadline, "no stage was recorded"
            time.sleep(0.05)
        shown = trial_out(row)
        assert (shown.status, shown.phase, shown.level) == ("running", "measuring", f"1 of {len(LEVELS)} (c1)")
    finally:
        with transaction(factory) as s:
            tuning.request_cancel(s, job_id)
        t.join(15)
    assert trial_out(_trial(factory, job_id, 0)).phase is None  # over: no stage shown


def test_cancel_of_a_job_whose_runner_died_kills_its_processes_and_ends_it(db_url: str) -> None:
    """Cancel works from any process even when no live runner holds the job: the next runner finishes it."""
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    with transaction(factory) as s:
        tuning.claim_job(s, GHOST, stale_after_s=60)
        runs.start_trial(s, job_id, Proposal(0, SpecConfig()), levels=[], worker=GHOST)
        runs.set_trial_pgid(s, job_id, 0, 888_888)
    with transaction(factory) as s:
        tuning.request_cancel(s, job_id)
        job = s.get(JobRow, job_id)
        assert job.status == "running" and job.cancel_requested  # only a runner can stop what runs
        job.heartbeat_at = job.heartbeat_at.replace(year=2000)  # ... and the ghost is dead
    ev = FakeEvaluator()
    reclaims: list[tuple[str, int]] = []
    assert runner(factory, ListPlanner(SPECS), ev, reclaims=reclaims).run_once() == job_id
    assert reclaims == [(job_id, 0)]
    assert ev.calls == []  # nothing new was launched
    with factory() as s:
        assert s.get(JobRow, job_id).status == JobStatus.CANCELLED.value
        (trial,) = tuning.list_trials(s, job_id)
        assert trial.status == "failed" and trial.failure_class == "infrastructure"


def test_a_runner_kills_servers_left_on_its_host_by_trials_recovered_elsewhere(db_url: str) -> None:
    """Host B recovered the job (it cannot kill what runs on host A); a runner on host A sweeps it."""
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    orphan = subprocess.Popen(["sleep", "600"], start_new_session=True)
    running = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        with transaction(factory) as s:
            for number, worker, pgid in [
                (0, GHOST, orphan.pid),
                (1, "other@elsewhere", orphan.pid),
                (2, GHOST, running.pid),
            ]:
                runs.start_trial(s, job_id, Proposal(number, SpecConfig()), levels=[], worker=worker)
                runs.set_trial_pgid(s, job_id, number, pgid)
            for row in tuning.list_trials(s, job_id)[:2]:  # 0 and 1 were recovered; 2 is still running
                runs.mark_trial_abandoned(s, row, "runner died; recovered on host B")
        r = runner(factory, ListPlanner(SPECS), FakeEvaluator(), kill_group=kill_process_group, group_alive=group_alive)
        assert r.sweep_orphans() == [orphan.pid]
        assert orphan.wait(timeout=10) is not None
        assert running.poll() is None  # a running trial's server is left alone
        assert r.sweep_orphans() == []  # and a group already gone is not signalled again
    finally:
        for proc in (orphan, running):
            proc.kill()
            proc.wait()


def test_failed_baseline_fails_the_job_with_its_reason(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    ev = FakeEvaluator(fail={Method.OFF})
    runner(factory, ListPlanner([]), ev).run_once()
    with factory() as s:
        job = s.get(JobRow, job_id)
        assert job.status == "failed"
        assert "baseline" in job.error and "not supported" in job.error
        trial = tuning.list_trials(s, job_id)[0]
        assert trial.failure_class == "unsupported_config" and trial.failure_reason


def test_after_the_baseline_trials_fill_the_free_slots(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    submit(factory)
    ev = FakeEvaluator(delay_s=0.4)
    runner(factory, ListPlanner(SPECS), ev, slots=2).run_once()
    assert ev.calls[0][1] == "off"
    assert ev.max_active == 2  # bounded by the executor's slots, and using them all


def test_a_fenced_runner_stops_its_trials_and_writes_nothing(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    ev = FakeEvaluator(delay_s=30)
    t = _start(runner(factory, ListPlanner(SPECS), ev), ev)
    # Another runner took the job over (as after a long database outage): a newer epoch, another owner.
    with transaction(factory) as s:
        s.execute(update(JobRow).where(JobRow.id == job_id).values(claimed_by=GHOST, attempts=JobRow.attempts + 1))
    t.join(15)
    assert not t.is_alive(), "the fenced runner kept going"
    assert ev.active == 0  # its trial was stopped
    with factory() as s:
        job = s.get(JobRow, job_id)
        assert job.status == "running" and job.claimed_by == GHOST  # not ended by the fenced runner
        (trial,) = tuning.list_trials(s, job_id)
        assert trial.status == "running" and trial.result is None  # left for the new owner to recover
