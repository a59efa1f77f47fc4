"""Replay a traffic sample against an OpenAI-compatible server and record every stream.

Requests stream in the sample's own format (``/v1/completions`` or ``/v1/chat/completions``) with
``stream_options.include_usage`` and ``return_token_ids``, so each chunk says exactly how many tokens it
carried (several under speculative decoding). The recorded output length is enforced with ``ignore_eos``
(``max_tokens`` alone would only cap it); a request with only ``max_tokens`` keeps it as a cap.

The client must out-run the server at the concurrency where decisions are made, so the stream path is lean:
aiohttp (what ``vllm bench serve`` uses; its HTTP parser is C), bodies written by orjson, the SSE stream cut
into events on the raw bytes and each event parsed once by orjson; one clock read per network read, so the
events of one read share a timestamp, as in ``vllm bench serve`` (see ``tuner.workers.timing`` on ITL).
httpx stays for the control paths (metrics, version, correctness).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import orjson

from tuner.domain import LoadKind, LoadLevel, TrafficFormat, TrafficRequest
from tuner.workers.timing import Chunk, RequestRecord


@dataclass(frozen=True)
class ReplaySettings:
    model: str  # the served model name
    ignore_eos: bool = True
    request_timeout_s: float = 600.0
    seed: int = 0
    # Exact tokens per chunk (vLLM >= 0.10.2). Off (the default for measured windows): a chunk with text counts
    # as one token, as in vllm bench, and the server is measured doing the work a production client asks of it.
    return_token_ids: bool = False


@dataclass(frozen=True)
class Connection:
    """How the stream client reaches the server beyond its URL: extra headers (an API key), TLS checks.
    Plain data, so a client process of a sharded window can build its own session from it."""

    headers: tuple[tuple[str, str], ...] = ()
    verify_tls: bool = True
    ca_file: str | None = None  # a CA bundle to trust instead of the system's

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.verify_tls:
            return False
        if self.ca_file:
            return ssl.create_default_context(cafile=self.ca_file)
        return True

    def httpx_verify(self) -> ssl.SSLContext | bool:
        ctx = self.ssl_context()
        return ssl.create_default_context() if ctx is True else ctx


def make_client(timeout_s: float = 600.0, connection: Connection | None = None) -> httpx.AsyncClient:
    """The client every replay uses: no connection cap, and TCP_NODELAY.

    httpcore writes a request's headers and body separately; without TCP_NODELAY, Nagle's algorithm holds
    the body until the headers are ACKed, and a delayed ACK adds up to tens of milliseconds to each TTFT
    (aiohttp, which ``vllm bench`` uses, sets TCP_NODELAY for the same reason).
    """
    conn = connection or Connection()
    transport = httpx.AsyncHTTPTransport(
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        verify=conn.httpx_verify(),
    )
    return httpx.AsyncClient(transport=transport, timeout=timeout_s, headers=dict(conn.headers))


@contextlib.asynccontextmanager
async def stream_client(
    timeout_s: float = 600.0, connection: Connection | None = None
) -> AsyncIterator[aiohttp.ClientSession]:
    """The session every replay window streams through: no connection cap, keep-alive, TCP_NODELAY
    (aiohttp sets it), no cookie jar or auto-decompression work per response."""
    conn = connection or Connection()
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=None, enable_cleanup_closed=True, ssl=conn.ssl_context())
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        headers=dict(conn.headers),
        json_serialize=lambda o: orjson.dumps(o).decode(),
    ) as session:
        yield session


def build_request(req: TrafficRequest, settings: ReplaySettings, *, stream: bool = True) -> tuple[str, dict]:
    """The endpoint path and JSON body of one request."""
    body: dict[str, Any] = {
        "model": settings.model,
        "temperature": req.temperature if req.temperature is not None else 0.0,
        "max_tokens": req.target_output_tokens,
    }
    if settings.return_token_ids:
        body["return_token_ids"] = True
    if req.output_tokens and settings.ignore_eos:
        body["ignore_eos"] = True
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    if req.format is TrafficFormat.CHAT:
        body["messages"] = [dict(m) for m in req.messages or ()]
        return "/v1/chat/completions", body
    body["prompt"] = req.prompt_text()
    return "/v1/completions", body


def _chunk_tokens(choice: dict[str, Any]) -> tuple[list[int] | None, int]:
    ids = choice.get("token_ids")
    if ids is not None:
        return ids, len(ids)
    # A server without return_token_ids: count a chunk with text as one token.
    delta = choice.get("delta") or {}
    text = choice.get("text") or delta.get("content") or delta.get("reasoning_content") or ""
    return None, 1 if text else 0


_HEADERS = {"Content-Type": "application/json"}


async def send_one(
    client: aiohttp.ClientSession, base_url: str, index: int, req: TrafficRequest, settings: ReplaySettings
) -> RequestRecord:
    """Send one streaming request; errors are recorded, never raised."""
    path, body = build_request(req, settings)
    payload = orjson.dumps(body)
    start = time.perf_counter()
    chunks: list[Chunk] = []
    ids: list[int] = []
    usage_tokens: int | None = None
    end: float | None = None  # the last data event, the usage chunk included (as vllm bench's latency)
    try:
        async with client.post(base_url + path, data=payload, headers=_HEADERS) as r:
            if r.status != 200:
                text = (await r.read()).decode("utf-8", "replace")
                return RequestRecord(index, start, time.perf_counter(), error=f"HTTP {r.status}: {text[:300]}")
            buffer = b""
            async for data in r.content.iter_any():
                now = time.perf_counter()
                buffer += data
                if b"\n\n" not in buffer:
                    continue
                *events, buffer = buffer.split(b"\n\n")
                for raw in events:
                    line = raw.strip()
                    if not line.startswith(b"data:"):
                        continue
                    payload_bytes = line[5:].strip()
                    if payload_bytes == b"[DONE]":
                        continue  # read on to the end of the body so the connection goes back to the pool
                    end = now
                    event = orjson.loads(payload_bytes)
                    if "error" in event:
                        return RequestRecord(index, start, now, tuple(chunks), error=str(event["error"])[:300])
                    usage = event.get("usage")
                    if usage:
                        usage_tokens = usage.get("completion_tokens")
                    for choice in event.get("choices") or ():
                        chunk_ids, n = _chunk_tokens(choice)
                        if chunk_ids:
                            ids.extend(chunk_ids)
                        if n:
                            chunks.append(Chunk(now, n))
    except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError, UnicodeDecodeError) as e:
        return RequestRecord(index, start, time.perf_counter(), tuple(chunks), error=f"{type(e).__name__}: {e}")
    if not chunks or end is None:
        return RequestRecord(index, start, time.perf_counter(), error="stream carried no tokens")
    return RequestRecord(index, start, end, tuple(chunks), usage_tokens, token_ids=tuple(ids))


def arrival_offsets(level: LoadLevel, picked: Sequence[TrafficRequest], seed: int) -> list[float]:
    """Send times (s from the window start) of the picked requests for open-loop levels: Poisson at R req/s
    (seeded), or the sample's own ``arrival_s`` shifted so the earliest is 0 (missing stamps count as 0)."""
    if level.kind is LoadKind.RATE:
        rng = random.Random(seed)
        t, out = 0.0, []
        for _ in picked:
            out.append(t)
            t += rng.expovariate(level.value)
        return out
    stamps = [r.arrival_s or 0.0 for r in picked]
    base = min(stamps, default=0.0)
    return [s - base for s in stamps]


