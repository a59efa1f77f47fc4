"""The default load levels of a job, one rule for both doors (the API's POST /tune and the library's tune).

Closed-loop levels 1, 8, 32, 128, and the production ``max_num_seqs`` when the job gives one above them:
the level where a speculation decision matters most is the batch the server will really run. A level needs
at least as many distinct requests as it keeps in flight, so levels above the sample size are dropped (c1 is
always kept). Each level replays several times its concurrency (``REQUESTS_PER_SLOT``), so that most of the
window is steady state (the target concurrency in flight), not ramp-up and drain; at least ``num_requests``.
"""

from __future__ import annotations

from tuner.domain import LoadKind, LoadLevel

DEFAULT_CONCURRENCIES: tuple[int, ...] = (1, 8, 32, 128)
REQUESTS_PER_SLOT = 4  # a window of 4c requests is about 3/4 steady state in a closed loop
DEFAULT_NUM_REQUESTS = 32
DEFAULT_WARMUP_REQUESTS = 2


def window_requests(concurrency: int, at_least: int = DEFAULT_NUM_REQUESTS) -> int:
    """Requests in a closed-loop window at ``concurrency``: ``REQUESTS_PER_SLOT`` per slot, at least ``at_least``."""
    return max(at_least, REQUESTS_PER_SLOT * int(concurrency))


def default_levels(
    request_count: int,
    *,
    num_requests: int = DEFAULT_NUM_REQUESTS,
    warmup_requests: int = DEFAULT_WARMUP_REQUESTS,
    max_num_seqs: int | None = None,
    concurrencies: tuple[int, ...] = DEFAULT_CONCURRENCIES,
) -> tuple[LoadLevel, ...]:
    wanted = set(concurrencies)
    if max_num_seqs and max_num_seqs > max(wanted):
        wanted.add(int(max_num_seqs))
    usable = sorted(c for c in wanted if c == 1 or c <= max(1, request_count))
    return tuple(
        LoadLevel(
            LoadKind.CONCURRENCY,
            float(c),
            num_requests=window_requests(c, num_requests),
            warmup_requests=min(warmup_requests, c),
        )
        for c in usable
    )
