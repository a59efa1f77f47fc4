"""Default load levels for the library's ``tune``: the one rule of ``tuner.load_levels``, from a sample."""

from __future__ import annotations

from collections.abc import Sequence

from tuner.domain import LoadLevel, TrafficRequest
from tuner.load_levels import DEFAULT_CONCURRENCIES
from tuner.load_levels import default_levels as _default_levels


def default_levels(
    requests: Sequence[TrafficRequest],
    concurrencies: Sequence[int] = DEFAULT_CONCURRENCIES,
    *,
    max_num_seqs: int | None = None,
) -> list[LoadLevel]:
    """Closed-loop levels 1, 8, 32, 128 (those the sample can fill) and ``max_num_seqs`` above them; see
    ``tuner.load_levels`` for the rule the API applies too."""
    return list(_default_levels(len(requests), concurrencies=tuple(concurrencies), max_num_seqs=max_num_seqs))
