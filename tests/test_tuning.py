"""The use cases of tuner/tuning.py on the database: claims (each job claimed once, by the hardware a worker
has, fenced by the claim's epoch) and the retention of traffic samples."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from tests.fakes import LEVELS, REQUESTS, submit
from tuner import tuning
from tuner.domain import Engine, JobSpec, JobStatus, ModelRef
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow, TrafficSampleRow
from tuner.tuning import Claim, LostClaim


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


def test_retention_deletes_prompts_keeps_stats(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    with transaction(factory) as s:
        row = tuning.create_traffic(s, REQUESTS, retention_days=1)
        sid, fp = row.id, row.fingerprint
    with transaction(factory) as s:
        assert tuning.purge_expired_traffic(s) == 0
        assert tuning.purge_expired_traffic(s, now=datetime.now(UTC) + timedelta(days=2)) == 1
    with factory() as s:
        row = s.get(TrafficSampleRow, sid)
        assert row.content is None and row.fingerprint == fp and row.stats["request_count"] == len(REQUESTS)
