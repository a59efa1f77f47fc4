"""JSON from outside: one parser for every body and sample, with limits checked before anything is stored.

Python's ``json`` accepts what our store cannot keep or our code cannot use: ``NaN``/``Infinity``, integers
of thousands of digits, nesting a thousand deep (a ``RecursionError`` later), and NUL characters, which
PostgreSQL refuses in text and JSON. orjson refuses non-finite numbers and nesting past 1024 at parse time,
and reads an integer beyond 64 bits as a double (what RFC 7493, I-JSON, tells senders to expect), so an
integer field then refuses it by its range. ``check`` walks the tree once for the rest and names the path of
the first problem, so the API can answer 422 with the field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

MAX_DEPTH = 32  # the deepest accepted shape (chat messages with content parts) needs 6
MAX_INT = 2**63 - 1  # what every store and the Python/SQL boundary hold exactly
MAX_KEY_CHARS = 200
SHOWN_STEPS = 6


class JsonInputError(ValueError):
    """A document we refuse; ``path`` locates the offending value (``("traffic", 3, "prompt")``)."""

    def __init__(self, message: str, path: Sequence[str | int] = (), *, line: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = tuple(path)
        self.line = line  # where a syntax error is, when the parser says

    @property
    def field(self) -> str:
        """The dotted path, cut after a few steps (the path to a too-deep value is itself deep)."""
        steps = [str(p) for p in self.path[:SHOWN_STEPS]] + (["..."] if len(self.path) > SHOWN_STEPS else [])
        return ".".join(steps) or "body"


def loads(data: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse and check one JSON document; raise JsonInputError (never RecursionError or OverflowError)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise JsonInputError(f"invalid JSON: {e.msg}", line=e.lineno) from None
    check(doc, max_depth=max_depth)
    return doc


def check(doc: Any, *, max_depth: int = MAX_DEPTH, path: Sequence[str | int] = ()) -> None:
    """Refuse nesting deeper than ``max_depth``, integers beyond 64 bits, non-finite floats, NUL in strings.

    Iterative, so a hostile depth costs no stack; every node is visited once.
    """
    stack: list[tuple[Any, tuple[str | int, ...], int]] = [(doc, tuple(path), 0)]
    while stack:
        value, where, depth = stack.pop()
        if isinstance(value, str):
            if "\x00" in value:
                raise JsonInputError("strings must not contain NUL characters", where)
        elif isinstance(value, bool) or value is None:
            continue
        elif isinstance(value, int):
            if not -MAX_INT - 1 <= value <= MAX_INT:
                raise JsonInputError("integers must fit in 64 bits", where)
        elif isinstance(value, float):
            # orjson parses integers beyond 64 bits as floats; a float is refused only when it is not finite
            if value != value or value in (float("inf"), float("-inf")):
                raise JsonInputError("numbers must be finite (no NaN or Infinity)", where)
        elif isinstance(value, dict | list):
            if depth >= max_depth:
                raise JsonInputError(f"nested deeper than {max_depth} levels", where)
            if isinstance(value, dict):
                for key, item in value.items():
                    if "\x00" in key or len(key) > MAX_KEY_CHARS:
                        raise JsonInputError(f"keys must be at most {MAX_KEY_CHARS} characters, no NUL", where)
                    stack.append((item, (*where, key), depth + 1))
            else:
                stack.extend((item, (*where, i), depth + 1) for i, item in enumerate(value))
