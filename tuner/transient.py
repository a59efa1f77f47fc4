"""Transient database errors, told apart from real ones, and calls retried through them.

A PostgreSQL restart, a dropped connection, a serialization failure or SQLite's "database is locked" go away
on their own; a job must not fail for them. Everything else (a constraint, a bug) is raised at once.

A retried transaction must be idempotent: when the connection drops during COMMIT the outcome is unknown,
so the work is run again and has to find what the first attempt may have stored (the use cases in
``tuner.tuning`` are written that way: upserts by key, conditional updates, "already stored" is success).
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

log = logging.getLogger("tuner.db")
T = TypeVar("T")

# SQLSTATEs that a retry can outlive: connection exceptions (class 08), the server shutting down or starting
# (57P01-57P03), too many connections, serialization failures and deadlocks (PostgreSQL appendix A).
_TRANSIENT_STATES = {"57P01", "57P02", "57P03", "53300", "40001", "40P01"}
_SQLITE_BUSY = ("database is locked", "database is busy", "database table is locked")

DEFAULT_RETRY_S = 180.0  # long enough for a database restart or failover; then the error is raised


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        if isinstance(cur, DBAPIError) and cur.orig is not None:
            yield cur.orig
        cur = cur.__cause__ or cur.__context__


def is_transient(exc: BaseException) -> bool:
    """True for errors a later attempt can outlive (Optuna's StorageInternalError wrapping one included)."""
    for e in _chain(exc):
        if isinstance(e, DBAPIError) and e.connection_invalidated:
            return True
        state = getattr(e, "sqlstate", None)
        if isinstance(state, str) and (state.startswith("08") or state in _TRANSIENT_STATES):
            return True
        if isinstance(e, sqlite3.OperationalError) and any(m in str(e) for m in _SQLITE_BUSY):
            return True
        module = type(e).__module__
        # psycopg: a refused or reset connection is an OperationalError with no SQLSTATE (no server answered)
        if module.startswith("psycopg") and type(e).__name__ == "OperationalError" and state is None:
            return True
        if isinstance(e, OperationalError) and e.orig is None:
            return True
    return False


def backoff_delays(first_s: float = 0.1, cap_s: float = 5.0) -> Iterator[float]:
    """Exponential backoff with full jitter (so many waiting processes do not reconnect in step)."""
    delay = first_s
    while True:
        yield random.uniform(delay / 2, delay)
        delay = min(cap_s, delay * 2)


def retrying(
    fn: Callable[[], T],
    *,
    what: str,
    retry_s: float = DEFAULT_RETRY_S,
    stop: threading.Event | None = None,
) -> T:
    """Call ``fn`` until it returns or raises a non-transient error; transient errors for ``retry_s`` seconds.

    ``stop`` (set when the process shuts down) ends the waiting early: the last error is raised."""
    deadline = time.monotonic() + retry_s
    attempt = 0
    for delay in backoff_delays():
        attempt += 1
        try:
            return fn()
        except Exception as e:
            if not is_transient(e) or time.monotonic() + delay > deadline:
                raise
            # The message only: a statement's parameters can hold traffic (engines hide them, too).
            if attempt == 1 or attempt % 10 == 0:
                log.warning("%s: transient database error, retrying (attempt %d): %s", what, attempt, _brief(e))
            if stop is None:
                time.sleep(delay)
            elif stop.wait(delay):
                raise
    raise AssertionError("unreachable")


def _brief(exc: BaseException) -> str:
    """The root cause's first line (Optuna wraps a lost connection in a message about invalid data)."""
    root = list(_chain(exc))[-1]
    text = str(root).strip().splitlines()
    return text[0][:200] if text else type(root).__name__
