"""Shared use: authentication before the body, teams that own their work, admins, and deleting a sample."""

from __future__ import annotations

import json
import threading
import tracemalloc

import pytest
from sqlalchemy import select

from tests.api.support import BENCH, Api, Teams, jsonl, submit_job
from tuner.auth import create_token
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.store.models import JobRow, TrialRow


def test_a_team_sees_its_own_jobs_and_samples_and_no_one_elses(teams: Teams) -> None:
    c = teams.api.client
    job = submit_job(teams, teams.alpha)
    for path in (f"/tune/{job['id']}", f"/tune/{job['id']}/trials", f"/traffic/{job['traffic_id']}"):
        assert c.get(path, headers=teams.alpha_reader).status_code == 200, path
        assert c.get(path, headers=teams.admin).status_code == 200, path
        other = c.get(path, headers=teams.beta)
        assert other.status_code == 404, path  # to another team it does not exist
        assert other.headers["content-type"] == "application/problem+json"
    # nor can another team tune on the sample, cancel the job or delete the prompts
    stolen = {"model": "org/m", "traffic": job["traffic_id"], "engine": "simulated"}
    assert c.post("/tune", json=stolen, headers=teams.beta).status_code == 404
    assert c.post(f"/tune/{job['id']}/cancel", headers=teams.beta).status_code == 404
    assert c.delete(f"/traffic/{job['traffic_id']}", headers=teams.beta).status_code == 404
    assert c.get(f"/tune/{job['id']}", headers=teams.alpha).json()["cancel_requested"] is False
    # the owner's read-only token cannot change it either; the owner and an admin can
    assert c.post(f"/tune/{job['id']}/cancel", headers=teams.alpha_reader).status_code == 403
    assert c.post(f"/tune/{job['id']}/cancel", headers=teams.admin).status_code == 202
    assert c.delete(f"/traffic/{job['traffic_id']}", headers=teams.alpha).status_code == 200


def test_idempotency_keys_are_per_team(teams: Teams) -> None:
    c = teams.api.client
    key = {"Idempotency-Key": "nightly-1"}
    body = {"model": "org/m", "traffic": BENCH, "engine": "simulated", "concurrency": [1]}
    a = c.post("/tune", json=body, headers=teams.alpha | key)
    b = c.post("/tune", json=body, headers=teams.beta | key)
    assert a.status_code == 202 and b.status_code == 202, (a.text, b.text)
    assert a.json()["id"] != b.json()["id"]
    assert c.post("/tune", json=body, headers=teams.alpha | key).json()["id"] == a.json()["id"]


def test_another_teams_sample_id_does_not_stand_for_its_workload(teams: Teams) -> None:
    c = teams.api.client
    sample = c.post("/traffic", content=jsonl(BENCH), headers=teams.alpha).json()
    own = c.get("/recommendation", params={"model": "org/m", "workload": sample["id"]}, headers=teams.alpha)
    other = c.get("/recommendation", params={"model": "org/m", "workload": sample["id"]}, headers=teams.beta)
    # neither finds a recommendation (none exists yet); both are a plain 404, the other team's names nothing
    assert own.status_code == other.status_code == 404
    assert sample["workload_class"] not in other.json()["detail"]


def test_an_unauthenticated_body_is_refused_before_it_is_read(api: Api) -> None:
    """The 401 comes from the headers: the body is never read, let alone parsed (no allocation grows with it)."""
    big = json.dumps({"model": "org/m", "traffic": [{"prompt": "x" * 1000}] * 400}).encode()  # ~400 KB
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[1]
        for headers in ({}, {"Authorization": "Bearer stk_not-a-token"}):
            r = api.client.post("/tune", content=big, headers=headers | {"Content-Type": "application/json"})
            assert r.status_code == 401, r.text
            assert r.headers["www-authenticate"] == "Bearer"
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(big)  # the test client holds the body once; parsing it would cost many times more


def test_unknown_paths_need_a_token_too(api: Api) -> None:
    assert api.client.get("/no/such/path").status_code == 401
    assert api.client.get("/no/such/path", headers=api.read).status_code == 404
    assert api.client.get("/healthz").status_code == 200
    assert api.client.get("/openapi.json").status_code == 200


