"""Which GPUs a server sees: one set of visibility variables, consistent for CUDA and ROCm.

vLLM on ROCm copies ``HIP_VISIBLE_DEVICES`` into ``CUDA_VISIBLE_DEVICES`` at import and refuses to start
when both are set and differ, so the two are always written together with the same value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

CUDA = "CUDA_VISIBLE_DEVICES"
HIP = "HIP_VISIBLE_DEVICES"
ROCR = "ROCR_VISIBLE_DEVICES"


def device_env(env: Mapping[str, str], gpu_ids: Sequence[int] | None, *, in_ray: bool = False) -> dict[str, str]:
    """Return a copy of ``env`` whose visibility variables select ``gpu_ids`` (physical ids).

    ``gpu_ids=None`` keeps the inherited selection. Inside Ray the inherited variables already select the
    granted GPUs, renumbered from 0, so physical ids are not applied again; only a HIP/CUDA mismatch is
    resolved (HIP wins, as vLLM would copy it).
    """
    out = dict(env)
    if gpu_ids is not None and not in_ray:
        ids = ",".join(str(int(i)) for i in gpu_ids)
        out[CUDA] = ids
        out[HIP] = ids
        # ROCR filtering happens below HIP and would renumber the physical ids we just wrote.
        out.pop(ROCR, None)
        return out
    hip, cuda = out.get(HIP), out.get(CUDA)
    if hip is not None and cuda is not None and hip != cuda:
        out[CUDA] = hip
    return out
