from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tuner.api.app import create_app
from tuner.auth import create_token
from tuner.settings import Settings
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.wiring import make_runner


@dataclass
class Api:
    client: TestClient
    settings: Settings
    tune: dict[str, str]  # headers of a token with both scopes
    read: dict[str, str]  # headers of a read-only token
    tune_only: dict[str, str]


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(database_url=db_url, data_dir=tmp_path, max_traffic_bytes=512 * 1024, in_process_runner=False)


@pytest.fixture
def api(settings: Settings) -> Iterator[Api]:
    engine = make_engine(settings.db_url)
    with transaction(make_session_factory(engine)) as s:
        both = create_token(s, "ci", ["tune", "read"])
        read = create_token(s, "reader", ["read"])
        tune_only = create_token(s, "writer", ["tune"])
    engine.dispose()
    app = create_app(settings)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield Api(
            client,
            settings,
            {"Authorization": f"Bearer {both}"},
            {"Authorization": f"Bearer {read}"},
            {"Authorization": f"Bearer {tune_only}"},
        )


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """``app`` behind a real uvicorn server on a free port, in a thread; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture
def served(db_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """The app with its in-process runner (the simulated engine), and a tune+read token's headers."""
    settings = Settings(database_url=db_url, data_dir=tmp_path, poll_s=0.1, heartbeat_s=0.5)
    engine = make_engine(db_url)
    with transaction(make_session_factory(engine)) as s:
        token = create_token(s, "e2e", ["tune", "read"])
    engine.dispose()
    app = create_app(settings, background=lambda st, f: make_runner(st, f, report=False))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, {"Authorization": f"Bearer {token}"}


def run_to_end(
    client: TestClient, auth: dict[str, str], body: dict[str, Any], timeout_s: float = 120
) -> dict[str, Any]:
    """POST /tune ``body`` (202) and follow the job until it ends; returns the ended job."""
    r = client.post("/tune", headers=auth, json=body)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + timeout_s
    while (job := client.get(r.headers["location"], headers=auth).json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    return job
