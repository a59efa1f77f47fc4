"""API tokens and who they speak for: random secrets shown once, stored as SHA-256 hashes, each with scopes
(tune, read, admin) and a team.

Teams share knowledge, not work: every team reads every recommendation; a team reads its own jobs, trials and
samples, and only the owning team (with the tune scope) or an admin token cancels or deletes them.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner.errors import InvalidInput
from tuner.store.models import DEFAULT_TEAM, ApiTokenRow

TOKEN_PREFIX = "stk_"
TEAM_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,99}$")


class Scope(StrEnum):
    TUNE = "tune"  # writes: POST /tune, POST /traffic, cancel and delete the team's own
    READ = "read"  # reads: the team's jobs, trials and samples; every team's recommendations
    ADMIN = "admin"  # every team's jobs and samples, to read, cancel or delete


@dataclass(frozen=True)
class Principal:
    """Who a request speaks for."""

    name: str
    team: str
    scopes: frozenset[str]

    @property
    def admin(self) -> bool:
        return Scope.ADMIN.value in self.scopes

    def allows(self, scope: Scope) -> bool:
        return self.admin or scope.value in self.scopes

    @property
    def team_filter(self) -> str | None:
        """The team whose rows this principal may see and change; None for every team (admin)."""
        return None if self.admin else self.team


# TUNER_AUTH=open: one local user who may do everything, working in the default team
OPEN = Principal(name="open", team=DEFAULT_TEAM, scopes=frozenset(s.value for s in Scope))


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def team_problem(team: str) -> str | None:
    if not TEAM_PATTERN.match(team):
        return "a team is 1-100 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit"
    return None


def create_token(session: Session, name: str, scopes: Sequence[str], *, team: str = DEFAULT_TEAM) -> str:
    """Create a token and return its secret (the only time it is visible)."""
    try:
        parsed = sorted({Scope(s).value for s in scopes})
    except ValueError:
        raise InvalidInput(f"scopes must be among {[s.value for s in Scope]}", errors=[{"field": "scope"}]) from None
    if not parsed:
        raise InvalidInput("a token needs at least one scope", errors=[{"field": "scope"}])
    if (problem := team_problem(team)) is not None:
        raise InvalidInput(problem, errors=[{"field": "team"}])
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiTokenRow(name=name, team=team, token_hash=hash_token(secret), scopes=parsed))
    session.flush()
    return secret


def principal_for(session: Session, secret: str) -> Principal | None:
    """The live token's principal, or None for an unknown or revoked secret."""
    row = session.scalars(select(ApiTokenRow).where(ApiTokenRow.token_hash == hash_token(secret))).first()
    if row is None or row.revoked_at is not None:
        return None
    return Principal(name=row.name, team=row.team, scopes=frozenset(row.scopes))


def revoke_token(session: Session, name: str) -> int:
    rows = session.scalars(select(ApiTokenRow).where(ApiTokenRow.name == name, ApiTokenRow.revoked_at.is_(None))).all()
    for row in rows:
        row.revoked_at = datetime.now(UTC)
    return len(rows)
