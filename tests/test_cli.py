"""The `tuner` command as a user runs it: db upgrade, token create, the quickstart demo, open-access mode; and
real `tuner worker` processes on one database, one SIGKILLed mid-job and a second finishing it.

The workers' simulated engine is paced (each trial takes real seconds) and holds a placeholder process group per
trial, the way a vLLM server would, so the recovering worker must kill what the dead one left.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import optuna
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tuner import tuning
from tuner.api.app import create_app
from tuner.demo import LLAMA_8B_CONFIG
from tuner.domain import Budget, Engine, JobSpec, LoadLevel, ModelRef, TrafficFormat, TrafficRequest
from tuner.settings import AuthMode, Settings
from tuner.store import migrate
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow, RecommendationRow, TrialRow
from tuner.wiring import study_name

ROOT = Path(__file__).resolve().parents[1]
TUNER = Path(sys.executable).parent / "tuner"


def tuner(*args: str, env: dict[str, str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TUNER), *args],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_db_upgrade_and_token_create_work_from_the_command_line(db_url: str, tmp_path: Path) -> None:
    env = {"TUNER_DATABASE_URL": db_url, "TUNER_DATA_DIR": str(tmp_path)}
    up = tuner("db", "upgrade", env=env, cwd=tmp_path)
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == migrate.current(db_url) != "empty"
    made = tuner("token", "create", "--name", "ci", "--scope", "read", env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    with TestClient(create_app(Settings(database_url=db_url, data_dir=tmp_path))) as client:
        auth = {"Authorization": f"Bearer {token}"}
        assert client.get("/tune/" + "0" * 32, headers=auth).status_code == 404  # read scope: allowed, nothing there
        assert client.post("/tune/none/cancel", headers=auth).status_code == 403  # no tune scope
    revoked = tuner("token", "revoke", "--name", "ci", env=env, cwd=tmp_path)
    assert "revoked 1 token" in revoked.stdout
    with TestClient(create_app(Settings(database_url=db_url, data_dir=tmp_path))) as client:
        assert client.get("/tune/" + "0" * 32, headers=auth).status_code == 401


def test_open_access_is_explicit_and_announced(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}"
    migrate.upgrade(url)
    with caplog.at_level(logging.WARNING, logger="tuner.api"):
        with TestClient(create_app(Settings(database_url=url, data_dir=tmp_path, auth=AuthMode.OPEN))) as client:
            assert client.get("/tune/" + "0" * 32).status_code == 404  # no token needed
    assert any("AUTH IS OFF" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tuner.api"):
        with TestClient(create_app(Settings(database_url=url, data_dir=tmp_path))) as client:
            assert client.get("/tune/" + "0" * 32).status_code == 401
    assert not any("AUTH IS OFF" in r.getMessage() for r in caplog.records)


def test_the_quickstart_demo_ends_with_a_labelled_recommendation(tmp_path: Path) -> None:
    """README's first command, minus the install: the embedded default, simulated, said loudly."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    done = subprocess.run(
        [str(TUNER), "demo"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout
    assert "SIMULATED ENGINE" in out and "NOT a measurement" in out
    assert "job succeeded" in out
    assert "SIMULATED RECOMMENDATION" in out and "deploy: vllm serve " in out
    assert (tmp_path / ".tuner" / "tuner.db").exists()


def test_a_wheel_carries_its_migrations(tmp_path: Path) -> None:
    """Installed from a wheel (as the images do), `tuner db upgrade` still finds the Alembic scripts."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = tmp_path.glob("spec_tuner-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
        names = set(z.namelist())
    source = {f"tuner/{p.relative_to(ROOT / 'tuner')}" for p in (ROOT / "tuner").rglob("*.py")}
    assert source <= names, f"packages missing from pyproject's list: {sorted(source - names)[:5]}"
    url = f"sqlite:///{tmp_path / 'w.db'}"
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from tuner.store import migrate; assert migrate.MIGRATIONS_DIR.is_relative_to(sys.argv[1]);"
        "migrate.upgrade(sys.argv[2]); print(migrate.current(sys.argv[2]))"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe, str(site), url], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == migrate.current(url)


REQUESTS = [
    TrafficRequest(TrafficFormat.COMPLETIONS, prompt=f"def f{i}(x):\n    return x", output_tokens=64) for i in range(8)
]


def _worker(db_url: str, data_dir: Path, name: str) -> subprocess.Popen[bytes]:
    env = os.environ | {
        "TUNER_DATABASE_URL": db_url,
        "TUNER_DATA_DIR": str(data_dir),
        "TUNER_SIMULATED_TRIAL_S": "0.8",
        "TUNER_SIMULATED_PLACEHOLDER_PROCESS": "true",
        "TUNER_HEARTBEAT_S": "0.3",
        "TUNER_STALE_AFTER_S": "2",
        "TUNER_POLL_S": "0.2",
        "TUNER_AUTO_MIGRATE": "false",
        "TUNER_WORKER_NAME": name,
    }
    log = open(data_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [sys.executable, "-m", "tuner.cli", "worker"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _wait(pred, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkilled_worker_is_recovered_by_another(db_url: str, tmp_path: Path) -> None:
    factory = make_session_factory(make_engine(db_url))
    with transaction(factory) as s:
        traffic = tuning.create_traffic(s, REQUESTS)
        spec = JobSpec(
            model=ModelRef("meta-llama/Llama-3.1-8B-Instruct"),
            traffic_id=traffic.id,
            engine=Engine.SIMULATED,
            levels=(LoadLevel(value=1, num_requests=8), LoadLevel(value=32, num_requests=64)),
            budget=Budget(max_trials=5),
            model_config=LLAMA_8B_CONFIG,
            confirm_runs=1,
        )
        job, _ = tuning.submit_job(s, spec)
        job_id = job.id

    def trials() -> list[TrialRow]:
        with factory() as s:
            return list(s.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.number)))

    first = _worker(db_url, tmp_path, "w1")
    try:
        # Kill it while a trial runs, after at least two have finished.
        _wait(
            lambda: (
                sum(t.status == "succeeded" for t in trials()) >= 2
                and any(t.status == "running" and t.pgid for t in trials())
            ),
            90,
            "two finished trials and a running one",
        )
        before = {t.number: (t.finished_at, t.result) for t in trials() if t.status == "succeeded"}
        orphans = [t.pgid for t in trials() if t.status == "running" and t.pgid]
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
        assert orphans and all(_alive(p) for p in orphans)  # the dead worker's "server" outlived it
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    second = _worker(db_url, tmp_path, "w2")
    try:

        def finished() -> bool:
            with factory() as s:
                return s.get(JobRow, job_id, populate_existing=True).status in ("succeeded", "failed")

        _wait(finished, 180, "the second worker to finish the job")
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(30)
    with factory() as s:
        job = s.get(JobRow, job_id)
        assert job.status == "succeeded", (job.error, (tmp_path / "w2.log").read_text()[-3000:])
        assert job.claimed_by.startswith("w2@") and job.attempts == 2
    after = trials()
    by_number = {t.number: t for t in after}
    # no finished trial was run again, and none changed
    for number, (finished_at, result) in before.items():
        assert (by_number[number].finished_at, by_number[number].result) == (finished_at, result)
    # the trial that was running is failed as infrastructure, its placeholder process killed
    dead = [t for t in after if t.failure_class == "infrastructure"]
    assert dead and all("died" in t.failure_reason for t in dead)
    _wait(lambda: not any(_alive(p) for p in orphans), 10, "the orphaned process group to be killed")
    # one result per trial number, one recommendation per scope
    assert len(after) == len({t.number for t in after})
    with factory() as s:
        scopes = s.scalars(select(RecommendationRow.scope).where(RecommendationRow.job_id == job_id)).all()
    assert "all" in scopes and len(scopes) == len(set(scopes))
    # Optuna never keeps a trial RUNNING
    study = optuna.load_study(study_name=study_name(job_id, spec), storage=db_url)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
