"""GET /tune/{id}/report: a finished simulated job's page renders in headless Chromium with no console error
and no request beyond itself, its charts plot exactly the job's trials, and it says SIMULATED on each chart."""

from __future__ import annotations

import json
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.test_traffic import sharegpt_subset
from tests.browser import points, render
from tuner.api.app import create_app
from tuner.auth import create_token
from tuner.demo import LLAMA_8B_CONFIG
from tuner.settings import Settings
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.wiring import make_runner

CHARTS = (
    "chart-speedup",
    "chart-schedule",
    "chart-accept-cum",
    "chart-accept-cond",
    "chart-pareto-tpot",
    "chart-pareto-ttft",
)


@pytest.fixture
def finished(db_url: str, tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str], dict[str, Any]]]:
    """A simulated job run to the end by the app's own runner; the client, a token's headers, the job."""
    settings = Settings(database_url=db_url, data_dir=tmp_path, poll_s=0.1, heartbeat_s=0.5)
    engine = make_engine(db_url)
    with transaction(make_session_factory(engine)) as s:
        token = create_token(s, "report", ["tune", "read"])
        other = create_token(s, "other", ["read"], team="other")
    engine.dispose()
    app = create_app(settings, background=lambda st, f: make_runner(st, f, report=False))
    with TestClient(app, raise_server_exceptions=False) as client:
        auth = {"Authorization": f"Bearer {token}"}
        sample = client.post("/traffic", content=sharegpt_subset(12), headers=auth).json()
        r = client.post(
            "/tune",
            headers=auth,
            json={
                "model": "meta-llama/Llama-3.1-8B-Instruct",
                "hf_config": LLAMA_8B_CONFIG,
                "traffic": sample["id"],
                "engine": "simulated",
                "hardware": "mi300x",
                "concurrency": [1, 16, 128],
                "num_requests": 16,
                "budget": {"max_trials": 12},
                "confirm_runs": 3,
                "slo": {"p99_tpot_ms": 60, "p99_ttft_ms": 3000},
            },
        )
        assert r.status_code == 202, r.text
        deadline = time.monotonic() + 180
        while (job := client.get(r.headers["location"], headers=auth).json())["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["status"] == "succeeded", job
        job["other_team"] = {"Authorization": f"Bearer {other}"}
        yield client, auth, job


def _expected_speedups(trials: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per configuration, (level, median speedup over every no-speculation run's median): the throughput
    objective recomputed from the trials as the API returns them."""
    base: dict[float, list[float]] = {}
    runs: dict[str, dict[float, list[float]]] = {}
    for t in trials:
        if t["status"] != "succeeded":
            continue
        for lv in t["result"]["levels"]:
            if t["speculative_config"] is None:
                base.setdefault(lv["level"]["value"], []).append(lv["output_throughput"])
    for t in trials:
        if t["status"] != "succeeded" or t["speculative_config"] is None:
            continue
        key = json.dumps(t["speculative_config"], sort_keys=True)
        for lv in t["result"]["levels"]:
            b = statistics.median(base[lv["level"]["value"]])
            runs.setdefault(key, {}).setdefault(lv["level"]["value"], []).append(lv["output_throughput"] / b)
    return {k: sorted((x, statistics.median(v)) for x, v in per.items()) for k, per in runs.items()}


def test_report_of_a_simulated_job(finished: tuple[TestClient, dict[str, str], dict[str, Any]], tmp_path: Path) -> None:
    client, auth, job = finished
    url = f"/tune/{job['id']}/report"
    assert client.get(url).status_code == 401
    assert client.get(url, headers=job["other_team"]).status_code == 404  # another team's job does not exist
    r = client.get(url, headers=auth)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert not re.search(r"(https?:)?//[\w.-]+\.\w", page), "an external address in the page"
    assert not re.search(r"\s(src|href)\s*=", page), "the page loads nothing"
    assert len(page) < 400_000
    trials = client.get(f"/tune/{job['id']}/trials", headers=auth).json()
    assert job["objective"] == "throughput"

    path = tmp_path / "report.html"
    path.write_text(page, encoding="utf-8")
    seen = render(path, tmp_path / "report.png")
    assert seen.console_errors == []
    assert seen.requests == [path.resolve().as_uri()]
    assert set(CHARTS) <= set(seen.charts)
    assert seen.watermarks == len(CHARTS) and "[SIMULATED]" in seen.text

    # throughput against p99 TPOT: one point per trial and level, exactly the trials' figures
    plotted = sorted(p for pts in points(seen.charts["chart-pareto-tpot"]).values() for p in pts)
    measured = sorted(
        (lv["tpot_ms"]["p99"], lv["output_throughput"]) for t in trials if t["result"] for lv in t["result"]["levels"]
    )
    assert [v for p in plotted for v in p] == pytest.approx([v for p in measured for v in p])
    # speedup by concurrency: each measured configuration's points are the trials' ratios to the baseline
    drawn = points(seen.charts["chart-speedup"])
    measured_series = sorted(sorted(v) for k, v in drawn.items() if not k.startswith("predicted: "))
    expected = sorted(_expected_speedups(trials).values())
    assert len(measured_series) == len(expected)
    for got, want in zip(measured_series, expected, strict=True):
        assert [v for p in got for v in p] == pytest.approx([v for p in want for v in p])
    # cumulative acceptance per position: accepted at i / drafts over each configuration's runs and levels
    sums: dict[str, tuple[list[int], int]] = {}
    for t in trials:
        if not (t["result"] and t["speculative_config"] and t["status"] == "succeeded"):
            continue
        for lv in t["result"]["levels"]:
            sd = lv["spec_decode"]
            if sd and sd["num_drafts"]:
                acc, drafts = sums.setdefault(json.dumps(t["speculative_config"], sort_keys=True), ([], 0))
                acc.extend([0] * (len(sd["accepted_per_position"]) - len(acc)))
                for i, n in enumerate(sd["accepted_per_position"]):
                    acc[i] += n
                sums[json.dumps(t["speculative_config"], sort_keys=True)] = (acc, drafts + sd["num_drafts"])
    want_acc = sorted([n / drafts for n in acc] for acc, drafts in sums.values())
    got_acc = sorted([y for _, y in pts] for pts in points(seen.charts["chart-accept-cum"]).values())
    assert len(got_acc) == len(want_acc)
    for got, want in zip(got_acc, want_acc, strict=True):
        assert got == pytest.approx(want)
    # the cost section shows the job's GPU-seconds
    assert f"{job['cost']['gpu_seconds']:.1f} GPU-seconds" in seen.text
    failed = [t for t in trials if t["failure_class"]]
    for t in failed:
        assert t["failure_class"] in seen.text


def test_report_of_an_unknown_job_is_a_problem(
    finished: tuple[TestClient, dict[str, str], dict[str, Any]],
) -> None:
    client, auth, _ = finished
    r = client.get("/tune/" + "0" * 32 + "/report", headers=auth)
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
