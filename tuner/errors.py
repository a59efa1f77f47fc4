"""Typed errors of the use-case layer; tuner/api/errors.py renders them as problem+json."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class TunerError(Exception):
    status_code = 400
    title = "Bad request"

    def __init__(self, detail: str, *, errors: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = list(errors)


class InvalidInput(TunerError):
    status_code = 422
    title = "Invalid input"


class NotFound(TunerError):
    status_code = 404
    title = "Not found"


class Conflict(TunerError):
    status_code = 409
    title = "Conflict"


class PayloadTooLarge(TunerError):
    status_code = 413
    title = "Payload too large"


class Unauthorized(TunerError):
    status_code = 401
    title = "Unauthorized"


class Forbidden(TunerError):
    status_code = 403
    title = "Forbidden"
