from __future__ import annotations

import pytest

from tests.api.support import BENCH, Api, upload


def body(traffic: str | list, **kw: object) -> dict:
    return {"model": "org/model", "traffic": traffic, "engine": "simulated", "concurrency": [1, 8], **kw}


def test_post_tune_is_202_with_location(api: Api) -> None:
    r = api.client.post("/tune", json=body(upload(api)), headers=api.tune)
    assert r.status_code == 202, r.text
    job = r.json()
    assert r.headers["location"] == f"/tune/{job['id']}"
    assert job["status"] == "queued"
    assert job["simulated"] is True
    got = api.client.get(r.headers["location"], headers=api.read)
    assert got.status_code == 200
    assert got.json()["id"] == job["id"]
    assert api.client.get(f"/tune/{job['id']}/trials", headers=api.read).json() == []


def test_inline_traffic_creates_a_sample(api: Api) -> None:
    r = api.client.post("/tune", json=body(BENCH), headers=api.tune)
    assert r.status_code == 202, r.text
    sample = api.client.get(f"/traffic/{r.json()['traffic_id']}", headers=api.read)
    assert sample.json()["request_count"] == len(BENCH)


def test_idempotency_key_returns_the_same_job(api: Api) -> None:
    traffic = upload(api)
    h = api.tune | {"Idempotency-Key": "abc-123"}
    first = api.client.post("/tune", json=body(traffic), headers=h)
    second = api.client.post("/tune", json=body(traffic), headers=h)
    assert first.status_code == 202 and second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    other = api.client.post("/tune", json=body(traffic, concurrency=[4]), headers=h)
    assert other.status_code == 409
    assert other.headers["content-type"] == "application/problem+json"


def test_idempotency_key_with_inline_traffic_returns_the_same_job(api: Api) -> None:
    h = api.tune | {"Idempotency-Key": "inline-1"}
    first = api.client.post("/tune", json=body(BENCH), headers=h)
    second = api.client.post("/tune", json=body(BENCH), headers=h)
    assert first.status_code == 202 and second.status_code == 200, second.text
    assert first.json()["id"] == second.json()["id"]
    assert second.headers["location"] == f"/tune/{first.json()['id']}"
    assert api.client.post("/tune", json=body(BENCH[:2]), headers=h).status_code == 409


