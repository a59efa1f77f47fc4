"""Engines and sessions. Created by whoever owns the process (the app's lifespan, the worker), never at import."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

from tuner.transient import DEFAULT_RETRY_S, retrying

T = TypeVar("T")


def make_engine(url: str) -> Engine:
    # hide_parameters: an error's text (logged, or kept with a job) never holds a statement's parameters,
    # which can be a traffic sample's prompts.
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, hide_parameters=True)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
            # WAL lets the API read while a runner writes; busy_timeout serialises concurrent writers.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=10, hide_parameters=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """The one place outside the API that commits: commit on success, roll back on error."""
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


def in_transaction(
    factory: sessionmaker[Session],
    work: Callable[[Session], T],
    *,
    what: str,
    retry_s: float = DEFAULT_RETRY_S,
    stop: threading.Event | None = None,
) -> T:
    """Run ``work(session)`` in its own transaction, retried as a whole (a fresh session each attempt)."""

    def once() -> T:
        with transaction(factory) as session:
            return work(session)

    return retrying(once, what=what, retry_s=retry_s, stop=stop)
