"""Typed dependencies: the request's session (the one place the API commits) and who the request speaks for."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from tuner.auth import Principal, Scope
from tuner.errors import Forbidden, Unauthorized
from tuner.settings import Settings
from tuner.store.db import transaction

# Declares the bearer scheme in the OpenAPI schema; the token itself was checked by the Authenticate middleware
# (tuner/api/authenticate.py) before the body was read.
_bearer = HTTPBearer(auto_error=False, description="An API token: `tuner token create NAME --scope ...`")


# Dependencies that do no I/O are async: FastAPI runs a sync dependency in the thread pool, a hop per request.
async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings  # set by create_app
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """Commit when the route returns, roll back when it raises: routes and services never commit.

    Declared with ``scope="function"`` (below): FastAPI then runs this exit, the commit, after the route
    returns and before the response is sent, and a failing commit reaches the error handlers (503/500). With
    the default scope the exit runs after the response went out, so a client could see a 2xx for a write that
    was never stored (and its next request a 404).
    """
    with transaction(request.app.state.session_factory) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def require(scope: Scope) -> Callable[..., Awaitable[Principal]]:
    async def check(request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
        principal: Principal | None = getattr(request.state, "principal", None)
        if principal is None:  # only a public path reaches a route unauthenticated; none of them requires a scope
            raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        if not principal.allows(scope):
            raise Forbidden(f"this token lacks the '{scope.value}' scope")
        return principal

    return check


Reader = Annotated[Principal, Depends(require(Scope.READ))]
Writer = Annotated[Principal, Depends(require(Scope.TUNE))]
