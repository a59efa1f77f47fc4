"""Timing formulas on recorded streams with known answers."""

from __future__ import annotations

import pytest

from tuner.domain import SLO, LoadLevel
from tuner.workers.timing import Chunk, RequestRecord, e2e_s, itl_s, meets_slo, summarize, tpot_s, ttft_s


def rec(start: float, chunks: list[tuple[float, int]], end: float, usage: int | None = None, **kw) -> RequestRecord:
    return RequestRecord(0, start, end, tuple(Chunk(t, n) for t, n in chunks), usage, **kw)


# Sent at 10.0; first token at 10.1; then one token at 10.12, a 3-token chunk at 10.18, one at 10.2; done 10.21.
SPEC_STREAM = rec(10.0, [(10.1, 1), (10.12, 1), (10.18, 3), (10.2, 1)], 10.21, usage=6)


def test_ttft_is_the_first_token_carrying_chunk() -> None:
    r = rec(0.0, [(0.05, 0), (0.2, 1), (0.3, 1)], 0.3, usage=2)
    assert ttft_s(r) == pytest.approx(0.2)


def test_itl_is_per_token_a_multi_token_chunk_splits_its_gap() -> None:
    assert itl_s(SPEC_STREAM) == pytest.approx([0.02, 0.02, 0.02, 0.02, 0.02])
    # len(ITL) == output tokens - 1, and the samples sum to the decode time.
    assert len(itl_s(SPEC_STREAM)) == 5
    assert sum(itl_s(SPEC_STREAM)) == pytest.approx(10.2 - 10.1)


def test_itl_differs_from_per_chunk_itl() -> None:
    r = rec(0.0, [(0.1, 1), (0.13, 3)], 0.13, usage=4)
    assert itl_s(r) == pytest.approx([0.01, 0.01, 0.01])  # vllm bench would report one 30 ms sample


def test_tpot_uses_usage_output_tokens() -> None:
    assert tpot_s(SPEC_STREAM) == pytest.approx((0.21 - 0.1) / 5)
    assert e2e_s(SPEC_STREAM) == pytest.approx(0.21)
    assert tpot_s(rec(0.0, [(0.1, 1)], 0.1, usage=1)) is None


def test_output_tokens_fall_back_to_chunk_counts_without_usage() -> None:
    assert rec(0.0, [(0.1, 1), (0.2, 2)], 0.2).num_output_tokens == 3


def test_summarize_known_answers() -> None:
    # Four requests, each 11 tokens: TTFT 100/200/300/400 ms, one token every 10 ms afterwards.
    records = []
    for i in range(4):
        start = float(i)
        first = start + 0.1 * (i + 1)
        chunks = [(first, 1)] + [(first + 0.01 * k, 1) for k in range(1, 11)]
        records.append(RequestRecord(i, start, first + 0.1, tuple(Chunk(t, n) for t, n in chunks), 11))
    records.append(RequestRecord(4, 0.0, 0.5, error="HTTP 500: boom"))
    result = summarize(LoadLevel(num_requests=5), records, duration_s=4.0, slo=SLO(p99_ttft_ms=250))
    assert result.num_requests == 4 and result.errors == 1
    assert result.output_tokens == 44
    assert result.output_throughput == pytest.approx(11.0)
    assert result.request_throughput == pytest.approx(1.0)
    assert result.goodput == pytest.approx(0.5)  # TTFT 100 and 200 ms meet the 250 ms SLO
    assert result.ttft_ms.mean == pytest.approx(250.0)
    assert result.ttft_ms.p50 == pytest.approx(250.0)
    assert result.ttft_ms.p90 == pytest.approx(370.0)  # numpy-style interpolation: 300 + 0.7 * 100
    assert result.ttft_ms.p99 == pytest.approx(397.0)
    assert result.tpot_ms.mean == pytest.approx(10.0)
    assert result.itl_ms.p99 == pytest.approx(10.0)
    assert result.e2e_ms.mean == pytest.approx(350.0)


def test_goodput_without_slo_is_request_throughput() -> None:
    result = summarize(LoadLevel(), [SPEC_STREAM, SPEC_STREAM], duration_s=2.0, slo=SLO())
    assert result.goodput == result.request_throughput == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("slo", "good"),
    [
        (SLO(p99_tpot_ms=30), True),
        (SLO(p99_tpot_ms=20), False),  # TPOT is 22 ms
        (SLO(p99_itl_ms=20.5), True),  # per-token ITL is 20 ms
        (SLO(p99_e2e_ms=200), False),
    ],
)
def test_meets_slo(slo: SLO, good: bool) -> None:
    assert meets_slo(SPEC_STREAM, slo) is good


def test_failed_request_never_meets_slo() -> None:
    assert not meets_slo(RequestRecord(0, 0.0, 1.0, error="x"), SLO())