def test_idempotent_twin_that_commits_first_wins(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two POSTs with one key racing: the loser's insert hits the unique key and answers the winner's job."""
    from tuner import tuning
    from tuner.api.routes import tune as route

    winner = api.client.post("/tune", json=body(BENCH), headers=api.tune | {"Idempotency-Key": "race"}).json()
    real = tuning.job_for_idempotency_key
    calls = {"n": 0}

    def first_look_misses(*args: object, **kw: object) -> object:
        calls["n"] += 1
        # the route's look and submit_job's both miss; the insert then hits the unique key
        return None if calls["n"] <= 2 else real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(route.tuning, "job_for_idempotency_key", first_look_misses)
    r = api.client.post("/tune", json=body(BENCH), headers=api.tune | {"Idempotency-Key": "race"})
    assert r.status_code == 200, r.text
    assert r.json()["id"] == winner["id"]
    assert calls["n"] == 3


def test_an_oversized_tune_body_is_413_and_stores_nothing(api: Api) -> None:
    limit = api.settings.max_traffic_bytes + api.settings.max_request_overhead_bytes
    big = [{"prompt": "x" * 4096, "output_tokens": 8}] * (limit // 4096 + 1)
    r = api.client.post("/tune", json=body(big), headers=api.tune)
    assert r.status_code == 413, r.text[:300]
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["status"] == 413
    assert 'tuner_jobs{status="queued"} 0.0' in api.client.get("/metrics").text


def test_inline_traffic_errors_name_the_items(api: Api) -> None:
    items = [BENCH[0], {"prompt": "x", "output_tokens": -3}, BENCH[1], {"messages": "hello"}]
    r = api.client.post("/tune", json=body(items), headers=api.tune)
    assert r.status_code == 422, r.text
    assert {e["field"] for e in r.json()["errors"]} == {"traffic.1", "traffic.3"}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"colour": "blue"}, "colour"),
        ({"concurrency": "many"}, "concurrency"),
        ({"concurrency": [0]}, "concurrency.0"),
        ({"engine": "tensorrt"}, "engine"),
        ({"objective": "fastest"}, "objective"),
        ({"budget": {"max_trials": 0}}, "budget.max_trials"),
        ({"serving": {"args": {"speculative_config": "{}"}}}, "serving.args"),
        ({"serving": {"args": {"max_model_len": "long"}}}, "serving.args"),
        ({"serving": {"env": {"LD_PRELOAD": "/x.so"}}}, "serving.env"),
        ({"serving": {"env": {"HSA_TOOLS_LIB": "/x.so"}}}, "serving.env"),
        ({"serving": {"env": {"NCCL_DEBUG_FILE": "/root/.bashrc"}}}, "serving.env"),
        ({"serving": {"env": {"NCCL_DEBUG=INFO": "1"}}}, "serving.env"),
        ({"serving": {"env": {"NCCL_DEBUG": "INFO\u0000"}}}, "serving.env"),
        ({"search": {"methods": ["warp"]}}, "search.methods.0"),
        ({"search": {"depth_range": [5, 2]}}, "search.depth_range"),
        ({"traffic": []}, "traffic"),
        ({"traffic": [{"nope": 1}]}, "traffic"),
        ({"model": ""}, "model"),
        # nothing from a job may become a vllm serve option, nor carry control bytes
        ({"model": "--trust-remote-code"}, "model"),
        ({"model": "org/m\u0000"}, "model"),
        ({"revision": "-x"}, "revision"),
        ({"revision": "main\n--trust-remote-code"}, "revision"),
        ({"serving": {"args": {"tokenizer": "--trust-remote-code"}}}, "serving.args"),
        ({"search": {"methods": ["draft_model"], "drafts": {"draft_model": ["-d"]}}}, "search.drafts"),
        ({"request_rate": [1.0]}, "body"),
        ({"trust_remote_code": True}, "trust_remote_code"),
        ({"level_weights": {"c3": 1.0}}, "level_weights"),
        ({"level_weights": {"c1": 0.0}}, "level_weights"),
        ({"search": {"compat_overrides": {"suffix": "yes please"}}}, "search.compat_overrides"),
    ],
)
def test_bad_input_is_422_naming_the_field(api: Api, patch: dict, field: str) -> None:
    traffic = upload(api)
    r = api.client.post("/tune", json=body(traffic) | patch, headers=api.tune)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert problem["status"] == 422
    assert any(e["field"] == field or e["field"].startswith(field) for e in problem["errors"]), problem


def test_serving_allowlist_accepts_known_args(api: Api) -> None:
    serving = {
        "args": {
            "tensor_parallel_size": 8,
            "max_model_len": 8192,
            "enable_prefix_caching": True,
            "kv_cache_dtype": "fp8",
            "gpu_memory_utilization": 0.9,
        },
        "env": {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_USE_AITER_MHA": "0"},
    }
    r = api.client.post("/tune", json=body(upload(api), serving=serving, hardware="mi300x"), headers=api.tune)
    assert r.status_code == 202, r.text


def test_level_weights_and_compat_overrides_reach_the_job(api: Api) -> None:
    from tuner import tuning
    from tuner.store.db import make_engine, make_session_factory

    extra = {"level_weights": {"1": 3.0, "c8": 1.0}, "search": {"compat_overrides": {"suffix": True, "eagle": False}}}
    r = api.client.post("/tune", json=body(upload(api)) | extra, headers=api.tune)
    assert r.status_code == 202, r.text
    engine = make_engine(api.settings.db_url)
    try:
        with make_session_factory(engine)() as s:
            spec = tuning.job_spec(tuning.get_job(s, r.json()["id"]))
    finally:
        engine.dispose()
    assert spec.level_weights == {"c1": 3.0, "c8": 1.0}
    assert spec.compat_overrides == {"suffix": True, "eagle": False}


def test_a_queued_job_for_a_chip_no_worker_has_says_so(api: Api) -> None:
    from tuner import tuning
    from tuner.store.db import make_engine, make_session_factory, transaction

    job = api.client.post("/tune", json=body(upload(api), engine="vllm", hardware="mi355x"), headers=api.tune).json()
    got = api.client.get(f"/tune/{job['id']}", headers=api.read).json()
    assert got["status"] == "queued" and "no worker has reported mi355x" in got["waiting_for"]
    engine = make_engine(api.settings.db_url)
    with transaction(make_session_factory(engine)) as s:
        tuning.report_worker(s, "node-7@host", {"hardware": "mi355x", "vllm_version": "0.34.0"})
    engine.dispose()
    assert api.client.get(f"/tune/{job['id']}", headers=api.read).json()["waiting_for"] is None


def test_unknown_ids_are_404(api: Api) -> None:
    unknown = "f" * 32
    for method, path in [("get", "/tune/{}"), ("get", "/tune/{}/trials"), ("post", "/tune/{}/cancel")]:
        r = getattr(api.client, method)(path.format(unknown), headers=api.tune)
        assert r.status_code == 404, path
        assert r.headers["content-type"] == "application/problem+json"
        malformed = getattr(api.client, method)(path.format("nope"), headers=api.tune)
        assert malformed.status_code == 422 and malformed.json()["errors"][0]["field"] == "job_id"
    r = api.client.post("/tune", json=body(unknown), headers=api.tune)
    assert r.status_code == 404
    assert api.client.post("/tune", json=body("no-such-sample"), headers=api.tune).status_code == 422


def test_auth_missing_wrong_and_scoped(api: Api) -> None:
    traffic = upload(api)
    r = api.client.post("/tune", json=body(traffic))
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert r.headers["content-type"] == "application/problem+json"
    assert (
        api.client.post("/tune", json=body(traffic), headers={"Authorization": "Bearer stk_wrong"}).status_code == 401
    )
    assert api.client.post("/tune", json=body(traffic), headers=api.read).status_code == 403
    job = api.client.post("/tune", json=body(traffic), headers=api.tune).json()
    assert api.client.get(f"/tune/{job['id']}", headers=api.tune_only).status_code == 403
    assert api.client.get(f"/tune/{job['id']}", headers=api.read).status_code == 200
    assert api.client.get("/recommendation?model=x").status_code == 401


def test_cancel_queued_job_then_409(api: Api) -> None:
    job = api.client.post("/tune", json=body(upload(api)), headers=api.tune).json()
    r = api.client.post(f"/tune/{job['id']}/cancel", headers=api.tune)
    assert r.status_code == 202
    assert r.json()["status"] == "cancelled"
    again = api.client.post(f"/tune/{job['id']}/cancel", headers=api.tune)
    assert again.status_code == 409


def test_bad_requests_lose_nothing_already_stored(api: Api) -> None:
    traffic = upload(api)
    job = api.client.post("/tune", json=body(traffic), headers=api.tune).json()
    for bad in ({"model": 3}, {"colour": 1}, {"traffic": []}):
        assert api.client.post("/tune", json=body(traffic) | bad, headers=api.tune).status_code == 422
    assert api.client.post("/traffic", content=b"{broken", headers=api.tune).status_code == 422
    assert api.client.get(f"/tune/{job['id']}", headers=api.read).json()["status"] == "queued"
    assert api.client.get(f"/traffic/{traffic}", headers=api.read).json()["request_count"] == len(BENCH)


def test_internal_fault_is_500_problem_without_stack_trace(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuner import tuning

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError("disk on fire at /secret/path")

    monkeypatch.setattr(tuning, "get_job", boom)
    r = api.client.get("/tune/" + "a" * 32, headers=api.read)
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/problem+json"
    assert "Traceback" not in r.text and "/secret/path" not in r.text
    assert r.json()["title"] == "Internal server error"


def test_healthz_metrics_and_openapi(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    api.client.post("/tune", json=body(upload(api)), headers=api.tune)
    text = api.client.get("/metrics").text
    assert 'tuner_jobs{status="queued"} 1.0' in text
    assert "tuner_trial_duration_seconds" in text or "tuner_trials_run" in text
    assert api.client.get("/openapi.json").json()["paths"]["/tune"]["post"]
    assert api.client.get("/docs").status_code == 200
