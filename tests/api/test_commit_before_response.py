"""A 2xx means stored: the request's session commits before the response is sent, and a failed commit is an
error the client sees (503 when the database is unavailable, 500 otherwise), with nothing changed."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import psycopg
import pytest
from sqlalchemy import event
from sqlalchemy.exc import IntegrityError, OperationalError

from tests.api.support import Api, serve, upload
from tuner.api.app import create_app
from tuner.settings import AuthMode, Settings

SAMPLE = b'{"prompt": "def add(a, b):", "max_tokens": 16}\n{"prompt": "SELECT * FROM t", "max_tokens": 16}\n'


def _fail_commits(api: Api, exc: Exception) -> Callable[[], None]:
    """Every later commit of the API's sessions raises ``exc``, after the route has returned. Returns the undo."""
    factory = api.client.app.state.session_factory  # type: ignore[attr-defined]

    def boom(session: object) -> None:
        raise exc

    event.listen(factory, "before_commit", boom)
    return lambda: event.remove(factory, "before_commit", boom)


def test_a_failed_commit_is_a_503_and_nothing_is_stored(api: Api) -> None:
    traffic_id = upload(api, content=SAMPLE)
    lost = psycopg.OperationalError("server closed the connection unexpectedly")  # what a restart looks like
    _fail_commits(api, OperationalError("COMMIT", {}, lost))

    deleted = api.client.delete(f"/traffic/{traffic_id}", headers=api.tune)
    uploaded = api.client.post("/traffic", content=SAMPLE, headers=api.tune)
    for r in (deleted, uploaded):
        assert r.status_code == 503, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        body = r.json()
        assert body["correlation_id"] == r.headers["x-request-id"]
        assert "COMMIT" not in body["detail"] and "server closed" not in body["detail"]  # details: log only
        assert r.headers["retry-after"]


def test_a_failed_commit_is_never_acknowledged(api: Api) -> None:
    traffic_id = upload(api, content=SAMPLE)
    job = api.client.post(
        "/tune", json={"model": "meta-llama/Llama-3.1-8B-Instruct", "traffic": traffic_id}, headers=api.tune
    )
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    # a sample a queued job replays cannot be deleted (409): delete one no job uses
    unused = upload(api, content=SAMPLE)
    undo = _fail_commits(api, IntegrityError("COMMIT", {}, Exception("constraint violated")))

    cancel = api.client.post(f"/tune/{job_id}/cancel", headers=api.tune)
    delete = api.client.delete(f"/traffic/{unused}", headers=api.tune)
    for r in (cancel, delete):
        assert r.status_code == 500, r.text
        assert r.json()["correlation_id"] and "constraint" not in r.json()["detail"]

    undo()  # the database works again: nothing of the refused writes was stored
    assert api.client.get(f"/tune/{job_id}", headers=api.tune).json()["cancel_requested"] is False
    assert api.client.get(f"/traffic/{unused}", headers=api.tune).json()["prompts_deleted"] is False


def test_a_client_request_id_is_echoed(api: Api) -> None:
    _fail_commits(api, IntegrityError("COMMIT", {}, Exception("x")))
    r = api.client.post("/traffic", content=SAMPLE, headers=api.tune | {"X-Request-ID": "req-42"})
    assert r.status_code == 500 and r.json()["correlation_id"] == "req-42"
    r = api.client.post("/traffic", content=SAMPLE, headers=api.tune | {"X-Request-ID": "bad id\nwith newline"})
    assert r.json()["correlation_id"] != "bad id\nwith newline"


@pytest.fixture
def served(settings: Settings) -> Iterator[str]:
    """The app behind a real uvicorn server: the race was between the response on the socket and the commit."""
    with serve(create_app(settings.model_copy(update={"auth": AuthMode.OPEN}))) as url:
        yield url


def test_what_was_acknowledged_is_there_at_once(served: str) -> None:
    """The quickstart's upload-then-use sequence, repeated: before the fix 1-3 of 60 reads gave 404."""
    misses = []
    with httpx.Client(base_url=served, timeout=30) as client:
        for i in range(60):
            up = client.post("/traffic", content=SAMPLE)
            assert up.status_code == 201, up.text
            traffic_id = up.json()["id"]
            if client.get(f"/traffic/{traffic_id}").status_code != 200:
                misses.append(("get", i))
            job = client.post("/tune", json={"model": "meta-llama/Llama-3.1-8B-Instruct", "traffic": traffic_id})
            if job.status_code != 202:
                misses.append(("tune", i, job.status_code))
                continue
            cancel = client.post(f"/tune/{job.json()['id']}/cancel")
            if cancel.status_code != 202 or client.get(f"/tune/{job.json()['id']}").json()["status"] != "cancelled":
                misses.append(("cancel", i))
    assert misses == []
