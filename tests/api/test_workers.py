"""GET /workers and `tuner space --server`: the space a job would get on the fleet, from what its workers
reported of their vLLM (the 0.34 declarations in tests/workers/fixtures/vllm_source)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.api.support import Api, serve
from tuner import tuning
from tuner.api.app import create_app
from tuner.store.db import make_engine, make_session_factory, transaction
from tuner.workers.vllm_probe import probe_source

SOURCES = Path(__file__).parents[1] / "workers" / "fixtures" / "vllm_source"
TUNER = Path(sys.executable).parent / "tuner"


def report(api: Api, name: str, hardware: str, version: str) -> None:
    caps = probe_source(SOURCES / version / "vllm", arctic_inference=False).to_dict()
    engine = make_engine(api.settings.db_url)
    with transaction(make_session_factory(engine)) as s:
        tuning.report_worker(s, name, {"hardware": hardware, "vllm_version": version, "vllm_capabilities": caps})
    engine.dispose()


def test_workers_list_what_they_reported(api: Api) -> None:
    assert api.client.get("/workers").status_code == 401
    report(api, "gpu-1", "mi300x", "0.33.0")
    (worker,) = api.client.get("/workers", headers=api.read).json()
    assert worker["name"] == "gpu-1" and worker["families"] == ["mi300x"] and worker["vllm_version"] == "0.33.0"
    assert worker["vllm_capabilities"]["schedule_field"] == "num_speculative_tokens_per_batch_size"
    assert worker["vllm_capabilities"]["suffix_ready"] is False


def test_tuner_space_uses_the_fleets_capabilities(api: Api, tmp_path: Path) -> None:
    report(api, "gpu-1", "mi300x", "0.33.0")
    report(api, "gpu-2", "mi355x", "0.34.0")
    token = api.read["Authorization"].removeprefix("Bearer ")
    env = {**os.environ, "TUNER_DATA_DIR": str(tmp_path), "TUNER_TOKEN": token}
    with serve(create_app(api.settings)) as url:

        def space(*args: str) -> subprocess.CompletedProcess[str]:
            argv = [str(TUNER), "space", "--model", "org/m", "--server", url, "--methods", "ngram", "suffix", *args]
            return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)

        on_355 = space("--hardware", "mi355x", "--json")
        on_300 = space("--hardware", "mi300x", "--json")
        none = space("--hardware", "h100")
        denied = subprocess.run(
            [str(TUNER), "space", "--model", "m", "--server", url],
            env={**env, "TUNER_TOKEN": "not-a-token"},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert on_355.returncode == 0, on_355.stderr
    new = json.loads(on_355.stdout)
    assert new["capabilities"] == "reported by worker gpu-2" and new["vllm_version"] == "0.34.0"
    assert {a["arm"] for a in new["offered"]} == {"off", "ngram", "suffix"}  # native suffix in 0.34
    old = json.loads(on_300.stdout)
    assert old["vllm_version"] == "0.33.0" and {a["arm"] for a in old["offered"]} == {"off", "ngram"}
    assert none.returncode == 2 and "no worker for h100" in none.stderr
    assert denied.returncode == 2 and "401" in denied.stderr and "Traceback" not in denied.stderr
