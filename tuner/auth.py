"""API tokens: random secrets shown once, stored as SHA-256 hashes, each with scopes (tune, read)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner.errors import InvalidInput
from tuner.store.models import ApiTokenRow

TOKEN_PREFIX = "stk_"


class Scope(StrEnum):
    TUNE = "tune"  # writes: POST /tune, POST /traffic, cancel, delete
    READ = "read"  # reads: jobs, trials, recommendations


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(session: Session, name: str, scopes: Sequence[str]) -> str:
    """Create a token and return its secret (the only time it is visible)."""
    try:
        parsed = sorted({Scope(s).value for s in scopes})
    except ValueError:
        raise InvalidInput(f"scopes must be among {[s.value for s in Scope]}", errors=[{"field": "scope"}]) from None
    if not parsed:
        raise InvalidInput("a token needs at least one scope", errors=[{"field": "scope"}])
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(ApiTokenRow(name=name, token_hash=hash_token(secret), scopes=parsed))
    session.flush()
    return secret


def token_scopes(session: Session, secret: str) -> set[str] | None:
    row = session.scalars(select(ApiTokenRow).where(ApiTokenRow.token_hash == hash_token(secret))).first()
    if row is None or row.revoked_at is not None:
        return None
    return set(row.scopes)


def revoke_token(session: Session, name: str) -> int:
    rows = session.scalars(select(ApiTokenRow).where(ApiTokenRow.name == name, ApiTokenRow.revoked_at.is_(None))).all()
    for row in rows:
        row.revoked_at = datetime.now(UTC)
    return len(rows)
