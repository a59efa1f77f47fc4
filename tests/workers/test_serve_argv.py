"""What a recommendation deploys is what its trial measured: one function (tuner.domain.serve_argv) builds both.

The runner is run for real against a stand-in that records the argv it was started with; the recommendation's
``vllm serve`` arguments must equal it once the runtime extras (entry point, host, port, platform flags) are
taken off.
"""

from __future__ import annotations

import json
import subprocess
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
    UnsafeArgument,
    serve_argv,
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
NGRAM3 = SpecConfig.from_vllm({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3})
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


def _vllm_parse(vllm_python: Path, argv: list[str]) -> dict:
    out = subprocess.run(
        [str(vllm_python), str(Path(__file__).parent / "vllm_parse_argv.py"), json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.vllm
def test_job_strings_cannot_become_options_for_the_real_vllm_serve_parser(vllm_python: Path) -> None:
    """What a job may pass (values that look like flags after the first character) stays a value for vLLM's
    own parser; what it may not (a leading '-') is refused before any argv exists."""
    hostile = "main --trust-remote-code"
    serving = ServingConfig(args={"tokenizer": "tok --trust-remote-code", "max_model_len": 512})
    argv = serve_argv(ModelRef("org/m", revision=hostile), serving, NGRAM3)
    parsed = _vllm_parse(vllm_python, ["serve", *argv])
    assert parsed["model_tag"] == "org/m" and parsed["revision"] == hostile
    assert parsed["tokenizer"] == "tok --trust-remote-code" and parsed["max_model_len"] == 512
    assert parsed["trust_remote_code"] is False
    # Why the leading '-' is refused: given to vLLM's parser as the model, it is an option, not a model.
    assert _vllm_parse(vllm_python, ["serve", "--trust-remote-code"])["trust_remote_code"] is True
    for model, revision, tokenizer in (("--trust-remote-code", None, None), ("m", "-x", None), ("m", None, "-t")):
        bad = ServingConfig(args={"tokenizer": tokenizer}) if tokenizer else ServingConfig()
        with pytest.raises(UnsafeArgument):
            serve_argv(ModelRef(model, revision=revision), bad, NGRAM3)
    with pytest.raises(UnsafeArgument, match="control"):
        serve_argv(ModelRef("org/m\x00"), ServingConfig(), NGRAM3)
    with pytest.raises(UnsafeArgument, match="draft model"):
        serve_argv(
            ModelRef("org/m"),
            ServingConfig(),
            SpecConfig.from_vllm({"method": "draft_model", "model": "-d", "num_speculative_tokens": 2}),
        )
