"""The JSON round trip of the domain's frozen dataclasses, by pydantic (``TypeAdapter`` and
``to_jsonable_python``) rather than by hand: the store, the API and the worker CLIs all go through it."""

from __future__ import annotations

import hashlib
import json
from typing import Any, TypeVar

from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

T = TypeVar("T")


def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums, tuples and mappings as plain JSON values (dicts, lists, strings, numbers)."""
    return to_jsonable_python(value)


def from_jsonable(cls: type[T], data: Any) -> T:
    """Rebuild a domain record from :func:`to_jsonable` output (nested records, tuples, enums); keys the
    record does not have are ignored and missing ones take their defaults. ``None`` stays None."""
    if data is None:
        return None  # type: ignore[return-value]  # callers pass optional columns straight through
    return _adapter(cls).validate_python(data)


# Building an adapter compiles a validator for the whole record tree: once per class per process. A dict
# rather than functools.cache, whose wrapper drops the type variable (a race only builds one twice).
_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(cls: type[T]) -> TypeAdapter[T]:
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces: the same value always gives the same text (keys and fingerprints)."""
    return json.dumps(to_jsonable(value), sort_keys=True, separators=(",", ":"))


def fingerprint(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()
