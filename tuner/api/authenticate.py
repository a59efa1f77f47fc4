"""Authentication as ASGI middleware, so an unauthenticated request is answered before its body is read.

FastAPI reads and validates a body before any dependency runs: with the token checked in a dependency, an
anonymous 8 MiB POST /tune was parsed whole (181 MB of RSS) before its 401. Here the bearer token is resolved
from the headers alone; the principal goes to ``scope["state"]`` (``request.state.principal``), and the
routes' dependencies (tuner/api/deps.py) check scopes and teams.
"""

from __future__ import annotations

import time

from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from tuner.api.errors import problem
from tuner.auth import OPEN, Principal, hash_token, principal_for

MAX_CACHED = 10_000  # resolved tokens kept at most
# Paths anyone may call: liveness, Prometheus scraping, and the schema and its viewers.
PUBLIC_PATHS = frozenset({"/healthz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class Authenticate:
    """``cache_s``: how long a resolved token is trusted without asking the store again. A revoked token is
    refused at most this long after ``tuner token revoke``; 0 asks the store on every request."""

    def __init__(self, app: ASGIApp, *, open_mode: bool, cache_s: float = 0.0) -> None:
        self.app = app
        self.open_mode = open_mode
        self.cache_s = cache_s
        self._cache: dict[str, tuple[float, Principal]] = {}  # token hash -> (expiry, principal); live tokens only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if self.open_mode:
            state["principal"] = OPEN
            await self.app(scope, receive, send)
            return
        if scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
        kind, _, secret = header.partition(" ")
        if kind.lower() != "bearer" or not secret.strip():
            await self._refuse(scope, receive, send, "a bearer token is required (Authorization: Bearer <token>)")
            return
        # A failing lookup (the store is down) propagates to the app's one 5xx handler (tuner/api/errors.py),
        # which Starlette runs outside every middleware: 503 with Retry-After and a correlation id, as a route's.
        principal = await self._principal(scope, secret.strip())
        if principal is None:
            await self._refuse(scope, receive, send, "the bearer token is unknown or revoked")
            return
        state["principal"] = principal
        await self.app(scope, receive, send)

    async def _principal(self, scope: Scope, secret: str) -> Principal | None:
        key = hash_token(secret)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        principal = await run_in_threadpool(_lookup, scope["app"].state.session_factory, secret)
        if principal is not None and self.cache_s > 0:
            if len(self._cache) >= MAX_CACHED:  # bounded: expired entries go first, then everything
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                if len(self._cache) >= MAX_CACHED:
                    self._cache.clear()
            self._cache[key] = (now + self.cache_s, principal)
        return principal

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, detail: str) -> None:
        response = problem(401, detail, instance=scope["path"], headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


def _lookup(factory: sessionmaker[Session], secret: str) -> Principal | None:
    with factory() as session:
        return principal_for(session, secret)
