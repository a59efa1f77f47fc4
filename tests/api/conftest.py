"""The API tests' fixtures: settings on the test's database, the app under a test client with tokens (``api``),
three teams' tokens (``teams``) and the app with its in-process runner (``served``). Plain helpers: support.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.api.support import Api, Teams
from tuner.api.app import create_app
from tuner.auth import create_token
from tuner.settings import Settings
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.wiring import make_runner


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


@pytest.fixture
def teams(api: Api) -> Teams:
    engine = make_engine(api.settings.db_url)
    try:
        with transaction(make_session_factory(engine)) as s:
            made = {
                "alpha": create_token(s, "a", ["tune", "read"], team="alpha"),
                "alpha_reader": create_token(s, "ar", ["read"], team="alpha"),
                "beta": create_token(s, "b", ["tune", "read"], team="beta"),
                "admin": create_token(s, "root", ["admin"], team="ops"),
            }
    finally:
        engine.dispose()
    h = {k: {"Authorization": f"Bearer {v}"} for k, v in made.items()}
    return Teams(api, h["alpha"], h["alpha_reader"], h["beta"], h["admin"])


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
