"""Limits on what a request may carry: a body size limit for every route (413 problem+json), checked before a
body is parsed, and the JSON limits of ``tuner.json_input`` for every JSON body (422).

``POST /traffic`` streams and checks its own limit; this guards the JSON routes, whose bodies FastAPI reads
whole (inline traffic on ``POST /tune`` can be large).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tuner import json_input
from tuner.api.errors import problem


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if started:
                raise
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = problem(
            413, f"the request body is larger than the {self.max_bytes} byte limit", instance=scope.get("path")
        )
        await response(scope, receive, send)


class CheckedJsonRoute(APIRoute):
    """A route whose JSON body is parsed by ``tuner.json_input`` (orjson plus the nesting, integer, NaN and
    NUL limits) instead of Python's ``json``: a refused body is a 422 naming the field, never a 500 later.

    FastAPI calls ``request.json()`` for a JSON body (the documented way to change body handling is a custom
    route class with its own ``Request``); an ``HTTPException`` raised there passes through unchanged.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            return await handler(_CheckedRequest(request.scope, request.receive))

        return checked


class _CheckedRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json_input.loads(body)
            except json_input.JsonInputError as e:
                raise BodyRejected(e) from None
        return self._json


class BodyRejected(HTTPException):
    """A JSON body refused by ``json_input``, rendered as 422 problem+json with the field."""

    def __init__(self, error: json_input.JsonInputError) -> None:
        super().__init__(422, f"invalid request: {error.field}: {error.message}")
        self.errors = [{"field": error.field, "location": "body", "message": error.message, "type": "json_limits"}]
