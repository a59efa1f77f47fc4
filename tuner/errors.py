"""Typed errors of the use-case layer; tuner/api/errors.py renders them as problem+json."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class TunerError(Exception):
    status_code = 400

    def __init__(self, detail: str, *, errors: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = list(errors)


class InvalidInput(TunerError):
    status_code = 422


class NotFound(TunerError):
    status_code = 404


class Conflict(TunerError):
    status_code = 409


class PayloadTooLarge(TunerError):
    status_code = 413


class Unauthorized(TunerError):
    status_code = 401


class Forbidden(TunerError):
    status_code = 403
