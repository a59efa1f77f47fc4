from __future__ import annotations

import json

from tests.api.support import BENCH, CHAT, Api, jsonl, sharegpt_subset


def test_upload_chat_jsonl_returns_stats_and_fingerprint(api: Api) -> None:
    r = api.client.post("/traffic", content=jsonl(CHAT), headers=api.tune | {"content-type": "application/x-ndjson"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["request_count"] == 5
    assert len(body["fingerprint"]) == 64
    assert body["stats"]["output_tokens_p50"] == 64
    assert body["workload_class"].startswith("text/")
    again = api.client.post("/traffic", content=jsonl(CHAT), headers=api.tune)
    assert again.json()["fingerprint"] == body["fingerprint"]
    assert again.json()["id"] != body["id"]


def test_upload_vllm_custom_bench_format(api: Api) -> None:
    r = api.client.post("/traffic", content=jsonl(BENCH), headers=api.tune)
    assert r.status_code == 201, r.text
    assert r.json()["stats"]["has_output_lengths"] is True
    assert r.json()["stats"]["formats"] == ["completions"]


def test_upload_sharegpt_json(api: Api) -> None:
    r = api.client.post("/traffic", content=sharegpt_subset(), headers=api.tune | {"content-type": "application/json"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert 15 <= body["request_count"] <= 20  # conversations without a reply are dropped, as vllm bench does
    assert body["stats"]["formats"] == ["chat"]
    assert body["stats"]["output_tokens_mean"] > 10


def test_arrival_times_and_recorded_lengths_are_kept(api: Api) -> None:
    items = [dict(b, arrival_s=i * 0.5) for i, b in enumerate(BENCH)]
    r = api.client.post("/traffic", content=jsonl(items), headers=api.tune)
    assert r.status_code == 201
    assert r.json()["stats"]["has_arrival_times"] is True


def test_malformed_lines_are_named(api: Api) -> None:
    lines = jsonl(BENCH).decode().split("\n")
    lines.insert(1, "{not json")
    lines.append(json.dumps({"prompt": "x", "output_tokens": -3}))
    lines.append(json.dumps({"neither": 1}))
    r = api.client.post("/traffic", content="\n".join(lines).encode(), headers=api.tune)
    assert r.status_code == 422
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert {e["line"] for e in problem["errors"]} == {2, 6, 7}
    assert "2" in problem["detail"] and "6" in problem["detail"] and "7" in problem["detail"]


def test_empty_sample_is_422(api: Api) -> None:
    r = api.client.post("/traffic", content=b"  \n", headers=api.tune)
    assert r.status_code == 422
    assert "empty" in r.json()["detail"]


def test_too_large_is_413(api: Api) -> None:
    big = jsonl([{"prompt": "x" * 1000, "output_tokens": 8}] * 600)
    assert len(big) > api.settings.max_traffic_bytes
    r = api.client.post("/traffic", content=big, headers=api.tune)
    assert r.status_code == 413
    assert r.headers["content-type"] == "application/problem+json"


def test_delete_removes_prompts_but_keeps_stats(api: Api) -> None:
    sample = api.client.post("/traffic", content=jsonl(CHAT), headers=api.tune).json()
    r = api.client.delete(f"/traffic/{sample['id']}", headers=api.tune)
    assert r.status_code == 200
    after = api.client.get(f"/traffic/{sample['id']}", headers=api.read).json()
    assert after["prompts_deleted"] is True
    assert after["fingerprint"] == sample["fingerprint"]
    assert after["stats"] == sample["stats"]
    tune = api.client.post("/tune", json={"model": "m", "traffic": sample["id"]}, headers=api.tune)
    assert tune.status_code == 409


def test_unknown_sample_is_404(api: Api) -> None:
    unknown = "0" * 32
    assert api.client.get(f"/traffic/{unknown}", headers=api.read).status_code == 404
    assert api.client.delete(f"/traffic/{unknown}", headers=api.tune).status_code == 404
    malformed = api.client.get("/traffic/nope%00", headers=api.read)  # never reaches a query
    assert malformed.status_code == 422 and malformed.json()["errors"][0]["field"] == "traffic_id"
