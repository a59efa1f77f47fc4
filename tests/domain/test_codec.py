"""Every domain record survives the JSON round trip the store, the API and the worker CLIs use.

The records are built from their own type hints with a non-default value in every field, so a field added
later is covered without editing this test."""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

import pytest

import tuner.domain as domain
from tuner.domain import SpecConfig, TrialResult, canonical_json, from_jsonable, to_jsonable


def _records() -> list[type]:
    out = []
    for name in domain.__all__:
        obj = getattr(domain, name)
        if isinstance(obj, type) and dataclasses.is_dataclass(obj):
            hints = typing.get_type_hints(obj)
            # TrialContext carries callables for a runner: a live object, never stored
            if not any(typing.get_origin(h) is Callable or h is Callable for h in hints.values()):
                out.append(obj)
    return out


def _value(tp: Any, depth: int = 0) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _value(next(a for a in args if a is not type(None)), depth)
    if tp is Any:
        return {"any": [1, "two"]}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return (_value(args[0], depth), _value(args[0], depth))
        return tuple(_value(a, depth) for a in args)
    if origin in (Mapping, dict, typing.Mapping):
        return {_value(args[0], depth): _value(args[1], depth)}
    if isinstance(tp, type) and issubclass(tp, StrEnum):
        return list(tp)[-1]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _build(tp, depth + 1)
    return {bool: True, int: 7, float: 2.5, str: "x-value"}[tp]


def _build(cls: type, depth: int = 0) -> Any:
    hints = typing.get_type_hints(cls)
    kwargs = {f.name: _value(hints[f.name], depth) for f in dataclasses.fields(cls) if f.init}
    return cls(**kwargs)


@pytest.mark.parametrize("cls", _records(), ids=lambda c: c.__name__)
def test_every_record_round_trips_through_json(cls: type) -> None:
    record = _build(cls)
    text = json.dumps(to_jsonable(record))
    assert from_jsonable(cls, json.loads(text)) == record
    assert canonical_json(from_jsonable(cls, json.loads(text))) == canonical_json(record)


def test_the_walk_covers_the_records_the_store_keeps() -> None:
    names = {c.__name__ for c in _records()}
    assert {"JobSpec", "TrialResult", "TrialSpec", "TuneOutcome", "Recommendation", "SpecConfig"} <= names


def test_unknown_keys_are_ignored_and_missing_ones_take_defaults() -> None:
    spec = from_jsonable(SpecConfig, {"method": "ngram", "num_speculative_tokens": 3, "later_field": 1})
    assert spec == SpecConfig(method="ngram", num_speculative_tokens=3)
    result = from_jsonable(TrialResult, {"status": "failed", "engine": "simulated"})
    assert result.simulated and result.levels == ()
    assert from_jsonable(SpecConfig, None) is None