@dataclass(frozen=True)
class Window:
    records: tuple[RequestRecord, ...]
    duration_s: float
    stopped: bool  # should_stop ended the window early
    health: ClientHealth | None = None


# The client cannot keep up when its event loop runs this late (p90), its thread is this busy, or it waits
# this share of the window for a CPU while runnable (another process on its core): the server's figures
# would then be the client's ceiling.
MAX_LOOP_LAG_MS = 25.0
MAX_CLIENT_CPU_SHARE = 0.90
MAX_RUNQUEUE_SHARE = 0.10
_PROBE_S = 0.02


def _runqueue_wait_s() -> float | None:
    """Time this thread has spent runnable but not running (Linux schedstat); None where unknown."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class ClientHealth:
    """How the replay's own process fared during a window: event-loop lag (how late a 20 ms timer fired),
    the share of wall time the loop's thread spent on CPU, and the share it spent waiting for one."""

    loop_lag_p90_ms: float
    loop_lag_max_ms: float
    cpu_share: float
    runqueue_share: float | None = None

    @property
    def bound_reason(self) -> str | None:
        if self.loop_lag_p90_ms > MAX_LOOP_LAG_MS:
            return f"client event loop lagged {self.loop_lag_p90_ms:.0f} ms (p90) behind its timers"
        if self.cpu_share > MAX_CLIENT_CPU_SHARE:
            return f"client thread used {self.cpu_share:.0%} of a core"
        if self.runqueue_share is not None and self.runqueue_share > MAX_RUNQUEUE_SHARE:
            return f"client thread waited {self.runqueue_share:.0%} of the window for a CPU (its core is shared)"
        return None


