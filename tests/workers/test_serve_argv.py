"""What a recommendation deploys is what its trial measured: one function (tuner.domain.serve_argv) builds both.

The runner is run for real against a stand-in that records the argv it was started with; the recommendation's
``vllm serve`` arguments must equal it once the runtime extras (entry point, host, port, platform flags) are
taken off.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tuner.domain import (
    ConcurrencyRange,
    Engine,
    LoadLevel,
    ModelRef,
    Recommendation,
    ServingConfig,
    SpecConfig,
    TrafficFormat,
    TrafficRequest,
    TrialSpec,
)
from tuner.workers.options import RunnerOptions
from tuner.workers.vllm_runner import VllmRunner

PY = sys.executable
RECORD_ARGV = """
import json, os, sys
json.dump(sys.argv[1:], open(os.environ["ARGV_OUT"], "w"))
sys.exit(1)
"""
MODEL = ModelRef("org/m", revision="0123abc", trust_remote_code=True)
SERVING = ServingConfig(
    args={"tensor_parallel_size": 2, "max_model_len": 4096, "enable_prefix_caching": False, "kv_cache_dtype": "fp8"}
)
SPECS = [
    SpecConfig(),
    # keys out of order on purpose: both sides must serialise the same canonical JSON
    SpecConfig.from_vllm(
        {
            "prompt_lookup_max": 3,
            "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 1024, 0]],
            "num_speculative_tokens": 3,
            "method": "ngram",
        }
    ),
    SpecConfig.from_vllm({"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 16}),
    SpecConfig.from_vllm({"method": "eagle3", "model": "org/m-eagle3", "num_speculative_tokens": 4}),
]
CPU_FLAGS = ("--enforce-eager",)


def _measured_argv(tmp_path: Path, spec: SpecConfig, command: tuple[str, ...]) -> list[str]:
    """The argv the real runner started its server with (the stand-in records it and exits)."""
    out = tmp_path / "argv.json"
    options = RunnerOptions(
        vllm_command=command,
        log_dir=str(tmp_path),
        stop_grace_s=1.0,
        extra_args=CPU_FLAGS,
        extra_env={"ARGV_OUT": str(out)},
    )
    trial = TrialSpec(
        model=MODEL,
        spec=spec,
        levels=(LoadLevel(num_requests=1),),
        requests=(TrafficRequest(TrafficFormat.COMPLETIONS, prompt="x", output_tokens=4),),
        serving=SERVING,
    )
    VllmRunner(options)(trial)
    return [*command[:2], *json.loads(out.read_text())]  # python, the script, then what the script was given


def _without_runtime_extras(argv: list[str], command: tuple[str, ...]) -> list[str]:
    assert argv[: len(command)] == list(command)
    rest = argv[len(command) :]
    if command[-1] != "serve":  # the module entry point spells the positional model as --model
        assert rest[0] == "--model"
        rest = rest[1:]
    assert rest[len(rest) - len(CPU_FLAGS) :] == list(CPU_FLAGS)
    rest = rest[: len(rest) - len(CPU_FLAGS)]
    assert rest[-4] == "--host" and rest[-2] == "--port", rest
    return rest[:-4]


def _recommendation(spec: SpecConfig) -> Recommendation:
    return Recommendation(
        model=MODEL,
        hardware="mi300x",
        vllm_version="0.34.0",
        engine=Engine.VLLM,
        serving=SERVING,
        spec=spec,
        concurrency=ConcurrencyRange(1, None),
        speedup=None,
        acceptance_length=None,
        latency={},
    )


@pytest.mark.parametrize("entry", ["vllm serve", "module"])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.label())
def test_the_recommendation_deploys_the_measured_argv(tmp_path: Path, spec: SpecConfig, entry: str) -> None:
    script = tmp_path / "record_argv.py"
    script.write_text(RECORD_ARGV)
    # like `vllm serve`, or like `python -m vllm.entrypoints.openai.api_server` (no positional model)
    command = (PY, str(script), "serve") if entry == "vllm serve" else (PY, str(script))
    measured = _measured_argv(tmp_path, spec, command)
    deployed = _recommendation(spec).serve_args()
    assert deployed[:2] == ["serve", "org/m"]  # vllm serve takes the model positionally
    assert _without_runtime_extras(measured, command) == deployed[1:]
    if spec.is_off:
        assert "--speculative-config" not in deployed
    else:
        assert json.loads(deployed[deployed.index("--speculative-config") + 1]) == spec.to_vllm()
