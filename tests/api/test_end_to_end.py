"""POST /tune -> GET /tune/{id} -> GET /recommendation through the real app, its in-process runner, the
Optuna planner and the simulated engine, on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.api.support import run_to_end, sharegpt_subset
from tuner.demo import LLAMA_8B_CONFIG
from tuner.settings import Settings
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.wiring import make_runner


def test_tune_to_recommendation(served: tuple[TestClient, dict[str, str]]) -> None:
    client, auth = served
    sample = client.post("/traffic", content=sharegpt_subset(12), headers=auth).json()
    fields = {"concurrency": [1, 64], "budget": {"max_trials": 6}, "slo": {"p99_tpot_ms": 500}}
    job = run_to_end(client, auth, sample["id"], **fields)
    job_url = f"/tune/{job['id']}"
    assert job["status"] == "succeeded", job
    assert job["best"]["simulated"] is True
    trials = client.get(f"{job_url}/trials", headers=auth).json()
    assert trials[0]["method"] == "off" and trials[0]["purpose"] == "baseline"
    assert all(t["simulated"] and t["engine"] == "simulated" for t in trials)
    assert all(t["purpose"] in ("baseline", "search", "confirm") for t in trials)
    # GPU-seconds: each trial's (simulated) wall time x the one GPU its server holds, summed by purpose
    assert all(t["gpu_seconds"] == pytest.approx(t["duration_s"], abs=1e-3) for t in trials)
    cost = job["cost"]
    assert cost["simulated"] is True and cost["trials"] == len(trials)
    assert cost["gpu_seconds"] == pytest.approx(sum(t["gpu_seconds"] for t in trials), abs=0.01)
    for purpose in ("baseline", "search", "confirm"):
        spent = sum(t["gpu_seconds"] for t in trials if t["purpose"] == purpose)
        assert cost["by_purpose"].get(purpose, 0.0) == pytest.approx(spent, abs=0.01)
    assert cost["grid_trials"] == job["best"]["grid_size"] > len(trials)
    assert cost["grid_gpu_seconds"] > cost["gpu_seconds"] > 0
    # simulated results never answer a measured query
    assert (
        client.get("/recommendation", params={"model": "meta-llama/Llama-3.1-8B-Instruct"}, headers=auth).status_code
        == 404
    )
    rec = client.get(
        "/recommendation",
        params={"model": "meta-llama/Llama-3.1-8B-Instruct", "engine": "simulated", "hardware": "mi300x"},
        headers=auth,
    )
    assert rec.status_code == 200, rec.text
    body = rec.json()
    assert body["engine"] == "simulated" and body["simulated"] is True
    assert body["summary"].startswith("[SIMULATED]")
    assert body["measured_on"]["traffic_id"] == sample["id"]
    assert body["provenance"]["job_id"] == job["id"]
    assert body["serve_args"][:3] == ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"]
    # pasted into a shell, the deploy command is exactly that argv (the JSON config included)
    echoed = subprocess.run(
        ["sh", "-c", 'printf "%s\\0" ' + body["deploy_command"]], capture_output=True, text=True, check=True
    )
    assert echoed.stdout.split("\0")[:-1] == body["serve_args"]
    if body["speculative_config"] is None:
        assert body["speculation"] == "off" and "No speculation" in " ".join(body["notes"])
    else:
        assert "--speculative-config" in body["serve_args"]
        assert body["speedup"]["runs"] >= 1 and body["speedup"]["low"] <= body["speedup"]["mean"]
    # the workload class finds it too (tomorrow's traffic of the same kind), and concurrency picks a range
    by_class = client.get(
        "/recommendation",
        params={
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "engine": "simulated",
            "workload": sample["workload_class"],
        },
        headers=auth,
    )
    assert by_class.status_code == 200 and by_class.json()["id"] == body["id"]
    at_64 = client.get(
        "/recommendation",
        params={"model": "meta-llama/Llama-3.1-8B-Instruct", "engine": "simulated", "concurrency": 64},
        headers=auth,
    ).json()
    assert at_64["concurrency"]["low"] <= 64 and at_64["scope"] != "all"
    metrics = client.get("/metrics").text
    assert 'tuner_jobs{status="succeeded"} 1.0' in metrics
    assert 'tuner_trials_run_total{engine="simulated",status="succeeded"}' in metrics
    search_spent = sum(t["gpu_seconds"] for t in trials if t["purpose"] == "search")
    line = next(
        ln
        for ln in metrics.splitlines()
        if ln.startswith('tuner_trial_gpu_seconds_total{engine="simulated",purpose="search"}')
    )
    assert float(line.split()[-1]) == pytest.approx(search_spent, rel=1e-6)


def test_a_worker_refuses_trust_remote_code_unless_its_settings_allow_it(db_url: str, tmp_path: Path) -> None:
    """The API allows it (its settings say so) but the worker's do not: the job fails saying why, runs nothing."""
    from tuner import tuning
    from tuner.domain import Engine, JobSpec, LoadLevel, ModelRef, TrafficFormat, TrafficRequest

    factory = make_session_factory(make_engine(db_url))
    with transaction(factory) as s:
        traffic = tuning.create_traffic(s, [TrafficRequest(TrafficFormat.COMPLETIONS, prompt="p", output_tokens=4)])
        job, _ = tuning.submit_job(
            s,
            JobSpec(
                ModelRef("org/custom-arch", trust_remote_code=True),
                traffic.id,
                engine=Engine.SIMULATED,
                levels=(LoadLevel(value=1, num_requests=2),),
            ),
        )
        job_id = job.id
    worker = make_runner(Settings(database_url=db_url, data_dir=tmp_path), factory, report=False)
    assert worker.run_once() == job_id
    with factory() as s:
        row = tuning.get_job(s, job_id)
        assert row.status == "failed" and "trust_remote_code is not allowed on this worker" in row.error
        assert tuning.list_trials(s, job_id) == []


