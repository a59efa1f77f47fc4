"""One replay window sent from several client processes, for hosts where one core cannot out-run the server.

Closed loop: the concurrency is split between the processes (shard i runs ``c // n`` loops, one more for the
first ``c % n``) and every loop takes the next request from one counter in shared memory, so the total in
flight is exactly ``c`` until the last request is sent, whichever shard is faster. Open loop: one arrival
schedule is computed here and dealt round-robin to the shards. Every shard starts at the same
``time.perf_counter`` instant (CLOCK_MONOTONIC, one clock for all processes of a host), so the merged records
are on one time line and summarise like a single client's.

The processes are spawned (not forked: the parent runs an event loop and threads), each builds its own
aiohttp session from a :class:`~tuner.workers.replay.Connection`, and may be pinned to ``cpus`` so clients
stay off the cores the server's API process uses. As with any spawned multiprocessing child, a script that
calls this must guard its own top level with ``if __name__ == "__main__":`` (the ``tuner`` command, pytest and
Ray's workers do).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe
from multiprocessing.sharedctypes import Synchronized
from typing import Any

from tuner.domain import LoadKind, LoadLevel, TrafficRequest
from tuner.workers.replay import (
    ClientHealth,
    Connection,
    Plan,
    ReplaySettings,
    Window,
    arrival_offsets,
    drive,
    stream_client,
)

# Spawned processes import the package before they can send: give them this long to say they are ready.
_READY_TIMEOUT_S = 60.0
# The shards start together this long after the last one is ready (a margin for the "go" to reach them all).
_START_MARGIN_S = 0.05


@dataclass(frozen=True)
class _ShardJob:
    index: int
    base_url: str
    requests: tuple[TrafficRequest, ...]
    level: LoadLevel
    settings: ReplaySettings
    connection: Connection
    picks: tuple[int, ...]  # closed loop: the window's request indices, taken through the shared counter
    workers: int  # closed loop: this shard's share of the concurrency
    schedule: tuple[tuple[int, float], ...]  # open loop: this shard's (index, offset)
    cpus: tuple[int, ...] | None
    poll_s: float


def split_concurrency(c: int, shards: int) -> list[int]:
    """Each shard's share of ``c`` loops: as even as possible, none empty (so ``shards <= c``)."""
    n = max(1, min(shards, c))
    return [c // n + (1 if i < c % n else 0) for i in range(n)]


def _shard_main(job: _ShardJob, pipe: Pipe, counter: Synchronized[int], stop: Any) -> None:
    if job.cpus:
        os.sched_setaffinity(0, job.cpus)
    pipe.send("ready")
    t0 = pipe.recv()
    n = len(job.picks)

    def take() -> int | None:
        with counter.get_lock():
            i = counter.value
            if i >= n:
                return None
            counter.value = i + 1
        return job.picks[i]

    plan = Plan(workers=job.workers, take=take) if job.workers else Plan(schedule=job.schedule)

    async def run() -> Window:
        async with stream_client(job.settings.request_timeout_s, job.connection) as session:
            return await drive(
                session,
                job.base_url,
                job.requests,
                job.level,
                job.settings,
                plan,
                t0=t0,
                should_stop=stop.is_set,
                poll_s=job.poll_s,
            )

    pipe.send(asyncio.run(run()))
    pipe.close()


def _merge_health(parts: Sequence[ClientHealth | None]) -> ClientHealth | None:
    """The worst shard speaks for the window: one starved process is enough to bend its figures."""
    known = [h for h in parts if h is not None]
    if not known:
        return None
    return ClientHealth(
        max(h.loop_lag_p90_ms for h in known),
        max(h.loop_lag_max_ms for h in known),
        max(h.cpu_share for h in known),
        max((h.runqueue_share for h in known if h.runqueue_share is not None), default=None),
    )


async def run_sharded(
    base_url: str,
    requests: Sequence[TrafficRequest],
    level: LoadLevel,
    settings: ReplaySettings,
    shards: int,
    *,
    connection: Connection | None = None,
    num_requests: int | None = None,
    offset: int = 0,
    cpus: Sequence[int] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    poll_s: float = 0.2,
) -> Window:
    """Run one window as :func:`~tuner.workers.replay.run_level` does, from ``shards`` client processes
    (fewer for a closed loop narrower than that). The window's duration runs from the common start to the
    last shard's end; ``should_stop`` stops every shard."""
    n = level.num_requests if num_requests is None else num_requests
    picks = tuple((offset + i) % len(requests) for i in range(n))
    if level.kind is LoadKind.CONCURRENCY:
        shares = split_concurrency(max(1, int(level.value)), shards)
        schedules: list[tuple[tuple[int, float], ...]] = [() for _ in shares]
    else:
        offsets = arrival_offsets(level, [requests[i] for i in picks], settings.seed)
        timeline = list(zip(picks, offsets, strict=True))
        shares = [0] * max(1, shards)
        schedules = [tuple(timeline[i :: len(shares)]) for i in range(len(shares))]
    ctx = mp.get_context("spawn")
    counter = ctx.Value("q", 0)
    stop = ctx.Event()
    reqs = tuple(requests)
    conn = connection or Connection()
    procs: list[tuple[Any, Pipe]] = []
    try:
        for i, (workers, schedule) in enumerate(zip(shares, schedules, strict=True)):
            mine, theirs = ctx.Pipe()
            job = _ShardJob(
                i,
                base_url,
                reqs,
                level,
                settings,
                conn,
                picks,
                workers,
                schedule,
                tuple(cpus) if cpus else None,
                poll_s,
            )
            proc = ctx.Process(target=_shard_main, args=(job, theirs, counter, stop), daemon=True)
            proc.start()
            theirs.close()
            procs.append((proc, mine))
        for proc, pipe in procs:
            if not await asyncio.to_thread(pipe.poll, _READY_TIMEOUT_S) or pipe.recv() != "ready":
                raise RuntimeError(f"client process {proc.pid} did not start")
        t0 = time.perf_counter() + _START_MARGIN_S
        for _, pipe in procs:
            pipe.send(t0)
        windows: list[Window | None] = [None] * len(procs)
        stopped = False
        while any(w is None for w in windows):
            for i, (proc, pipe) in enumerate(procs):
                if windows[i] is None and pipe.poll():
                    windows[i] = pipe.recv()
                elif windows[i] is None and not proc.is_alive() and not pipe.poll():
                    raise RuntimeError(f"client process {proc.pid} exited with {proc.exitcode}")
            if not stopped and should_stop():
                stopped = True
                stop.set()
            await asyncio.sleep(min(poll_s, 0.05))
    finally:
        stop.set()
        for proc, pipe in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            with contextlib.suppress(OSError):
                pipe.close()
    done = [w for w in windows if w is not None]
    records = sorted((r for w in done for r in w.records), key=lambda r: r.start)
    end = max((t0 + w.duration_s for w in done), default=t0)
    return Window(
        tuple(records),
        end - t0,
        stopped or any(w.stopped for w in done),
        _merge_health([w.health for w in done]),
    )
