"""Hooks for the bounded schemathesis run (tests/api/test_schema_fuzz.py), loaded via SCHEMATHESIS_HOOKS."""

from __future__ import annotations

import re
import uuid
from typing import Any

import schemathesis

_VALID_KEY = re.compile(r"^[\x21-\x7e]{1,200}$")


@schemathesis.hook
def map_headers(context: schemathesis.HookContext, headers: dict[str, Any] | None) -> dict[str, Any] | None:
    """A fresh Idempotency-Key wherever a valid one was generated: generated keys repeat (hypothesis shrinks
    towards "0"), and a repeated key with another body is the documented 409, which would hide what the body
    itself does. Invalid keys are left as generated, to be refused."""
    if headers and isinstance(headers.get("Idempotency-Key"), str) and _VALID_KEY.match(headers["Idempotency-Key"]):
        headers["Idempotency-Key"] = uuid.uuid4().hex
    return headers
