"""A job's study as the composition root (tuner/wiring.py) names, resumes and fills it: the study named for its
job, an older name resumed, and a finished job's study as a person sees it in optuna-dashboard: found by its name,
with each trial's per-level figures as user attrs (written by tuner/search/storage.py), through a read-only
connection (the README's recipe) that cannot delete it.

The dashboard runs as the real ``optuna-dashboard`` command on the test database; its JSON API
(``/api/studies``, ``/api/studies/<id>``: optuna_dashboard/_app.py) is what its pages render.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from sqlalchemy import create_engine, make_url, text

from tuner import tuning
from tuner.demo import LLAMA_8B_CONFIG
from tuner.domain import (
    Budget,
    Engine,
    JobSpec,
    LoadLevel,
    ModelRef,
    TrafficFormat,
    TrafficRequest,
    TrialResult,
    from_jsonable,
)
from tuner.settings import Settings
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow
from tuner.wiring import make_planner, make_runner, study_name

DASHBOARD = Path(sys.executable).parent / "optuna-dashboard"
# A loaded 2-core machine imports optuna, SQLAlchemy and bottle slowly; the dashboard usually answers in ~2 s.
START_TIMEOUT_S = 60.0
REQUESTS = [
    TrafficRequest(TrafficFormat.COMPLETIONS, prompt=f"def f{i}(x):\n    return x", output_tokens=64) for i in range(8)
]
FIGURES = ("output_tok_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p50_ms", "ttft_p99_ms", "speedup")


def _spec(traffic_id: str) -> JobSpec:
    return JobSpec(
        model=ModelRef("meta-llama/Llama-3.1-8B-Instruct"),
        traffic_id=traffic_id,
        hardware="mi300x",
        engine=Engine.SIMULATED,
        levels=(LoadLevel(value=1, num_requests=8), LoadLevel(value=32, num_requests=64)),
        budget=Budget(max_trials=4),
        model_config=LLAMA_8B_CONFIG,
        confirm_runs=1,
    )


def _submit(db_url: str) -> tuple[str, JobSpec]:
    factory = make_session_factory(make_engine(db_url))
    with transaction(factory) as s:
        traffic = tuning.create_traffic(s, REQUESTS)
        spec = _spec(traffic.id)
        job, _ = tuning.submit_job(s, spec)
    return job.id, spec


def _settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(database_url=db_url, data_dir=tmp_path, poll_s=0.05, heartbeat_s=0.5)


def test_study_name_maps_to_the_job() -> None:
    spec = _spec("t")
    assert study_name("abc", spec) == "tuner/Llama-3.1-8B-Instruct/mi300x/simulated/abc"
    local = JobSpec(model=ModelRef("/models/My Model (v2)/"), traffic_id="t")
    assert study_name("abc", local) == "tuner/My_Model_v2_/auto/vllm/abc"


def test_a_job_started_under_the_old_study_name_resumes_it(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id, spec = _submit(db_url)
    settings = _settings(db_url, tmp_path)
    with monkeypatch.context() as m:  # the runner before studies were named for their job
        m.setattr("tuner.wiring.study_name", lambda job_id, spec: f"tuner-job-{job_id}")
        old = make_planner(settings, job_id, spec, REQUESTS)
    baseline = old.ask()
    assert baseline is not None and baseline.spec.is_off
    resumed = make_planner(settings, job_id, spec, REQUESTS)
    assert resumed.study.study_name == f"tuner-job-{job_id}"
    assert [p.number for p in resumed.pending()] == [baseline.number]  # the same study, not a new one
    assert resumed.study.user_attrs["job_id"] == job_id  # labelled on resumption too


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _read_only(db_url: str) -> Iterator[str]:
    """The URL a dashboard should be given: SQLite opened read-only, or a PostgreSQL role that may only
    read (the README's GRANTs), dropped afterwards."""
    url = make_url(db_url)
    if url.drivername.startswith("sqlite"):
        yield f"sqlite:///file:{url.database}?mode=ro&uri=true"
        return
    role = f"tuner_dash_{uuid.uuid4().hex[:10]}"
    owner = create_engine(db_url, isolation_level="AUTOCOMMIT")
    try:
        with owner.connect() as c:
            c.execute(text(f"CREATE ROLE {role} LOGIN"))
            c.execute(text(f'GRANT CONNECT ON DATABASE "{url.database}" TO {role}'))
            c.execute(text(f"GRANT USAGE ON SCHEMA public TO {role}"))
            c.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
        yield url.set(username=role, password=None).render_as_string(hide_password=False)
    finally:
        with owner.connect() as c:  # DROP OWNED revokes its grants, here and on the database, so it can go
            c.execute(text(f"DROP OWNED BY {role}"))
            c.execute(text(f"DROP ROLE {role}"))
        owner.dispose()


@contextmanager
def _dashboard(storage_url: str, log: Path) -> Iterator[httpx.Client]:
    """``optuna-dashboard <url>`` on a free port, polled until it answers; stopped on the way out."""
    if not DASHBOARD.exists():
        message = f"no {DASHBOARD}: install the dev extra (pip install -e '.[dev]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    for _attempt in range(3):  # another process may take the free port before the dashboard binds it
        port = _free_port()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(DASHBOARD), storage_url, "--port", str(port), "--host", "127.0.0.1"],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                deadline = time.monotonic() + START_TIMEOUT_S
                while proc.poll() is None and time.monotonic() < deadline:
                    try:
                        if client.get("/api/studies").status_code == 200:
                            yield client
                            return
                    except httpx.TransportError:
                        pass
                    time.sleep(0.1)
                if proc.poll() is None:
                    raise AssertionError(f"optuna-dashboard did not answer in {START_TIMEOUT_S:g} s: {log.read_text()}")
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    raise AssertionError(f"optuna-dashboard exited before answering: {log.read_text()}")


