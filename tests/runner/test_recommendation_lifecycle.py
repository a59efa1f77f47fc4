"""History, staleness, workload matching and retention of what jobs publish."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.fakes import FakeEvaluator, ListPlanner
from tests.runner.test_job_runner import SPECS, runner, submit
from tuner import recommendations, tuning
from tuner.domain import Engine
from tuner.errors import NotFound
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import TrafficSampleRow


def test_history_staleness_and_workload_class(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    first = submit(factory)
    runner(factory, ListPlanner(SPECS), FakeEvaluator()).run_once()
    second = submit(factory)
    runner(factory, ListPlanner(SPECS[:1]), FakeEvaluator()).run_once()
    with factory() as s:
        rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED)
        assert rec["provenance"]["job_id"] == second
        assert [h["job_id"] for h in rec["history"]] == [first]  # past answers are kept
        assert rec["stale"] is False
        cls = rec["measured_on"]["workload_class"]
        assert recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload=cls)["id"] == rec["id"]
        with pytest.raises(NotFound):
            recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload="code/prompt-long/x")
        with pytest.raises(NotFound):
            recommendations.find(s, model="org/m", engine=Engine.SIMULATED, hardware="mi355x")
    with transaction(factory) as s:  # a worker for that hardware now reports a newer vLLM
        tuning.report_worker(s, "gpu-node-1", {"hardware": "cpu", "vllm_version": "0.34.0", "driver": "rocm 7.0"})
    with factory() as s:
        rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED)
        assert rec["stale"] is True and "0.34.0" in rec["stale_reason"]


def test_retention_deletes_prompts_keeps_stats(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    with transaction(factory) as s:
        from tests.runner.test_job_runner import REQUESTS

        row = tuning.create_traffic(s, REQUESTS, retention_days=1)
        sid, fp = row.id, row.fingerprint
    with transaction(factory) as s:
        assert tuning.purge_expired_traffic(s) == 0
        assert tuning.purge_expired_traffic(s, now=datetime.now(UTC) + timedelta(days=2)) == 1
    with factory() as s:
        row = s.get(TrafficSampleRow, sid)
        assert row.content is None and row.fingerprint == fp and row.stats["request_count"] == len(REQUESTS)
