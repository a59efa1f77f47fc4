"""Typed dependencies: the request's session (the one place the API commits) and scope checks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from tuner.auth import Scope, token_scopes
from tuner.errors import Forbidden, Unauthorized
from tuner.settings import AuthMode, Settings
from tuner.store.db import transaction


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


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


def require(scope: Scope) -> Callable[..., None]:
    def check(request: Request, settings: SettingsDep) -> None:
        if settings.auth is AuthMode.OPEN:
            return
        header = request.headers.get("authorization", "")
        kind, _, secret = header.partition(" ")
        if kind.lower() != "bearer" or not secret.strip():
            raise Unauthorized("a bearer token is required (Authorization: Bearer <token>)")
        with request.app.state.session_factory() as session:
            scopes = token_scopes(session, secret.strip())
        if scopes is None:
            raise Unauthorized("the bearer token is unknown or revoked")
        if scope.value not in scopes:
            raise Forbidden(f"this token lacks the '{scope.value}' scope")

    return check


CanTune = Depends(require(Scope.TUNE))
CanRead = Depends(require(Scope.READ))
