"""Latency figures computed from recorded streams: pure functions, no clocks, no I/O.

Definitions (all times from one monotonic clock, reported in milliseconds):

- TTFT: first chunk that carries a token minus the send time.
- ITL, per token: under speculative decoding one SSE chunk can carry several tokens. A chunk carrying
  ``n`` tokens that arrives ``g`` after the previous token-carrying chunk contributes ``n`` samples of
  ``g / n``; the first chunk's tokens are part of TTFT and contribute none. So ``sum(ITL)`` is the decode
  time and ``len(ITL)`` the tokens after the first chunk, and mean ITL ~= TPOT. This differs from
  ``vllm bench serve``, whose ITL is one sample per chunk (a 3-token chunk after 30 ms is one 30 ms
  sample there, three 10 ms samples here), which makes its ITL percentiles grow with acceptance length.
- TPOT: ``(e2e - TTFT) / (output_tokens - 1)``, output tokens from the usage chunk (as vllm bench).
- e2e: end of the stream minus the send time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.domain import SLO, LatencyStats, LevelResult, LoadKind, LoadLevel, percentile


@dataclass(frozen=True)
class Chunk:
    """One SSE event: its arrival time (s) and how many output tokens it carried."""

    t: float
    tokens: int


@dataclass(frozen=True)
class RequestRecord:
    """One replayed request as observed by the client."""

    index: int  # position in the traffic sample
    start: float
    end: float
    chunks: tuple[Chunk, ...] = ()
    output_tokens: int | None = None  # from usage; None when the server sent no usage
    error: str | None = None
    token_ids: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def num_output_tokens(self) -> int:
        if self.output_tokens is not None:
            return self.output_tokens
        return sum(c.tokens for c in self.chunks)


def _token_chunks(rec: RequestRecord) -> list[Chunk]:
    return [c for c in rec.chunks if c.tokens > 0]


def ttft_s(rec: RequestRecord) -> float | None:
    chunks = _token_chunks(rec)
    return chunks[0].t - rec.start if chunks else None


def e2e_s(rec: RequestRecord) -> float:
    return rec.end - rec.start


def itl_s(rec: RequestRecord) -> list[float]:
    """Per-token inter-token latencies (see the module docstring)."""
    chunks = _token_chunks(rec)
    out: list[float] = []
    for prev, cur in zip(chunks, chunks[1:], strict=False):
        gap = (cur.t - prev.t) / cur.tokens
        out.extend([gap] * cur.tokens)
    return out


def tpot_s(rec: RequestRecord) -> float | None:
    ttft = ttft_s(rec)
    n = rec.num_output_tokens
    if ttft is None or n < 2:
        return None
    return (e2e_s(rec) - ttft) / (n - 1)


def meets_slo(rec: RequestRecord, slo: SLO) -> bool:
    """A request is good when each of its own figures is within the SLO (ITL: its p99 per-token ITL)."""
    if not rec.ok:
        return False
    checks: list[tuple[float | None, float | None]] = [
        (slo.p99_ttft_ms, ttft_s(rec)),
        (slo.p99_tpot_ms, tpot_s(rec)),
        (slo.p99_e2e_ms, e2e_s(rec)),
    ]
    itl = itl_s(rec)
    checks.append((slo.p99_itl_ms, percentile(itl, 99) if itl else None))
    for limit_ms, value_s in checks:
        if limit_ms is not None and value_s is not None and value_s * 1000.0 > limit_ms:
            return False
    return True


def _ms(values: Sequence[float]) -> LatencyStats:
    return LatencyStats.of([v * 1000.0 for v in values])


def steady_window(level: LoadLevel, records: Sequence[RequestRecord]) -> tuple[float, float] | None:
    """Closed loop: (when the ``concurrency``-th request was sent, when the last one was sent). In between,
    every finished request is replaced at once, so the target concurrency is in flight; before it is ramp-up,
    after it drain. None for open-loop levels, or when fewer requests than the concurrency were sent."""
    if level.kind is not LoadKind.CONCURRENCY:
        return None
    c = max(1, int(level.value))
    starts = sorted(r.start for r in records)
    if len(starts) <= c:
        return None
    begin, end = starts[c - 1], starts[-1]
    return (begin, end) if end > begin else None


def _steady(level: LoadLevel, records: Sequence[RequestRecord], duration_s: float) -> tuple[float | None, float | None]:
    window = steady_window(level, records)
    if window is None or duration_s <= 0:
        return None, None
    begin, end = window
    tokens = sum(c.tokens for r in records if r.ok for c in r.chunks if begin <= c.t <= end)
    return (end - begin) / duration_s, tokens / (end - begin)


def summarize(level: LoadLevel, records: Sequence[RequestRecord], duration_s: float, slo: SLO) -> LevelResult:
    """Aggregate one measured window. Rates divide by ``duration_s``; failed requests count as errors only.

    Without SLOs, goodput equals the successful request throughput.
    """
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.num_output_tokens for r in ok)
    per = duration_s if duration_s > 0 else float("inf")
    ttfts = [v for v in map(ttft_s, ok) if v is not None]
    tpots = [v for v in map(tpot_s, ok) if v is not None]
    itls = [v for r in ok for v in itl_s(r)]
    steady_share, steady_throughput = _steady(level, records, duration_s)
    return LevelResult(
        level=level,
        num_requests=len(ok),
        errors=len(records) - len(ok),
        duration_s=duration_s,
        output_tokens=out_tokens,
        output_throughput=out_tokens / per,
        request_throughput=len(ok) / per,
        goodput=sum(meets_slo(r, slo) for r in ok) / per,
        ttft_ms=_ms(ttfts),
        tpot_ms=_ms(tpots),
        itl_ms=_ms(itls),
        e2e_ms=_ms([e2e_s(r) for r in ok]),
        client_concurrency=sum(e2e_s(r) for r in records) / duration_s if duration_s > 0 else None,
        steady_share=steady_share,
        steady_output_throughput=steady_throughput,
    )
