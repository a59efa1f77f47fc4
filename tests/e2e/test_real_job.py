"""A real tune job end to end on the CPU vLLM: POST /tune with engine vllm on the tiny model the tests build,
methods off, ngram and draft_model, a budget of a few trials, confirmation runs on fresh servers; then
GET /recommendation answers with engine vllm, trial ids whose logs exist, and a config vLLM accepted.

About ten server launches (a minute each on 2 cores): the slowest test of the suite, on SQLite only.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.browser import assert_charts_plot, render
from tuner.api.app import create_app
from tuner.auth import create_token
from tuner.settings import Settings
from tuner.store import migrate
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.wiring import make_runner
from tuner.workers.options import RunnerOptions
from tuner.workers.process_group import group_members

pytestmark = [pytest.mark.vllm]

PROMPTS = [
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "def fibonacci_list(n):\n",
    "import os\nimport sys\n\nfor name in os.listdir('.'):\n    print(name)\nfor name in os.listdir('.'):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n        self.items",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the",
]


@pytest.fixture
def served(
    tmp_path: Path, cpu_options: RunnerOptions, tiny_model: Path
) -> Iterator[tuple[TestClient, dict[str, str], Settings]]:
    db_url = f"sqlite:///{tmp_path / 'tuner.db'}"
    migrate.upgrade(db_url)
    settings = Settings(
        database_url=db_url,
        data_dir=tmp_path,
        cpu_vllm=True,
        vllm_python=cpu_options.vllm_python,
        vllm_extra_env=dict(cpu_options.extra_env),
        startup_timeout_s=420,
        poll_s=0.2,
        model_roots=str(tiny_model.parent),  # local models only from here, as a worker's TUNER_MODEL_ROOTS says
        client_cpus=",".join(map(str, cpu_options.client_cpus)) if cpu_options.client_cpus else None,  # conftest
    )
    engine = make_engine(db_url)
    with transaction(make_session_factory(engine)) as s:
        token = create_token(s, "e2e", ["tune", "read"])
    engine.dispose()
    app = create_app(settings, background=make_runner)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, {"Authorization": f"Bearer {token}"}, settings


def test_real_vllm_job_to_recommendation(
    served: tuple[TestClient, dict[str, str], Settings], tiny_model: Path, tmp_path: Path
) -> None:
    client, auth, settings = served
    traffic = [{"prompt": p, "output_tokens": 24} for p in PROMPTS * 2]
    r = client.post(
        "/tune",
        headers=auth,
        json={
            "model": str(tiny_model),
            "traffic": traffic,
            "engine": "vllm",
            "hardware": "auto",
            "concurrency": [1, 4],
            "num_requests": 8,
            "warmup_requests": 1,
            "search": {
                "methods": ["off", "ngram", "draft_model"],
                "depth_range": [2, 3],
                "drafts": {"draft_model": [str(tiny_model)]},
            },
            "serving": {"args": {"max_model_len": 512}},
            "budget": {"max_trials": 3},
            "confirm_runs": 3,
            "correctness_prompts": 2,
        },
    )
    assert r.status_code == 202, r.text
    job_url = r.headers["location"]
    deadline = time.monotonic() + 40 * 60
    while (job := client.get(job_url, headers=auth).json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(2)
    trials = client.get(f"{job_url}/trials", headers=auth).json()
    assert job["status"] == "succeeded", (job, [(t["number"], t["failure_class"], t["failure_reason"]) for t in trials])
    summary = [
        (
            t["number"],
            t["purpose"],
            t["method"],
            t["status"],
            t["failure_class"],
            [(lv["level"]["value"], round(lv["output_throughput"], 1)) for lv in (t["result"] or {}).get("levels", [])],
        )
        for t in trials
    ]
    print("trials:", *summary, "best:", job["best"], sep="\n")
    assert all(t["engine"] == "vllm" and not t["simulated"] for t in trials)
    methods = {t["method"] for t in trials if t["purpose"] != "confirm"}
    assert {"off", "ngram", "draft_model"} <= methods, methods
    for t in trials:
        assert t["log_path"] and Path(t["log_path"]).exists(), t
        result = t["result"]
        assert result["pgid"] and group_members(result["pgid"]) == []  # no server outlived its trial
    rec = client.get("/recommendation", params={"model": str(tiny_model)}, headers=auth)
    assert rec.status_code == 200, rec.text
    body = rec.json()
    assert body["engine"] == "vllm" and body["simulated"] is False
    assert body["vllm_version"] and body["vllm_version"].startswith("0.32")
    by_number = {t["number"]: t for t in trials}
    assert set(body["provenance"]["trial_numbers"]) <= set(by_number)
    for n in body["provenance"]["trial_numbers"]:
        assert Path(by_number[n]["log_path"]).exists()
    deployed = body["speculative_config"]
    # every run of the deployed config (search and confirmation, each a fresh server) succeeded; confirmation
    # adds runs only where a decision was close, so there may be one
    runs = [t for t in trials if t["speculative_config"] == deployed]
    assert runs and all(t["status"] == "succeeded" for t in runs), summary
    assert body["speedup"]["runs"] >= 1
    for figures in body["latency"].values():  # each level says whether the client kept up, and with how many
        assert isinstance(figures["client_bound"], bool) and figures["client_processes"] >= 1
    # the simulated engine never answers this: the recommendation is a measurement
    assert (
        client.get(
            "/recommendation", params={"model": str(tiny_model), "engine": "simulated"}, headers=auth
        ).status_code
        == 404
    )
    # its report renders offline in Chromium, plots these trials, and is not labelled simulated
    page = client.get(f"{job_url}/report", headers=auth)
    assert page.status_code == 200 and "SIMULATED" not in page.text
    report = tmp_path / "report.html"
    report.write_text(page.text, encoding="utf-8")
    seen = render(report)
    assert seen.console_errors == [] and seen.requests == [report.resolve().as_uri()]
    assert seen.watermarks == 0
    assert_charts_plot(seen.charts, trials)
