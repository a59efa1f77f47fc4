"""vLLM's Prometheus metrics: counters diffed over a window, gauges sampled during it.

Estimating decode steps (for ``SpecDecodeStats.decode_steps``): each request step emits one token plus the
drafts it accepted, and every request's first token comes from prefill, so over a window
``steps ~= generation_tokens - accepted_tokens - finished_requests``. It counts request-steps (a batched
step once per running request), which is also how vLLM counts drafts, so ``1 - drafts / steps`` is the
share of steps that proposed nothing (ngram/suffix with no match). Requests straddling the window edges,
preempted requests, and drafts accepted past ``max_tokens`` (counted by vLLM, cut from the output) make it
approximate. For those variable-length proposers the acceptance length averages only steps that proposed,
so it is not a speedup estimate; compare measured throughput instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tuner.domain import SpecDecodeStats

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
REQUEST_SUCCESS = "vllm:request_success_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"  # a fraction in [0, 1] despite the name


@dataclass(frozen=True)
class MetricsSnapshot:
    """Sample values summed over labels (engines, models, finish reasons), per-position counts apart."""

    values: Mapping[str, float] = field(default_factory=dict)
    accepted_per_position: Mapping[int, float] = field(default_factory=dict)

    def get(self, name: str) -> float | None:
        return self.values.get(name)


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse a ``/metrics`` body with prometheus_client's text parser."""
    values: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ACCEPTED_PER_POS:
                pos = int(sample.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
            else:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return MetricsSnapshot(values, per_pos)


def counter_delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str) -> int | None:
    a = after.get(name)
    if a is None:
        return None
    return round(a - (before.get(name) or 0.0))


def spec_decode_delta(
    before: MetricsSnapshot, after: MetricsSnapshot, num_speculative_tokens: int
) -> SpecDecodeStats | None:
    """Spec-decode counters over the window; None when the server exposes none (no speculative config)."""
    drafts = counter_delta(before, after, DRAFTS)
    if drafts is None:
        return None
    accepted = counter_delta(before, after, ACCEPTED) or 0
    positions = sorted(after.accepted_per_position)
    per_pos = tuple(round(after.accepted_per_position[p] - before.accepted_per_position.get(p, 0.0)) for p in positions)
    generation = counter_delta(before, after, GENERATION_TOKENS)
    finished = counter_delta(before, after, REQUEST_SUCCESS) or 0
    steps = generation - accepted - finished if generation is not None else None
    return SpecDecodeStats(
        num_drafts=drafts,
        num_draft_tokens=counter_delta(before, after, DRAFT_TOKENS) or 0,
        num_accepted_tokens=accepted,
        accepted_per_position=per_pos,
        num_speculative_tokens=num_speculative_tokens,
        decode_steps=steps if steps and steps > 0 else None,
    )


async def scrape(client: httpx.AsyncClient, base_url: str) -> MetricsSnapshot:
    resp = await client.get(f"{base_url}/metrics", timeout=10.0)
    resp.raise_for_status()
    return parse_metrics(resp.text)


@dataclass(frozen=True)
class GaugeSummary:
    samples: int
    mean_running: float | None
    peak_kv_cache_usage: float | None
    max_waiting: float | None


class GaugeSampler:
    """Samples the gauges every ``interval_s`` while the ``async with`` block runs.

    A failed scrape is skipped, not fatal: the measured window must not fail because one sample did.
    """

    def __init__(self, client: httpx.AsyncClient, base_url: str, interval_s: float = 0.5) -> None:
        self._client = client
        self._base_url = base_url
        self._interval_s = interval_s
        self._running: list[float] = []
        self._kv: list[float] = []
        self._waiting: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> GaugeSampler:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _loop(self) -> None:
        while True:
            # Sleep first: a sample taken before the first request is admitted would read an idle server.
            await asyncio.sleep(self._interval_s)
            with contextlib.suppress(httpx.HTTPError, ValueError):
                self.add(await scrape(self._client, self._base_url))

    def add(self, snap: MetricsSnapshot) -> None:
        for name, store in ((RUNNING, self._running), (KV_USAGE, self._kv), (WAITING, self._waiting)):
            value = snap.get(name)
            if value is not None:
                store.append(value)

    def summary(self) -> GaugeSummary:
        return GaugeSummary(
            samples=len(self._running),
            mean_running=statistics.fmean(self._running) if self._running else None,
            peak_kv_cache_usage=max(self._kv) if self._kv else None,
            max_waiting=max(self._waiting) if self._waiting else None,
        )


MIN_GAUGE_SAMPLES = 3


def below_target(
    achieved: float | None, target: float | None, samples: int = MIN_GAUGE_SAMPLES, fraction: float = 0.9
) -> bool:
    """True when the level's mean running requests stayed under ``fraction`` of its target concurrency.

    Judged only on ``MIN_GAUGE_SAMPLES`` samples or more: a window shorter than that may be read once, between
    two requests, and one idle reading is not a level that failed to keep its target busy.
    """
    if achieved is None or target is None or samples < MIN_GAUGE_SAMPLES:
        return False
    return achieved < fraction * target
