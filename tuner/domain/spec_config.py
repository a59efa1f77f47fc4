"""What a trial runs: one speculative-decoding configuration, as vLLM's ``--speculative-config`` takes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.domain.capabilities import ADAPTIVE_FIELD, LEGACY_SCHEDULE_FIELD, SCHEDULE_FIELDS
from tuner.domain.codec import canonical_json
from tuner.domain.methods import Method


@dataclass(frozen=True)
class SpecConfig:
    """One speculative-decoding configuration, convertible exactly to vLLM's ``--speculative-config``.

    ``schedule`` is vLLM's ``num_speculative_tokens_per_batch_size``: inclusive ``(start_bs, end_bs, K)``
    ranges starting at 1, K >= 0 and <= ``num_speculative_tokens``. ``extra`` carries any further
    speculative-config fields verbatim (``attention_backend``, ``suffix_decoding_*``, ...).
    """

    method: Method = Method.OFF
    num_speculative_tokens: int = 0
    model: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    schedule: tuple[tuple[int, int, int], ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    # the target's ``--attention-backend`` for this trial (None: the job's serving args, else vLLM's choice)
    target_backend: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", Method(self.method))
        if self.schedule is not None:
            object.__setattr__(self, "schedule", tuple(tuple(int(x) for x in r) for r in self.schedule))
        object.__setattr__(self, "extra", dict(self.extra))

    @property
    def is_off(self) -> bool:
        return self.method is Method.OFF

    @property
    def adaptive(self) -> bool:
        """vLLM sizes the verification budget per request at run time (``enable_adaptive_verification``)."""
        return bool(self.extra.get(ADAPTIVE_FIELD))

    @property
    def drafter_backend(self) -> str | None:
        """The drafter's attention backend (``speculative_config.attention_backend``); None: vLLM's choice."""
        value = self.extra.get("attention_backend")
        return str(value) if value else None

    def serve_env(self) -> dict[str, str]:
        """Environment this configuration needs on top of the job's: AITER backends run only with
        ``VLLM_ROCM_USE_AITER=1`` (which also switches other ROCm kernels to AITER: set it in the job's
        serving env to keep the target's kernels the same across arms)."""
        backends = (self.drafter_backend or "", self.target_backend or "")
        return {"VLLM_ROCM_USE_AITER": "1"} if any(b.startswith("ROCM_AITER") for b in backends) else {}

    @property
    def arm(self) -> str:
        """The drafter this configuration uses, whatever its depth: ``method`` or ``method@draft``, with
        ``+adaptive`` under adaptive verification and ``~BACKEND`` on a chosen drafter attention backend
        (arms of their own: their cost and acceptance differ)."""
        return arm_key(
            self.method, self.model, adaptive=self.adaptive, backend=self.drafter_backend, target=self.target_backend
        )

    def to_vllm(self, schedule_field: str = LEGACY_SCHEDULE_FIELD) -> dict[str, Any] | None:
        """The dict vLLM's ``--speculative-config`` takes, or None for no speculation; the schedule under
        ``schedule_field``, the name the vLLM at hand takes it by (``VllmCapabilities.schedule_field``). Keys,
        records and recommendations use the name vLLM 0.32-0.34 take."""
        if self.is_off:
            return None
        out: dict[str, Any] = {"method": self.method.value, "num_speculative_tokens": self.num_speculative_tokens}
        if self.model is not None:
            out["model"] = self.model
        if self.prompt_lookup_min is not None:
            out["prompt_lookup_min"] = self.prompt_lookup_min
        if self.prompt_lookup_max is not None:
            out["prompt_lookup_max"] = self.prompt_lookup_max
        if self.schedule is not None:
            out[schedule_field] = [list(r) for r in self.schedule]
        out.update(self.extra)
        return out

    @classmethod
    def from_vllm(cls, config: Mapping[str, Any] | None) -> SpecConfig:
        if not config:
            return cls()
        data = dict(config)
        known = {
            "method": Method(data.pop("method", "draft_model" if data.get("model") else "ngram")),
            "num_speculative_tokens": int(data.pop("num_speculative_tokens", 0)),
            "model": data.pop("model", None),
            "prompt_lookup_min": data.pop("prompt_lookup_min", None),
            "prompt_lookup_max": data.pop("prompt_lookup_max", None),
        }
        schedules = [data.pop(name) for name in SCHEDULE_FIELDS if name in data]
        known["schedule"] = schedules[0] if schedules else None
        return cls(**known, extra=data)

    def k_at(self, batch_size: int) -> int:
        """The depth vLLM uses at this number of scheduled requests (gaps and tail carry the previous K)."""
        if self.is_off:
            return 0
        if not self.schedule:
            return self.num_speculative_tokens
        k = self.num_speculative_tokens
        for start, _end, kk in sorted(self.schedule):
            if batch_size >= start:
                k = kk
        return min(k, self.num_speculative_tokens)

    def label(self) -> str:
        if self.is_off:
            return "off"
        parts = [f"{self.method.value} k={self.num_speculative_tokens}"]
        if self.model:
            parts.append(f"draft={self.model}")
        if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
            parts.append(f"lookup={self.prompt_lookup_min}-{self.prompt_lookup_max}")
        if self.schedule:
            parts.append("schedule=" + ",".join(f"{a}-{b}:{k}" for a, b, k in self.schedule))
        if self.adaptive:
            parts.append("adaptive")
        if self.drafter_backend:
            parts.append(f"drafter_attn={self.drafter_backend}")
        if self.target_backend:
            parts.append(f"target_attn={self.target_backend}")
        return " ".join(parts)

    def key(self) -> str:
        """The configuration's identity: its speculative config, and the target's backend when it sets one."""
        if self.target_backend:
            return canonical_json({"attention_backend": self.target_backend, "speculative_config": self.to_vllm()})
        return canonical_json(self.to_vllm())


def arm_key(
    method: Method,
    draft: str | None,
    *,
    adaptive: bool = False,
    backend: str | None = None,
    target: str | None = None,
) -> str:
    """One arm per drafter: the method alone, or ``method@draft`` for a method that loads a checkpoint;
    ``+adaptive`` when vLLM's adaptive verification is on, ``~BACKEND`` for the drafter's attention backend,
    ``^BACKEND`` for the target's."""
    key = method.value if draft is None else f"{method.value}@{draft}"
    key = f"{key}+adaptive" if adaptive else key
    key = f"{key}~{backend}" if backend else key
    return f"{key}^{target}" if target else key
