"""The built-in, extendable catalog of known public draft checkpoints.

Entries live in ``draft_catalog.json`` beside this module. Each carries the URL it was found at and a
``verified`` flag that stays false until a real run confirms the pairing. Extend it per call
(``DEFAULT_CATALOG.extended([...])``), from a file (``DraftCatalog.from_json(path)``), or with a PR to
the JSON file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from tuner.domain import Method

_DEFAULT_PATH = Path(__file__).with_name("draft_catalog.json")


@dataclass(frozen=True)
class DraftEntry:
    """One public draft checkpoint and the targets it is known to pair with."""

    method: Method
    checkpoint: str
    targets: tuple[str, ...]
    source: str
    family: str | None = None
    verified: bool = False
    notes: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", Method(self.method))
        object.__setattr__(self, "targets", tuple(t.lower() for t in self.targets))

    def matches(self, model: str) -> bool:
        name = model.lower().rstrip("/")
        names = {name, name.rsplit("/", 1)[-1]}
        return any(fnmatch(n, pattern) for n in names for pattern in self.targets)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DraftEntry:
        return cls(
            method=Method(data["method"]),
            checkpoint=data["checkpoint"],
            targets=tuple(data.get("targets", ())),
            source=data.get("source", ""),
            family=data.get("family"),
            verified=bool(data.get("verified", False)),
            notes=data.get("notes", ""),
        )


@dataclass(frozen=True)
class DraftCatalog:
    entries: tuple[DraftEntry, ...] = ()

    @classmethod
    def from_json(cls, path: str | Path) -> DraftCatalog:
        data = json.loads(Path(path).read_text())
        return cls(tuple(DraftEntry.from_dict(e) for e in data.get("entries", ())))

    def extended(self, entries: Iterable[DraftEntry | Mapping[str, Any]]) -> DraftCatalog:
        more = tuple(e if isinstance(e, DraftEntry) else DraftEntry.from_dict(e) for e in entries)
        return DraftCatalog(self.entries + more)

    def for_model(self, model: str, methods: Sequence[Method] | None = None) -> tuple[DraftEntry, ...]:
        """Entries whose target patterns match ``model`` (optionally only these methods)."""
        return tuple(e for e in self.entries if e.matches(model) and (methods is None or e.method in methods))


DEFAULT_CATALOG = DraftCatalog.from_json(_DEFAULT_PATH)
