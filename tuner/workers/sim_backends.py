"""How the simulated engine treats a drafter's ROCm attention backend: an ASSUMPTION built from the public
reports in docs/vllm-facts.md ("Newer vLLM"), not a measurement, labelled like every simulated figure.

- EAGLE / EAGLE-3 acceptance collapses on the default ROCm attention path (vllm#47854); the drafter on
  ROCM_AITER_UNIFIED_ATTN is the workaround. Modelled: acceptance x0.4 on vLLM's default and ROCM_ATTN.
- AITER FA with EAGLE-3 was 24% slower than TRITON_ATTN (vllm#54180): drafter cost x1.24.
- MTP on AITER MLA: ~40% faster on gfx942 (MI300X), a memory fault on gfx950 (vLLM recipes #926).
Anywhere else a backend changes nothing. Only on AMD chips.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tuner.domain import Method, SpecConfig
from tuner.domain.chips import is_amd, is_gfx950
from tuner.workers.sim_profiles import ModelProfile

COLLAPSE = 0.4  # acceptance kept by EAGLE drafters on the collapsing path
_COLLAPSING = (None, "ROCM_ATTN")


@dataclass(frozen=True)
class BackendEffect:
    acceptance: float = 1.0  # factor on conditional acceptance
    draft_cost: float = 1.0  # factor on the drafter's cost
    crash: str | None = None  # the error vLLM dies with


def backend_effect(hardware: str, spec: SpecConfig) -> BackendEffect:
    if spec.is_off or not is_amd(hardware):
        return BackendEffect()
    backend = spec.drafter_backend
    if spec.method in (Method.EAGLE, Method.EAGLE3):
        if backend in _COLLAPSING:
            return BackendEffect(acceptance=COLLAPSE)
        if backend == "ROCM_AITER_FA" and spec.method is Method.EAGLE3:
            return BackendEffect(draft_cost=1.24)
    if spec.method is Method.MTP and backend == "ROCM_AITER_MLA":
        if is_gfx950(hardware):
            return BackendEffect(crash="Memory access fault by GPU node-2 (Agent handle: 0x5) on address 0x7f1c")
        return BackendEffect(draft_cost=0.6)
    return BackendEffect()


def with_backend(model: ModelProfile, hardware: str, spec: SpecConfig) -> ModelProfile:
    """``model`` as the configuration's drafter backend leaves it on ``hardware``."""
    effect = backend_effect(hardware, spec)
    if effect == BackendEffect():
        return model
    return dataclasses.replace(
        model,
        acceptance_scale={**model.acceptance_scale, spec.method: effect.acceptance},
        draft_cost_scale=model.draft_cost_scale * effect.draft_cost,
    )
