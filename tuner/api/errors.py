"""Every error the API returns is ``application/problem+json`` (RFC 9457), rendered here and nowhere else."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from tuner.errors import TunerError, Unauthorized
from tuner.transient import is_transient

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
    503: "Service unavailable",
}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class Problem(BaseModel):
    """An error, as every route returns it (RFC 9457 ``application/problem+json``)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[dict[str, Any]] | None = Field(default=None, description="Each field or line at fault.")
    correlation_id: str | None = Field(default=None, description="The key to the operator's log line (5xx).")


def _responses(statuses: set[int]) -> dict[int | str, dict[str, Any]]:
    content = {PROBLEM: {"schema": {"$ref": "#/components/schemas/Problem"}}}
    return {
        code: {"model": Problem, "description": _TITLES.get(code, "Error"), "content": content}
        for code in sorted(statuses)
    }


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these statuses, plus what any route can answer (401/403 from the token, 413
    from the size limit, 422 from validation, 500/503 from the store), all problem+json."""
    return _responses({401, 403, 413, 422, 500, 503} | set(statuses))


PUBLIC_RESPONSES = _responses({500, 503})  # a public route: only the store can fail it


def problem(
    status: int,
    detail: str,
    *,
    instance: str | None = None,
    errors: Sequence[Mapping[str, Any]] = (),
    headers: Mapping[str, str] | None = None,
    correlation_id: str | None = None,
) -> JSONResponse:
    body = Problem(
        title=_TITLES.get(status, "Error"),
        status=status,
        detail=detail,
        instance=instance or None,
        errors=[dict(e) for e in errors] or None,
        correlation_id=correlation_id or None,
    ).model_dump(exclude_none=True)
    return JSONResponse(body, status_code=status, media_type=PROBLEM, headers=dict(headers or {}))


def correlation_id(request: Request) -> str:
    """The client's ``X-Request-ID`` when it is a plain token, else a new one: the key to the log line."""
    given = request.headers.get("x-request-id", "")
    return given if _REQUEST_ID.match(given) else uuid.uuid4().hex


def _field(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc]
    return ".".join(parts[1:] if parts and parts[0] in {"body", "query", "path", "header"} else parts) or "body"


def _allowed(request: Request) -> str:
    """Every method the path takes. Starlette's 405 names only the first route matching the path, and a path
    served by several routes (GET and DELETE /traffic/{id}) would advertise one of them (RFC 9110 15.5.6)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)  # PARTIAL: the path matches, the method does not
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


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
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed(request)
        return problem(
            exc.status_code,
            str(exc.detail),
            instance=request.url.path,
            headers=headers,
            errors=getattr(exc, "errors", ()),
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # Logged with its traceback for operators (engines hide statement parameters, so no traffic content
        # reaches the log); the client gets a message and the correlation id, never SQL or a stack trace.
        # Nothing was stored: the request's transaction was rolled back, or its commit failed.
        cid = correlation_id(request)
        headers = {"X-Request-ID": cid}
        if is_transient(exc):
            log.error(
                "database unavailable on %s %s [%s]: %s", request.method, request.url.path, cid, exc, exc_info=exc
            )
            return problem(
                503,
                f"the database is unavailable; the request may not be stored, retry it (correlation id {cid})",
                instance=request.url.path,
                headers={**headers, "Retry-After": "5"},
                correlation_id=cid,
            )
        log.error("internal error on %s %s [%s]", request.method, request.url.path, cid, exc_info=exc)
        return problem(
            500,
            f"internal server error; nothing was stored, the operator's log has the details (correlation id {cid})",
            instance=request.url.path,
            headers=headers,
            correlation_id=cid,
        )
