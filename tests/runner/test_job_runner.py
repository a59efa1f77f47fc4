"""The job loop with test doubles for the search and the evaluator: claim, heartbeat, cancel, recovery."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from sqlalchemy import select

from tests.fakes import LEVELS, FakeEvaluator, ListPlanner, ThreadExecutor
from tuner import recommendations, runs, tuning
from tuner.domain import (
    Engine,
    JobSpec,
    JobStatus,
    Method,
    ModelRef,
    Proposal,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
)
from tuner.job_runner import JobRunner
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow, RecommendationRow, TrialRow
from tuner.workers.process_group import group_alive, kill_process_group

GHOST = f"ghost@{socket.gethostname()}"  # a dead runner on this host
SPECS = [SpecConfig(Method.NGRAM, 2), SpecConfig(Method.NGRAM, 4), SpecConfig(Method.EAGLE3, 3, model="d")]
REQUESTS = [TrafficRequest(TrafficFormat.COMPLETIONS, prompt=f"p{i}", output_tokens=8) for i in range(4)]


def submit(factory, engine: Engine = Engine.SIMULATED) -> str:  # type: ignore[no-untyped-def]
    with transaction(factory) as s:
        traffic = tuning.create_traffic(s, REQUESTS)
        job, _ = tuning.submit_job(
            s, JobSpec(model=ModelRef("org/m"), traffic_id=traffic.id, engine=engine, levels=LEVELS)
        )
        return job.id


def runner(factory, planner: ListPlanner, evaluator: FakeEvaluator, **kw) -> JobRunner:  # type: ignore[no-untyped-def]
    slots = kw.pop("slots", 2)
    reclaims = kw.pop("reclaims", None)
    return JobRunner(
        factory,
        planner_factory=lambda job_id, spec, reqs: planner,
        executor_factory=lambda spec: ThreadExecutor(evaluator, slots=slots, reclaims=reclaims),
        heartbeat_s=0.1,
        stale_after_s=kw.pop("stale_after_s", 1.0),
        poll_s=0.05,
        **kw,
    )


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


def test_two_runners_never_claim_the_same_job(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    ids = {submit(factory) for _ in range(3)}
    claims: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def claim(worker: str) -> None:
        barrier.wait()
        while True:
            with transaction(factory) as s:
                job = tuning.claim_job(s, worker, stale_after_s=60)
            if job is None:
                return
            with lock:
                claims.append(job.id)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(claims) == sorted(ids)  # each job claimed exactly once


def test_stale_job_is_recovered_without_rerunning_finished_trials(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    # A dead runner claimed the job, finished the baseline and trial 1, and died during trial 2.
    planner = ListPlanner(SPECS)
    dead_ev = FakeEvaluator()
    with transaction(factory) as s:
        tuning.claim_job(s, GHOST, stale_after_s=60)
    from tuner.domain import TrialSpec

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
    planner._next = 4  # the dead runner had asked for 0..3, and died before recording trial 3's launch
    planner.asked[2] = SPECS[1]
    planner.asked[3] = SPECS[2]
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


def _trial(factory, job_id: str, number: int) -> TrialRow:  # type: ignore[no-untyped-def]
    with factory() as s:
        return s.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.number == number)).one()


def test_cancel_from_another_process_stops_running_trials(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    ev = FakeEvaluator(delay_s=30)
    r = runner(factory, ListPlanner(SPECS), ev)
    t = threading.Thread(target=r.run_once)
    t.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not ev.calls:
        time.sleep(0.02)
    assert ev.calls, "the baseline never started"
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
    r = runner(factory, ListPlanner(SPECS), ev)
    t = threading.Thread(target=r.run_once)
    t.start()
    try:
        deadline = time.monotonic() + 15
        while not ev.calls:  # the trial is recorded before its evaluator is called
            assert time.monotonic() < deadline, "the baseline never started"
            time.sleep(0.02)
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
    import subprocess

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


def test_a_worker_claims_only_jobs_for_its_hardware(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    with transaction(factory) as s:
        traffic = tuning.create_traffic(s, REQUESTS)
        jobs = {}
        for hw, engine in [
            ("mi300x", Engine.VLLM),
            ("h200", Engine.VLLM),
            ("auto", Engine.VLLM),
            ("mi355x", Engine.SIMULATED),
        ]:
            row, _ = tuning.submit_job(
                s, JobSpec(model=ModelRef("m"), traffic_id=traffic.id, hardware=hw, engine=engine, levels=LEVELS)
            )
            jobs[row.id] = hw
    claimed = []
    while True:
        with transaction(factory) as s:
            job = tuning.claim_job(s, "mi300x-node", stale_after_s=60, hardware=["mi300x"])
        if job is None:
            break
        claimed.append(jobs[job.id])
    assert sorted(claimed) == ["auto", "mi300x", "mi355x"]  # never the h200 job; simulated stands in for any chip


def test_after_the_baseline_trials_fill_the_free_slots(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    submit(factory)
    ev = FakeEvaluator(delay_s=0.4)
    runner(factory, ListPlanner(SPECS), ev, slots=2).run_once()
    assert ev.calls[0][1] == "off"
    assert ev.max_active == 2  # bounded by the executor's slots, and using them all