def _attrs(items: list[dict[str, str]]) -> dict[str, str]:
    return {a["key"]: a["value"] for a in items}


def test_dashboard_lists_a_finished_jobs_study_with_its_figures(db_url: str, tmp_path: Path) -> None:
    job_id, spec = _submit(db_url)
    factory = make_session_factory(make_engine(db_url))
    assert make_runner(_settings(db_url, tmp_path), factory, report=False).run_once() == job_id
    with factory() as s:
        assert s.get(JobRow, job_id).status == "succeeded"
    name = study_name(job_id, spec)

    with _read_only(db_url) as url, _dashboard(url, tmp_path / "dashboard.log") as dash:
        studies = dash.get("/api/studies").json()["study_summaries"]
        [study] = [s for s in studies if s["study_name"] == name]
        about = _attrs(study["user_attrs"])
        assert about["job_id"] == job_id and about["engine"] == "simulated" and about["simulated"] == "True"

        detail = dash.get(f"/api/studies/{study['study_id']}").json()
        trials: list[dict[str, Any]] = detail["trials"]
        stored = {t.number: t.user_attrs["result"] for t in optuna.load_study(study_name=name, storage=db_url).trials}
        assert len(trials) == len(stored) >= 2
        for trial in trials:
            attrs = _attrs(trial["user_attrs"])
            # simulated figures say so on every trial, beside the config they belong to
            assert attrs["simulated"] == "True" and attrs["engine"] == "simulated" and attrs["config"]
            assert attrs["purpose"] in ("baseline", "search", "confirm")
            result = from_jsonable(TrialResult, stored[trial["number"]])
            assert result.levels  # every trial of this job measured (none failed)
            for level in result.levels:
                label = level.level.label
                assert float(attrs[f"{label}.output_tok_s"]) == pytest.approx(level.output_throughput, abs=0.01)
                assert all(f"{label}.{f}" in attrs for f in FIGURES), sorted(attrs)
        baseline = _attrs(trials[0]["user_attrs"])
        assert baseline["config"] == "off" and baseline["c1.speedup"] == "1.0"
        drafted = [_attrs(t["user_attrs"]) for t in trials if "c32.acceptance_length" in _attrs(t["user_attrs"])]
        assert drafted and all(float(a["c32.acceptance_length"]) >= 1.0 for a in drafted)
        # numeric figures are sortable columns of the dashboard's trial table
        sortable = {a["key"] for a in detail["union_user_attrs"] if a["sortable"]}
        assert {"c1.output_tok_s", "c32.speedup", "c32.tpot_p99_ms"} <= sortable

        # the reason for the read-only connection: the dashboard deletes studies on request, with no auth
        refused = dash.request("DELETE", f"/api/studies/{study['study_id']}", json={})
        assert refused.status_code >= 400
        assert name in optuna.get_all_study_names(storage=db_url)
