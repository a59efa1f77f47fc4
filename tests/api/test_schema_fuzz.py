"""The API against its own OpenAPI schema, fuzzed by schemathesis (a tool we did not write) over a real socket.

Positive and negative cases, every check, the bearer token on (schemathesis also drops it to check that auth is
enforced), unique idempotency keys (tests/api/schemathesis_hooks.py). Bounded in time: a few thousand cases
per backend. Excluded, with the reason: ``positive_data_acceptance`` expects every schema-valid body to be
accepted, and some rules are cross-field or server state that JSON Schema cannot state (one load kind per job,
``depth_range`` min <= max, the server's trust_remote_code switch, a sample's request shapes).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.api.support import serve
from tuner.api.app import create_app
from tuner.auth import create_token
from tuner.settings import Settings
from tuner.store.db import make_engine, make_session_factory, transaction

SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
BUDGET_S = 60


def test_no_5xx_and_no_schema_violation_under_fuzzing(db_url: str, tmp_path: Path) -> None:
    settings = Settings(database_url=db_url, data_dir=tmp_path, max_traffic_bytes=256 * 1024, in_process_runner=False)
    engine = make_engine(settings.db_url)
    try:
        with transaction(make_session_factory(engine)) as s:
            token = create_token(s, "fuzz", ["tune", "read"])
    finally:
        engine.dispose()
    env = os.environ | {"SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks", "PYTHONPATH": str(Path.cwd())}
    with serve(create_app(settings)) as url:
        run = subprocess.run(
            [
                str(SCHEMATHESIS),
                "run",
                f"{url}/openapi.json",
                "--header",
                f"Authorization: Bearer {token}",
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
                "--mode",
                "all",
                "--max-examples",
                "25",
                "--max-time",
                str(BUDGET_S),
                "--seed",
                "1",
                "--no-color",
                "--warnings",
                "off",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=BUDGET_S * 4,
        )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "Test cases:" in run.stdout and " generated" in run.stdout, run.stdout[-2000:]
