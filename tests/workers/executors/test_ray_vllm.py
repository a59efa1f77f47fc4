"""One real vLLM-on-CPU trial through the Ray executor.

The Ray worker runs this project's Python; the runner inside the task starts ``vllm serve`` with the
separate vLLM venv's Python ($TUNER_VLLM_PYTHON), so Ray never imports vLLM's environment. Ray has set
``CUDA_VISIBLE_DEVICES`` for the task (the test cluster declares GPUs), and the runner, told it is in
Ray, does not set physical ids again.
"""

from __future__ import annotations

import dataclasses
import importlib.util

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
from tuner.workers.options import CPU_SERVER_ENV  # noqa: E402


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
    # The runner echoes the trial's "auto"; the record names the chip of the node that ran it (the
    # executor pinned "auto" to the family with the most free GPUs: the cluster's MI300X nodes).
    assert result.hardware == "mi300x" and result.retried_failures == ()
    (level,) = result.levels
    assert level.errors == 0 and level.output_tokens == 6 * 24
    assert level.spec_decode is not None and level.spec_decode.num_drafts > 0
    assert result.pgid is not None and group_gone(result.pgid)
    assert [h.outcome for h in ex.history] == ["result"]