def test_deleting_a_sample_deletes_the_outputs_derived_from_it(teams: Teams) -> None:
    c = teams.api.client
    job = submit_job(teams, teams.alpha)
    engine = make_engine(teams.api.settings.db_url)
    try:
        factory = make_session_factory(engine)
        with transaction(factory) as s:  # a finished job whose baseline kept its greedy outputs
            row = s.get(JobRow, job["id"])
            assert row is not None
            row.status = "succeeded"
            s.add(
                TrialRow(
                    job_id=job["id"],
                    number=0,
                    purpose="search",
                    method="off",
                    config={},
                    levels=[],
                    status="succeeded",
                    engine="simulated",
                    result={"status": "succeeded", "reference_outputs": [[1, 2, 3]], "levels": []},
                )
            )
        busy = submit_job(teams, teams.alpha)  # a queued job still replays its sample: 409, nothing deleted
        assert c.delete(f"/traffic/{busy['traffic_id']}", headers=teams.alpha).status_code == 409
        assert c.get(f"/traffic/{busy['traffic_id']}", headers=teams.alpha).json()["prompts_deleted"] is False

        r = c.delete(f"/traffic/{job['traffic_id']}", headers=teams.alpha)
        assert r.status_code == 200, r.text
        assert r.json()["prompts_deleted"] is True
        with factory() as s:
            trial = s.scalars(select(TrialRow).where(TrialRow.job_id == job["id"])).one()
            assert trial.result is not None
            assert trial.result["reference_outputs"] is None
            assert trial.result["status"] == "succeeded"  # the figures stay
    finally:
        engine.dispose()


def test_concurrent_teams_never_see_each_other(teams: Teams) -> None:
    """Many requests from two teams at once: each answer belongs to the asker."""
    alpha_job, beta_job = submit_job(teams, teams.alpha), submit_job(teams, teams.beta)
    seen: list[tuple[str, str, int]] = []

    def read(who: str, headers: dict[str, str]) -> None:
        for job in (alpha_job, beta_job):
            r = teams.api.client.get(f"/tune/{job['id']}", headers=headers)
            seen.append((who, job["id"], r.status_code))

    threads = [threading.Thread(target=read, args=(w, h)) for w, h in [("a", teams.alpha), ("b", teams.beta)] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    owner = {alpha_job["id"]: "a", beta_job["id"]: "b"}
    assert len(seen) == 16
    assert all((code == 200) == (owner[job_id] == who) for who, job_id, code in seen), seen
    assert all(code in (200, 404) for _, _, code in seen)


def test_a_revoked_token_is_refused_once_its_cache_entry_expires(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner.api import authenticate
    from tuner.auth import revoke_token

    clock = [1000.0]
    monkeypatch.setattr(authenticate.time, "monotonic", lambda: clock[0])
    engine = make_engine(api.settings.db_url)
    try:
        with transaction(make_session_factory(engine)) as s:
            secret = create_token(s, "short-lived", ["read"])
        h = {"Authorization": f"Bearer {secret}"}
        assert api.client.get("/tune/" + "0" * 32, headers=h).status_code == 404  # resolved and cached
        with transaction(make_session_factory(engine)) as s:
            assert revoke_token(s, "short-lived") == 1
        assert api.client.get("/tune/" + "0" * 32, headers=h).status_code == 404  # within TUNER_TOKEN_CACHE_S
        clock[0] += api.settings.token_cache_s + 0.01
        assert api.client.get("/tune/" + "0" * 32, headers=h).status_code == 401
    finally:
        engine.dispose()


def test_a_token_lookup_the_store_cannot_answer_is_a_503_problem(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """The middleware's failure reaches the app's one 5xx handler: Retry-After and a correlation id, no SQL."""
    import psycopg
    from sqlalchemy.exc import OperationalError

    from tuner.api import authenticate

    def down(*a: object, **k: object) -> None:
        raise OperationalError("SELECT", {}, psycopg.OperationalError("server closed the connection unexpectedly"))

    monkeypatch.setattr(authenticate, "principal_for", down)
    r = api.client.get("/tune/" + "0" * 32, headers={"Authorization": "Bearer stk_never-seen"})
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["retry-after"] and r.json()["correlation_id"] == r.headers["x-request-id"]
    assert "server closed" not in r.text
