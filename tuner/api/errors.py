"""Every error the API returns is ``application/problem+json`` (RFC 9457), rendered here and nowhere else."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuner.errors import TunerError, Unauthorized

log = logging.getLogger("tuner.api")
PROBLEM = "application/problem+json"
_TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Payload too large",
    415: "Unsupported media type",
    422: "Invalid input",
    500: "Internal server error",
}


def problem(
    status: int,
    detail: str,
    *,
    instance: str | None = None,
    errors: Sequence[Mapping[str, Any]] = (),
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": _TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    if errors:
        body["errors"] = list(errors)
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=dict(headers or {}))


def _field(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc]
    return ".".join(parts[1:] if parts and parts[0] in {"body", "query", "path", "header"} else parts) or "body"


def install(app: FastAPI) -> None:
    @app.exception_handler(TunerError)
    async def _tuner_error(request: Request, exc: TunerError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
        return problem(exc.status_code, exc.detail, instance=request.url.path, errors=exc.errors, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {
                "field": _field(e.get("loc", ())),
                "location": str((e.get("loc") or ["body"])[0]),
                "message": e.get("msg", ""),
                "type": e.get("type", ""),
            }
            for e in exc.errors()
        ]
        fields = ", ".join(sorted({e["field"] for e in errors}))
        return problem(422, f"invalid request: {fields}", instance=request.url.path, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail), instance=request.url.path, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # Logged with its traceback for operators; the client gets a problem document, never a stack trace.
        log.exception("internal error on %s %s", request.method, request.url.path)
        return problem(500, "internal server error; the operator's log has the details", instance=request.url.path)
