"""What a worker's vLLM accepts, as its own source says: method names, speculative-config fields, the schedule
field's name, attention backends. Read by ``tuner.workers.vllm_probe`` without importing vLLM or loading a
model; consulted by the search space and by whatever turns a configuration into ``vllm serve`` arguments.

What the source cannot say (whether a method really runs adaptive verification on a runner, which attention
backends work on gfx942 or gfx950) is not here: that is the versioned compatibility table's
(``tuner.search.compat``), the override for what is known to break.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tuner.domain.methods import Method

# The per-batch-size depth schedule's field, newest name first: vLLM 0.32-0.34 take
# ``num_speculative_tokens_per_batch_size``; vllm-project/vllm#48944 (open) proposes
# ``speculative_token_schedule`` and keeps the old name as an alias (docs/vllm-facts.md, "Newer vLLM").
SCHEDULE_FIELDS: tuple[str, ...] = ("speculative_token_schedule", "num_speculative_tokens_per_batch_size")
LEGACY_SCHEDULE_FIELD = "num_speculative_tokens_per_batch_size"
ADAPTIVE_FIELD = "enable_adaptive_verification"


@dataclass(frozen=True)
class VllmCapabilities:
    """One vLLM installation's speculative-decoding surface.

    ``methods`` are every name ``SpeculativeConfig.method`` accepts (ours and any we do not know, such as
    ``extract_hidden_states`` or the model-specific ``*_mtp`` aliases); ``spec_fields`` the config's fields;
    ``suffix_ready`` False when suffix decoding needs a package that is not installed (None: unknown).
    """

    version: str | None
    methods: tuple[str, ...]  # sorted
    spec_fields: tuple[str, ...]  # sorted
    attention_backends: tuple[str, ...] = ()
    rejection_sample_methods: tuple[str, ...] = ()
    suffix_ready: bool | None = None
    suffix_note: str | None = None
    source: str = ""  # where it was read: the probed directory, or "reported by worker X"
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(sorted(set(self.methods))))
        object.__setattr__(self, "spec_fields", tuple(sorted(set(self.spec_fields))))
        object.__setattr__(self, "attention_backends", tuple(self.attention_backends))
        object.__setattr__(self, "rejection_sample_methods", tuple(self.rejection_sample_methods))
        object.__setattr__(self, "notes", tuple(self.notes))

    @property
    def schedule_field(self) -> str | None:
        """The field this vLLM takes the per-batch-size schedule under (the newest it knows), None if none."""
        return next((f for f in SCHEDULE_FIELDS if f in self.spec_fields), None)

    @property
    def adaptive_verification(self) -> bool:
        """The config has ``enable_adaptive_verification`` (which methods may use it is the compat table's)."""
        return ADAPTIVE_FIELD in self.spec_fields

    @property
    def drafter_attention_backend(self) -> bool:
        """The drafter's backend can be set apart from the target's (``speculative_config.attention_backend``)."""
        return "attention_backend" in self.spec_fields

    @property
    def unknown_methods(self) -> tuple[str, ...]:
        """Names this vLLM accepts that our method table does not know: reported, never searched."""
        known = {m.value for m in Method}
        return tuple(m for m in self.methods if m not in known)

    def refusal(self, method: Method) -> str | None:
        """Why this vLLM cannot be asked for ``method``; None when it can (``off`` always can)."""
        if method is Method.OFF:
            return None
        where = f"vLLM {self.version}" if self.version else "the worker's vLLM"
        if method.value not in self.methods:
            return f"{where} does not accept method {method.value!r} (read from its speculative config)"
        if method is Method.SUFFIX and self.suffix_ready is False:
            return self.suffix_note or f"{where} needs a package for suffix decoding that is not installed"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "methods": list(self.methods),
            "spec_fields": list(self.spec_fields),
            "attention_backends": list(self.attention_backends),
            "rejection_sample_methods": list(self.rejection_sample_methods),
            "suffix_ready": self.suffix_ready,
            "suffix_note": self.suffix_note,
            "source": self.source,
            "notes": list(self.notes),
            # derived, for people and dashboards reading a worker's report
            "schedule_field": self.schedule_field,
            "adaptive_verification": self.adaptive_verification,
            "unknown_methods": list(self.unknown_methods),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VllmCapabilities:
        return cls(
            version=data.get("version"),
            methods=tuple(data.get("methods") or ()),
            spec_fields=tuple(data.get("spec_fields") or ()),
            attention_backends=tuple(data.get("attention_backends") or ()),
            rejection_sample_methods=tuple(data.get("rejection_sample_methods") or ()),
            suffix_ready=data.get("suffix_ready"),
            suffix_note=data.get("suffix_note"),
            source=str(data.get("source") or ""),
            notes=tuple(data.get("notes") or ()),
        )
