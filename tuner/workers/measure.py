"""Measuring one load level on a running OpenAI-compatible server: warm-up, the window, vLLM's metrics around it,
and a re-measurement from more client processes when the client was the bottleneck.

The trial runner (a server it launched) and ``tuner bench`` (a server someone else runs) both measure here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import aiohttp
import httpx

from tuner.domain import SLO, LevelResult, LoadKind, LoadLevel, TrafficRequest
from tuner.workers import vllm_metrics
from tuner.workers.replay import Connection, ReplaySettings, Window, run_level
from tuner.workers.shards import run_sharded
from tuner.workers.timing import summarize


@dataclass(frozen=True)
class Target:
    """The server under measurement. ``metrics_url`` is the base URL whose ``/metrics`` describe the same
    server (None: not scraped, and acceptance is unknown: behind a load balancer ``/metrics`` would be one
    replica's, so it is never guessed from ``base_url``)."""

    base_url: str
    metrics_url: str | None
    connection: Connection = Connection()


@dataclass(frozen=True)
class Clients:
    """How many client processes send a window: ``processes`` at first, up to ``max_processes`` when the
    client was the bottleneck; ``cpus`` are the cores they may run on (None: anywhere)."""

    processes: int = 1
    max_processes: int = 1
    cpus: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Measured:
    result: LevelResult
    window: Window
    client_processes: int


def warmup_level(level: LoadLevel) -> LoadLevel:
    """Warm-up runs closed loop: at the level's concurrency, or one at a time before an open-loop level."""
    width = level.value if level.kind is LoadKind.CONCURRENCY else 1
    return LoadLevel(LoadKind.CONCURRENCY, width, num_requests=level.warmup_requests, warmup_requests=0)


async def _window(
    streams: aiohttp.ClientSession,
    target: Target,
    requests: Sequence[TrafficRequest],
    level: LoadLevel,
    settings: ReplaySettings,
    clients: Clients,
    processes: int,
    should_stop: Callable[[], bool],
    offset: int = 0,
) -> Window:
    if processes <= 1:
        with _pinned(clients.cpus):
            base = target.base_url
            return await run_level(streams, base, requests, level, settings, offset=offset, should_stop=should_stop)
    return await run_sharded(
        target.base_url,
        requests,
        level,
        settings,
        processes,
        connection=target.connection,
        offset=offset,
        cpus=clients.cpus,
        should_stop=should_stop,
    )


@contextlib.contextmanager
def _pinned(cpus: tuple[int, ...] | None) -> Iterator[None]:
    """Run this thread (the one whose event loop replays) on ``cpus`` for the block: on Linux pid 0 names the
    calling thread, so the rest of the process keeps its cores."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


async def _scrape(control: httpx.AsyncClient, target: Target) -> vllm_metrics.MetricsSnapshot:
    if target.metrics_url is None:
        return vllm_metrics.MetricsSnapshot()
    return await vllm_metrics.scrape(control, target.metrics_url)


async def measure_level(
    control: httpx.AsyncClient,
    streams: aiohttp.ClientSession,
    target: Target,
    requests: Sequence[TrafficRequest],
    level: LoadLevel,
    settings: ReplaySettings,
    *,
    slo: SLO,
    num_speculative_tokens: int,
    clients: Clients = Clients(),
    metrics_interval_s: float = 0.5,
    should_stop: Callable[[], bool] = lambda: False,
    check: Callable[[Window], None] = lambda w: None,
) -> Measured:
    """Warm up, then measure ``level``; ``check`` sees every window first (and may raise to abort).

    A window whose client was the bottleneck (``ClientHealth.bound_reason``) is measured again with twice the
    client processes, up to ``clients.max_processes``; the last window is the level's, still marked
    ``client_bound`` (with how many processes tried) when even that many could not keep up.
    """
    if level.warmup_requests:
        warm = warmup_level(level)
        check(await _window(streams, target, requests, warm, settings, clients, 1, should_stop, level.num_requests))
    processes = max(1, clients.processes)
    while True:
        before = await _scrape(control, target)
        async with contextlib.AsyncExitStack() as stack:
            sampler = None
            if target.metrics_url is not None:
                sampler = vllm_metrics.GaugeSampler(control, target.metrics_url, metrics_interval_s)
                await stack.enter_async_context(sampler)
            window = await _window(streams, target, requests, level, settings, clients, processes, should_stop)
        check(window)
        after = await _scrape(control, target)
        gauges = sampler.summary() if sampler is not None else vllm_metrics.GaugeSummary(0, None, None, None)
        result = level_result(level, window, before, after, gauges, slo, num_speculative_tokens, processes)
        if not result.client_bound or processes >= clients.max_processes or should_stop():
            return Measured(result, window, processes)
        processes = min(clients.max_processes, processes * 2)


def level_result(
    level: LoadLevel,
    window: Window,
    before: vllm_metrics.MetricsSnapshot,
    after: vllm_metrics.MetricsSnapshot,
    gauges: vllm_metrics.GaugeSummary,
    slo: SLO,
    num_speculative_tokens: int,
    processes: int = 1,
) -> LevelResult:
    """The client's figures of a window joined with the server's counters and gauges over it."""
    figures = summarize(level, window.records, window.duration_s, slo)
    reason = window.health.bound_reason if window.health is not None else None
    if reason is not None:
        reason = f"{reason} ({processes} client process{'es' if processes > 1 else ''})"
    return dataclasses.replace(
        figures,
        achieved_concurrency=gauges.mean_running,
        below_target=vllm_metrics.below_target(gauges.mean_running, level.concurrency, gauges.samples),
        gauge_samples=gauges.samples,
        peak_kv_cache_usage=gauges.peak_kv_cache_usage,
        max_waiting=gauges.max_waiting,
        preemptions=vllm_metrics.counter_delta(before, after, vllm_metrics.PREEMPTIONS) or 0,
        generation_tokens=vllm_metrics.counter_delta(before, after, vllm_metrics.GENERATION_TOKENS),
        spec_decode=vllm_metrics.spec_decode_delta(before, after, num_speculative_tokens),
        client_bound=reason is not None,
        client_bound_reason=reason,
        client_processes=processes,
    )
