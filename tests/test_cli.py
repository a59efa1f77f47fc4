"""The `tuner` command as a user runs it: db upgrade, token create, the quickstart demo, open-access mode."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tuner.api.app import create_app
from tuner.settings import AuthMode, Settings
from tuner.store import migrate

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
