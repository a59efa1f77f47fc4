"""GET /tune/{id}/report: a finished simulated job's page renders in headless Chromium with no console error
and no request beyond itself, its charts plot exactly the job's trials, and it says SIMULATED on each chart."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.support import run_to_end, sharegpt_subset
from tests.browser import assert_charts_plot, render
from tuner.auth import create_token
from tuner.store.db import make_engine, make_session_factory, transaction

CHARTS = (
    "chart-speedup",
    "chart-schedule",
    "chart-accept-cum",
    "chart-accept-cond",
    "chart-pareto-tpot",
    "chart-pareto-ttft",
)


@pytest.fixture
def finished(
    served: tuple[TestClient, dict[str, str]], db_url: str
) -> tuple[TestClient, dict[str, str], dict[str, Any]]:
    """A simulated job run to the end by the app's own runner; the client, a token's headers, the job (with
    ``other_team``: the headers of a reader of another team)."""
    client, auth = served
    with transaction(make_session_factory(make_engine(db_url))) as s:
        other = create_token(s, "other", ["read"], team="other")
    sample = client.post("/traffic", content=sharegpt_subset(12), headers=auth).json()
    job = run_to_end(
        client,
        auth,
        sample["id"],
        timeout_s=180,
        concurrency=[1, 16, 128],
        budget={"max_trials": 12},
        slo={"p99_tpot_ms": 60, "p99_ttft_ms": 3000},
    )
    assert job["status"] == "succeeded", job
    job["other_team"] = {"Authorization": f"Bearer {other}"}
    return client, auth, job


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

    assert_charts_plot(seen.charts, trials)
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
