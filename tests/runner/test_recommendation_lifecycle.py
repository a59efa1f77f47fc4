"""History, staleness, workload matching and retention of what jobs publish."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from tests.fakes import LEVELS, FakeEvaluator, ListPlanner
from tests.runner.test_job_runner import REQUESTS, SPECS, runner, submit
from tuner import recommendations, tuning
from tuner.domain import Engine, JobSpec, ModelRef, ServingConfig
from tuner.errors import NotFound
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow, TrafficSampleRow


def test_history_staleness_and_workload_class(db_url: str) -> None:
    """Through one warm render cache, as the API keeps it: new answers and staleness still show at once."""
    factory = make_session_factory(make_engine(db_url))
    cache = recommendations.RenderCache(size=2)
    first = submit(factory)
    runner(factory, ListPlanner(SPECS), FakeEvaluator()).run_once()
    with factory() as s:
        uncached = recommendations.find(s, model="org/m", engine=Engine.SIMULATED)
        assert recommendations.find(s, model="org/m", engine=Engine.SIMULATED, cache=cache) == uncached
    second = submit(factory)
    runner(factory, ListPlanner(SPECS[:1]), FakeEvaluator()).run_once()
    with factory() as s:
        rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, cache=cache)
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
        rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, cache=cache)
        assert rec["stale"] is True and "0.34.0" in rec["stale_reason"]
        assert rec == recommendations.find(s, model="org/m", engine=Engine.SIMULATED)  # cached == fresh


def test_tomorrows_sample_of_the_same_kind_finds_todays_answer(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    job = submit(factory)
    runner(factory, ListPlanner(SPECS), FakeEvaluator()).run_once()
    with transaction(factory) as s:  # tomorrow's traffic: other prompts, same lengths, so the same class
        tomorrow = tuning.create_traffic(s, [replace(r, prompt=r.prompt + "!") for r in REQUESTS])
        other = tuning.create_traffic(s, [replace(r, output_tokens=2000) for r in REQUESTS])
        today = s.get(JobRow, job).traffic_id
        assert tomorrow.workload_class == s.get(TrafficSampleRow, today).workload_class
        assert other.workload_class != tomorrow.workload_class
        ids = (tomorrow.id, tomorrow.fingerprint, other.id, s.get(TrafficSampleRow, today).fingerprint)
    with factory() as s:
        for workload in ids[:2]:
            rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload=workload)
            assert rec["provenance"]["job_id"] == job and rec["matched_by"] == "workload_class"
            assert rec["measured_on"]["traffic_id"] == today  # says which sample it was measured on
        with pytest.raises(NotFound):
            recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload=ids[2])
        rec = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, workload=ids[3])
        assert rec["matched_by"] == "fingerprint"


def test_the_serving_configuration_is_part_of_the_key(db_url: str) -> None:
    factory = make_session_factory(make_engine(db_url))
    plain = submit(factory)
    runner(factory, ListPlanner(SPECS), FakeEvaluator()).run_once()
    with transaction(factory) as s:  # the same model tuned again for a TP=2, fp8-KV production setup
        traffic = tuning.create_traffic(s, REQUESTS)
        serving = ServingConfig(args={"tensor_parallel_size": 2, "kv_cache_dtype": "fp8"})
        tp2, _ = tuning.submit_job(
            s,
            JobSpec(ModelRef("org/m"), traffic.id, engine=Engine.SIMULATED, levels=LEVELS, serving=serving),
        )
        tp2 = tp2.id
    runner(factory, ListPlanner(SPECS[:1]), FakeEvaluator()).run_once()
    with factory() as s:
        newest = recommendations.find(s, model="org/m", engine=Engine.SIMULATED)
        assert newest["provenance"]["job_id"] == tp2
        assert "--tensor-parallel-size" in newest["serve_args"] and newest["history"] == []
        (other,) = newest["other_serving_configs"]
        assert other["job_id"] == plain
        by_key = recommendations.find(s, model="org/m", engine=Engine.SIMULATED, serving=other["serving_key"])
        assert by_key["provenance"]["job_id"] == plain and "--tensor-parallel-size" not in by_key["serve_args"]
        with pytest.raises(NotFound):
            recommendations.find(s, model="org/m", engine=Engine.SIMULATED, serving="0" * 64)


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
