"""A runner cut off from the database long enough to lose its job: fenced at its next write, it stops its
trials and writes nothing. (That the new owner does not kill what the live, fenced runner still holds is
the executors' ``reclaim``, tested in their contract suite on real leases.)"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import update

from tests.fakes import FakeEvaluator, ListPlanner
from tests.runner.test_job_runner import GHOST, SPECS, runner, submit
from tuner import tuning
from tuner.domain import JobStatus
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow
from tuner.tuning import Claim, LostClaim


def test_a_claim_is_fenced_by_its_epoch(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job_id = submit(factory)
    with transaction(factory) as s:
        first = tuning.claim_job(s, "a@h", stale_after_s=60)
        assert first is not None
        a = Claim(job_id, "a@h", first.attempts)
        assert tuning.fence(s, a) is False
    with transaction(factory) as s:  # a's heartbeat went stale; b takes over (same name: a restarted "a")
        s.execute(update(JobRow).where(JobRow.id == job_id).values(heartbeat_at=first.heartbeat_at.replace(year=2000)))
    with transaction(factory) as s:
        second = tuning.claim_job(s, "a@h", stale_after_s=60)
        assert second is not None and second.attempts == a.epoch + 1
    with pytest.raises(LostClaim), transaction(factory) as s:
        tuning.fence(s, a)  # the same worker name, an older claim: still fenced
    with transaction(factory) as s:
        assert tuning.finish_job(s, job_id, "a@h", JobStatus.FAILED, epoch=a.epoch) is False
        assert tuning.fence(s, Claim(job_id, "a@h", second.attempts)) is False


def test_a_fenced_runner_stops_its_trials_and_writes_nothing(db_url: str) -> None:
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
