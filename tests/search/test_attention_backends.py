"""Drafter attention backends on AMD chips: which the space offers, and a study on the simulated engine
(its ROCm backend effects are an assumption from vllm#47854/#54180 and vLLM recipes #926) that drops the
backends whose acceptance collapses and answers on a working one."""

from __future__ import annotations

import dataclasses

from tuner.domain import (
    Budget,
    ConcurrencyRange,
    Engine,
    LoadLevel,
    Method,
    ModelRef,
    Recommendation,
    ServingConfig,
    SpecConfig,
    TrafficRequest,
    serve_argv,
)
from tuner.search import build_space, tune
from tuner.search.compat import ROCM_DRAFTER_BACKENDS
from tuner.workers.sim_backends import COLLAPSE, backend_effect
from tuner.workers.simulated import PRESETS, WORKLOADS, SimulatedEngine

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128256}
DSV3 = {"model_type": "deepseek_v3", "kv_lora_rank": 512, "num_nextn_predict_layers": 1}
E3 = {Method.EAGLE3: ["org/eagle3"]}


def space(hardware: str, config=LLAMA, methods=(Method.EAGLE3, Method.NGRAM), drafts=E3, **kw):
    return build_space("org/m", config, hardware=hardware, vllm_version="0.34.0", methods=list(methods),
                       drafts=drafts, **kw)  # fmt: skip


def test_an_amd_job_gets_one_drafter_arm_per_backend_beside_vllms_default():
    amd = space("mi300x", attention_backends="search")
    eagle = [o for o in amd.options if o.method is Method.EAGLE3 and o.draft == "org/eagle3"]
    # one backend at a time: the drafter's beside vLLM's default, then the target's with the drafter's default
    assert [(o.drafter_backend, o.target_backend) for o in eagle] == [
        (None, None),
        *((b, None) for b in ROCM_DRAFTER_BACKENDS),
        *((None, b) for b in ROCM_DRAFTER_BACKENDS),
    ]
    ngram = [o for o in amd.options if o.method is Method.NGRAM]  # no drafter: only the target's backend
    assert {o.drafter_backend for o in ngram} == {None} and len(ngram) == 1 + len(ROCM_DRAFTER_BACKENDS)
    target = next(o for o in eagle if o.target_backend == "ROCM_AITER_FA").spec(3)
    argv = serve_argv(ModelRef("org/m"), ServingConfig(), target)
    assert "--attention-backend=ROCM_AITER_FA" in argv and target.serve_env() == {"VLLM_ROCM_USE_AITER": "1"}
    assert target.key() != dataclasses.replace(target, target_backend=None).key()
    pinned_target = space("mi300x", attention_backends="search", target_backend_pinned=True)
    assert all(o.target_backend is None for o in pinned_target.options)
    spec = next(o for o in eagle if o.drafter_backend == "ROCM_AITER_UNIFIED_ATTN").spec(3)
    assert spec.to_vllm()["attention_backend"] == "ROCM_AITER_UNIFIED_ATTN"
    assert spec.serve_env() == {"VLLM_ROCM_USE_AITER": "1"} and spec.arm.endswith("~ROCM_AITER_UNIFIED_ATTN")
    nvidia = space("h100", attention_backends="search")
    assert all(o.drafter_backend is None for o in nvidia.options)
    assert any("AMD chips only" in n for n in nvidia.notes)


def test_mla_models_get_mla_backends_and_gfx950_drops_aiter_mla_for_mtp():
    on_942 = space("mi300x", DSV3, (Method.MTP,), attention_backends="search")
    assert {o.drafter_backend for o in on_942.options if o.method is Method.MTP} == {
        None,
        "TRITON_MLA",
        "ROCM_AITER_MLA",
    }
    on_950 = space("mi355x", DSV3, (Method.MTP,), attention_backends="search")
    assert {o.drafter_backend for o in on_950.options if o.method is Method.MTP} == {None, "TRITON_MLA"}
    assert "memory-fault" in on_950.option_refusal(Method.MTP, "attention_backend:ROCM_AITER_MLA")


def test_a_job_may_pin_a_backend():
    pinned = space("mi355x", attention_backends={Method.EAGLE3: "ROCM_AITER_UNIFIED_ATTN"})
    assert {o.drafter_backend for o in pinned.options if o.method is Method.EAGLE3} == {"ROCM_AITER_UNIFIED_ATTN"}
    assert all(o.target_backend is None for o in pinned.options)  # pinning searches nothing


def test_deploy_command_carries_the_backends_environment():
    spec = SpecConfig(Method.EAGLE3, 3, model="org/eagle3", extra={"attention_backend": "ROCM_AITER_FA"})
    rec = Recommendation(
        ModelRef("org/m"), "mi300x", "0.34.0", Engine.VLLM, ServingConfig(), spec, ConcurrencyRange(1, None), None,
        None, {},
    )  # fmt: skip
    assert rec.deploy_command().startswith("env VLLM_ROCM_USE_AITER=1 vllm serve org/m")
    assert '"attention_backend":"ROCM_AITER_FA"' in rec.deploy_command()


def test_a_study_drops_collapsed_backends_and_answers_on_a_working_one():
    two = {Method.EAGLE3: ["org/eagle3", "org/eagle3-b"]}
    s = space("mi300x", methods=(Method.EAGLE3,), drafts=two, attention_backends="search")
    levels = [LoadLevel(value=c, num_requests=4 * c) for c in (1, 8)]
    requests = [TrafficRequest(format="chat", messages=({"role": "user", "content": "hello " * 50},))] * 32
    engine = SimulatedEngine(PRESETS["llama-3.1-8b"], WORKLOADS["chat"], seed=1, hardware="mi300x")
    report = tune(s, engine, model=ModelRef("org/m"), requests=requests, levels=levels, budget=Budget(10),
                  hardware="mi300x")  # fmt: skip
    collapsed = [n for n in report.outcome.notes if "collapsed_acceptance" in n]
    collapsing = {None, "ROCM_ATTN"}  # where the engine's acceptance collapses
    assert {backend_effect("mi300x", o.spec(3)).acceptance for o in s.options[1:]} == {COLLAPSE, 1.0}
    assert collapsed and all("below 60%" in n for n in collapsed)
    assert any("vLLM's default" in n for n in collapsed) and any("~ROCM_ATTN excluded" in n for n in collapsed)
    # dropped for the method: the catalogued drafts on the collapsing backend go too, unmeasured
    assert len({o.draft for o in s.options if o.method is Method.EAGLE3}) > 1
    assert any(", with draft " in n for n in collapsed)
    # measured arms on a working drafter backend are never dropped
    assert not any(f"~{b} excluded" in n for b in ("TRITON_ATTN", "ROCM_AITER_UNIFIED_ATTN") for n in collapsed)
    assert report.outcome.best.drafter_backend not in collapsing
    assert all(w.spec.is_off or w.spec.drafter_backend not in collapsing for w in report.outcome.per_level_winners)
