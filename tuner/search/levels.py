"""Default load levels derived from a traffic sample."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.domain import LoadKind, LoadLevel, TrafficRequest

DEFAULT_CONCURRENCIES: tuple[int, ...] = (1, 8, 32, 128)


def default_levels(
    requests: Sequence[TrafficRequest], concurrencies: Sequence[int] = DEFAULT_CONCURRENCIES
) -> list[LoadLevel]:
    """Closed-loop levels 1, 8, 32, 128 (those the sample can fill), each measured over enough requests.

    A level needs at least as many requests as it keeps in flight, so levels above the sample size are
    dropped (c1 is always kept); each level replays ``max(8, 2 c)`` requests, capped at the sample size, after
    ``min(2, c)`` warm-up requests.
    """
    n = max(1, len(requests))
    return [
        LoadLevel(
            kind=LoadKind.CONCURRENCY,
            value=float(c),
            num_requests=min(n, max(8, 2 * c)),
            warmup_requests=min(2, c),
        )
        for c in sorted(set(concurrencies))
        if c == 1 or c <= n
    ]