class _HealthProbe:
    def __init__(self) -> None:
        self.lags: list[float] = []
        self._cpu0 = time.thread_time()  # the loop's thread only: other trials' clients are not ours
        self._wait0 = _runqueue_wait_s()
        self._t0 = time.perf_counter()

    async def run(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(_PROBE_S)
            self.lags.append(max(0.0, time.perf_counter() - before - _PROBE_S))

    def result(self) -> ClientHealth:
        wall = time.perf_counter() - self._t0
        lags = sorted(self.lags) or [0.0]
        p90 = lags[min(len(lags) - 1, int(0.9 * len(lags)))]
        cpu = (time.thread_time() - self._cpu0) / wall if wall > 0 else 0.0
        wait1 = _runqueue_wait_s()
        waited = (wait1 - self._wait0) / wall if wall > 0 and wait1 is not None and self._wait0 is not None else None
        return ClientHealth(p90 * 1000.0, lags[-1] * 1000.0, cpu, waited)


@dataclass(frozen=True)
class Plan:
    """What one client process sends in a window. Closed loop: ``workers`` loops, each taking the next
    request index from ``take`` (shared between processes when the window is sharded, so the total in flight
    is the level's concurrency until the last request is sent). Open loop: ``schedule`` of (index, send
    offset from the window start)."""

    workers: int = 0
    take: Callable[[], int | None] = lambda: None
    schedule: tuple[tuple[int, float], ...] = ()


def plan_for(level: LoadLevel, requests: Sequence[TrafficRequest], n: int, offset: int, seed: int) -> Plan:
    """The single-process plan of a window of ``n`` requests taken cyclically from ``offset``."""
    picks = [(offset + i) % len(requests) for i in range(n)]
    if level.kind is LoadKind.CONCURRENCY:
        it = iter(picks)
        return Plan(workers=max(1, int(level.value)), take=lambda: next(it, None))
    offsets = arrival_offsets(level, [requests[i] for i in picks], seed)
    return Plan(schedule=tuple(zip(picks, offsets, strict=True)))


async def run_level(
    client: aiohttp.ClientSession,
    base_url: str,
    requests: Sequence[TrafficRequest],
    level: LoadLevel,
    settings: ReplaySettings,
    *,
    num_requests: int | None = None,
    offset: int = 0,
    should_stop: Callable[[], bool] = lambda: False,
    poll_s: float = 0.2,
) -> Window:
    """Run one window of ``num_requests`` (default ``level.num_requests``) taken cyclically from the sample,
    starting at ``offset``. Closed loop keeps ``level.concurrency`` in flight; open loop sends on schedule.
    ``level.duration_s`` stops issuing new requests after that long. ``should_stop`` (polled) cancels the
    in-flight requests and ends the window at once.
    """
    n = level.num_requests if num_requests is None else num_requests
    plan = plan_for(level, requests, n, offset, settings.seed)
    return await drive(client, base_url, requests, level, settings, plan, should_stop=should_stop, poll_s=poll_s)


async def drive(
    client: aiohttp.ClientSession,
    base_url: str,
    requests: Sequence[TrafficRequest],
    level: LoadLevel,
    settings: ReplaySettings,
    plan: Plan,
    *,
    t0: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    poll_s: float = 0.2,
) -> Window:
    """Send what ``plan`` says from this process; ``t0`` (a ``time.perf_counter`` reading, the same clock in
    every process of a host) is the window start the schedule and ``level.duration_s`` count from."""
    t0 = time.perf_counter() if t0 is None else t0
    if (wait := t0 - time.perf_counter()) > 0:
        await asyncio.sleep(wait)  # a shard waits for the common start
    records: list[RequestRecord] = []
    issue_until = t0 + level.duration_s if level.duration_s else float("inf")

    async def closed_worker() -> None:
        while time.perf_counter() < issue_until and (i := plan.take()) is not None:
            records.append(await send_one(client, base_url, i, requests[i], settings))

    async def open_loop() -> None:
        pending: list[asyncio.Task[RequestRecord]] = []
        try:
            for i, at in plan.schedule:
                delay = t0 + at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                if time.perf_counter() >= issue_until:
                    break
                pending.append(asyncio.create_task(send_one(client, base_url, i, requests[i], settings)))
            records.extend(await asyncio.gather(*pending))
        finally:
            for task in pending:
                task.cancel()

    main: asyncio.Future[list[None]] | asyncio.Task[None]
    if plan.workers:
        main = asyncio.gather(*(closed_worker() for _ in range(plan.workers)))
    else:
        main = asyncio.ensure_future(open_loop())

    probe = _HealthProbe()
    probe_task = asyncio.ensure_future(probe.run())
    stopped = False
    while True:
        done, _ = await asyncio.wait({main}, timeout=poll_s)
        if done:
            main.result()
            break
        if should_stop():
            stopped = True
            main.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await main
            break
    probe_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await probe_task
    return Window(tuple(sorted(records, key=lambda r: r.start)), time.perf_counter() - t0, stopped, probe.result())