def test_a_jobs_weights_overrides_and_max_num_seqs_reach_its_search(tmp_path: Path) -> None:
    from tuner.domain import Engine, JobSpec, LoadLevel, Method, ModelRef, ServingConfig
    from tuner.wiring import make_planner

    spec = JobSpec(
        ModelRef("meta-llama/Llama-3.1-8B-Instruct"),
        "t",
        engine=Engine.SIMULATED,
        hardware="mi300x",
        levels=(LoadLevel(value=1), LoadLevel(value=64)),
        model_config=LLAMA_8B_CONFIG,
        level_weights={"c1": 3.0, "c64": 1.0},
        compat_overrides={"ngram": False},
        serving=ServingConfig(args={"max_num_seqs": 96}),
    )
    planner = make_planner(Settings(data_dir=tmp_path), "job-1", spec, [])
    assert planner.weights == {"c1": 3.0, "c64": 1.0}
    assert planner.max_num_seqs == 96
    methods = {o.method for o in planner.space.options}
    assert Method.NGRAM not in methods and Method.EAGLE3 in methods
    assert any(e.method is Method.NGRAM for e in planner.space.excluded)


def test_a_servers_compat_rules_file_reaches_every_jobs_search_and_a_bad_one_stops_the_runner(tmp_path: Path) -> None:
    import json

    from tuner.domain import Engine, JobSpec, LoadLevel, Method, ModelRef
    from tuner.store.db import make_engine, make_session_factory
    from tuner.wiring import make_planner, make_runner

    rules = tmp_path / "compat.json"
    rules.write_text(json.dumps([{"method": "eagle3", "hardware": "mi300x", "reason": "broken on our nodes"}]))
    settings = Settings(data_dir=tmp_path, compat_rules_file=rules)
    spec = JobSpec(
        ModelRef("meta-llama/Llama-3.1-8B-Instruct"),
        "t",
        engine=Engine.SIMULATED,
        hardware="mi300x",
        levels=(LoadLevel(value=1),),
        model_config=LLAMA_8B_CONFIG,
    )
    planner = make_planner(settings, "job-1", spec, [])
    assert Method.EAGLE3 not in {o.method for o in planner.space.options}
    assert any(e.method is Method.EAGLE3 and e.reason == "broken on our nodes" for e in planner.space.excluded)

    rules.write_text('[{"method": "eagle3"}]')
    factory = make_session_factory(make_engine(f"sqlite:///{tmp_path / 'x.db'}"))
    with pytest.raises(ValueError, match="entry 0: 'reason' must be a non-empty string"):
        make_runner(settings, factory, report=False)
