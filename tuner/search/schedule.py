"""vLLM's ``num_speculative_tokens_per_batch_size`` from per-level depths.

Batch-size bounds come from the levels: level i covers ``(previous end, c_{i+1} // 2]`` (at least c_i,
below c_{i+1}); the first range starts at 1 and the last ends at ``max_num_seqs`` (1024 when the serving
config does not set it). Levels 1, 8, 32, 128 give [1,4], [5,16], [17,64], [65,1024]. Adjacent ranges with
the same K are merged; K = 0 (speculation off at that batch size) is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

DEFAULT_MAX_NUM_SEQS = 1024


def batch_ranges(concurrencies: Sequence[int], max_num_seqs: int | None = None) -> list[tuple[int, int]]:
    cs = sorted({max(1, int(c)) for c in concurrencies})
    top = max(max_num_seqs or DEFAULT_MAX_NUM_SEQS, cs[-1])
    ranges: list[tuple[int, int]] = []
    start = 1
    for i, c in enumerate(cs):
        if i + 1 < len(cs):
            nxt = cs[i + 1]
            end = min(nxt - 1, max(c, nxt // 2))
        else:
            end = top
        ranges.append((start, end))
        start = end + 1
    return ranges


def build_schedule(
    depth_by_concurrency: Mapping[int, int], max_num_seqs: int | None = None
) -> tuple[tuple[int, int, int], ...]:
    """Inclusive ``(start, end, K)`` ranges starting at 1, adjacent equal K merged."""
    cs = sorted(depth_by_concurrency)
    out: list[list[int]] = []
    for (start, end), c in zip(batch_ranges(cs, max_num_seqs), cs, strict=True):
        k = int(depth_by_concurrency[c])
        if out and out[-1][2] == k:
            out[-1][1] = end
        else:
            out.append([start, end, k])
    return tuple((a, b, k) for a, b, k in out)
