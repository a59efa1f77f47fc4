"""The load generator against an in-process stand-in for the OpenAI API (aiohttp.web on a real socket)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import aiohttp
import pytest
from aiohttp import web

from tuner.domain import SLO, LoadKind, LoadLevel, TrafficFormat, TrafficRequest
from tuner.workers.measure import Clients, Measured, Target, measure_level
from tuner.workers.replay import (
    Connection,
    ReplaySettings,
    arrival_offsets,
    build_request,
    make_client,
    run_level,
    send_one,
    stream_client,
)
from tuner.workers.shards import run_sharded, split_concurrency
from tuner.workers.timing import steady_window, summarize

pytestmark = pytest.mark.anyio  # anyio's pytest plugin comes with httpx

SETTINGS = ReplaySettings(model="m")
COMPLETION = TrafficRequest(TrafficFormat.COMPLETIONS, prompt="p", output_tokens=5, temperature=0.7)
CHAT = TrafficRequest(TrafficFormat.CHAT, messages=({"role": "user", "content": "hi"},), max_tokens=9)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_completion_body_enforces_the_recorded_length() -> None:
    path, body = build_request(COMPLETION, SETTINGS)
    assert path == "/v1/completions"
    # no token ids by default: vllm bench does not ask for them either
    assert body == {
        "model": "m", "prompt": "p", "max_tokens": 5, "ignore_eos": True, "temperature": 0.7,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip


def test_chat_body_keeps_max_tokens_as_a_cap_only() -> None:
    path, body = build_request(CHAT, SETTINGS, stream=False)
    assert path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["max_tokens"] == 9 and "ignore_eos" not in body and "stream" not in body
    assert body["temperature"] == 0.0  # the sample's default


def _sse(events: list[dict]) -> bytes:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events).encode() + b"data: [DONE]\n\n"


def _stream(token_chunks: list[list[int]], fmt: TrafficFormat = TrafficFormat.COMPLETIONS) -> bytes:
    events = []
    for ids in token_chunks:
        if fmt is TrafficFormat.CHAT:
            events.append({"choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": ids}]})
        else:
            events.append({"choices": [{"index": 0, "text": "x" * len(ids), "token_ids": ids}]})
    events.append({"choices": [], "usage": {"completion_tokens": sum(map(len, token_chunks))}})
    return _sse(events)


class FakeServer:
    """Streams five tokens (one chunk of two) after ``delay_s``; records the peak number in flight."""

    def __init__(self, delay_s: float = 0.02, status: int = 200) -> None:
        self.delay_s = delay_s
        self.status = status
        self.in_flight = 0
        self.peak = 0
        self.bodies: list[dict] = []

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.json())
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        if self.status != 200:
            return web.json_response({"error": {"message": "bad request"}}, status=self.status)
        return await _write_events(request, _stream([[1], [2, 3], [4], [5]]))


async def _write_events(request: web.Request, body: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in body.split(b"\n\n"):
        if event:
            await response.write(event + b"\n\n")  # one write per event, as a server streams them
    await response.write_eof()
    return response


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def _client(handler: Handler) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """The handler behind a real HTTP server on a free port, and the replay's session to reach it."""

    async def route(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    app = web.Application()
    app.router.add_post("/v1/completions", route)
    app.router.add_post("/v1/chat/completions", route)
    # handler_cancellation: a client that drops its request cancels the handler, as a real server stops the stream
    runner = web.AppRunner(app, shutdown_timeout=0.2, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with stream_client() as session:
            yield session, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_send_one_records_tokens_per_chunk_and_usage() -> None:
    async with _client(FakeServer()) as (client, base):
        rec = await send_one(client, base, 0, COMPLETION, SETTINGS)
    assert rec.ok
    assert [c.tokens for c in rec.chunks] == [1, 2, 1, 1]
    assert rec.output_tokens == 5 and rec.token_ids == (1, 2, 3, 4, 5)


async def test_send_one_records_http_errors() -> None:
    async with _client(FakeServer(status=400)) as (client, base):
        rec = await send_one(client, base, 0, CHAT, SETTINGS)
    assert not rec.ok and rec.error is not None and rec.error.startswith("HTTP 400")


@pytest.mark.parametrize("concurrency", [1, 3])
async def test_closed_loop_keeps_n_in_flight(concurrency: int) -> None:
    server = FakeServer()
    level = LoadLevel(LoadKind.CONCURRENCY, concurrency, num_requests=9)
    async with _client(server) as (client, base):
        window = await run_level(client, base, [COMPLETION, CHAT], level, SETTINGS)
    assert server.peak == concurrency
    assert len(window.records) == 9 and all(r.ok for r in window.records)
    # Requests are taken cyclically from the sample.
    assert [r.index for r in window.records].count(1) == 4
    assert not window.stopped


async def test_open_loop_sends_on_schedule() -> None:
    server = FakeServer(delay_s=0.2)
    level = LoadLevel(LoadKind.RATE, 50.0, num_requests=10)
    async with _client(server) as (client, base):
        window = await run_level(client, base, [COMPLETION], level, SETTINGS)
    assert len(window.records) == 10
    assert server.peak > 3  # arrivals do not wait for completions


def test_poisson_arrivals_are_seeded_with_the_right_rate() -> None:
    level = LoadLevel(LoadKind.RATE, 4.0)
    picked = [COMPLETION] * 4000
    a, b = arrival_offsets(level, picked, seed=1), arrival_offsets(level, picked, seed=1)
    assert a == b and a[0] == 0.0
    gaps = [y - x for x, y in zip(a, a[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.05)


def test_sample_timestamps_start_at_zero() -> None:
    reqs = [TrafficRequest(TrafficFormat.COMPLETIONS, prompt="p", arrival_s=t) for t in (10.0, 10.5, 12.0)]
    assert arrival_offsets(LoadLevel(LoadKind.TIMESTAMPS), reqs, seed=0) == [0.0, 0.5, 2.0]


async def test_should_stop_cancels_in_flight_requests() -> None:
    server = FakeServer(delay_s=30.0)
    level = LoadLevel(LoadKind.CONCURRENCY, 2, num_requests=100)
    calls = 0

    def stop() -> bool:
        nonlocal calls
        calls += 1
        return calls > 2

    async with _client(server) as (client, base):
        window = await asyncio.wait_for(
            run_level(client, base, [COMPLETION], level, SETTINGS, should_stop=stop, poll_s=0.01), 5
        )
    assert window.stopped and window.records == ()
    assert server.in_flight == 0


async def test_without_token_ids_a_chunk_with_text_counts_as_one_token() -> None:
    events = [{"choices": [{"index": 0, "text": "ab"}]}, {"choices": [{"index": 0, "text": ""}]}]
    events.append({"choices": [], "usage": {"completion_tokens": 3}})

    async def handler(request: web.Request) -> web.StreamResponse:
        assert "return_token_ids" not in await request.json()
        return await _write_events(request, _sse(events))

    settings = ReplaySettings(model="m", return_token_ids=False)
    async with _client(handler) as (client, base):
        rec = await send_one(client, base, 0, COMPLETION, settings)
    assert [c.tokens for c in rec.chunks] == [1]
    assert rec.num_output_tokens == 3  # usage still gives the true count


async def test_a_normal_window_is_not_client_bound() -> None:
    level = LoadLevel(LoadKind.CONCURRENCY, 4, num_requests=40)
    async with _client(FakeServer(delay_s=0.01)) as (client, base):
        window = await run_level(client, base, [COMPLETION], level, SETTINGS)
    assert window.health is not None and window.health.bound_reason is None, window.health


async def test_a_starved_client_marks_its_window_client_bound() -> None:
    """A client whose event loop is kept busy (as by a process hogging its core) says so."""

    async def hog() -> None:
        while True:
            end = time.perf_counter() + 0.06
            while time.perf_counter() < end:  # 60 ms without yielding: every timer fires late
                pass
            await asyncio.sleep(0)

    level = LoadLevel(LoadKind.CONCURRENCY, 4, num_requests=40)
    async with _client(FakeServer(delay_s=0.01)) as (client, base):
        task = asyncio.ensure_future(hog())
        try:
            window = await run_level(client, base, [COMPLETION], level, SETTINGS)
        finally:
            task.cancel()
    assert window.health is not None
    reason = window.health.bound_reason
    assert reason is not None and "lagged" in reason
    figures = summarize(level, window.records, window.duration_s, SLO())
    assert figures.num_requests == 40


async def test_the_steady_window_holds_the_target_concurrency() -> None:
    level = LoadLevel(LoadKind.CONCURRENCY, 3, num_requests=30)
    async with _client(FakeServer(delay_s=0.03)) as (client, base):
        window = await run_level(client, base, [COMPLETION], level, SETTINGS)
    begin, end = steady_window(level, window.records) or (0.0, 0.0)
    assert end > begin
    # Inside the window three requests are in flight (a finished one is replaced at once): the time-average
    # of the in-flight count there is 3, never more; ramp-up and drain lie outside.
    overlap = sum(max(0.0, min(r.end, end) - max(r.start, begin)) for r in window.records)
    assert 2.7 <= overlap / (end - begin) <= 3.0 + 1e-9
    figures = summarize(level, window.records, window.duration_s, SLO())
    assert figures.steady_share is not None and 0.5 < figures.steady_share < 1.0
    assert figures.steady_output_throughput is not None and figures.steady_output_throughput > 0
    assert steady_window(LoadLevel(LoadKind.RATE, 5.0), window.records) is None


class CountingServer(FakeServer):
    """Also keeps the in-flight count over time and the headers it was sent."""

    def __init__(self, delay_s: float = 0.02) -> None:
        super().__init__(delay_s)
        self.timeline: list[tuple[float, int]] = []
        self.auth: set[str | None] = set()

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        self.auth.add(request.headers.get("Authorization"))
        self.timeline.append((time.perf_counter(), self.in_flight + 1))
        try:
            return await super().__call__(request)
        finally:
            self.timeline.append((time.perf_counter(), self.in_flight))


async def test_a_sharded_closed_loop_keeps_exactly_c_in_flight_in_total() -> None:
    server = CountingServer(delay_s=0.03)
    level = LoadLevel(LoadKind.CONCURRENCY, 5, num_requests=40)
    conn = Connection(headers=(("Authorization", "Bearer k"),))
    async with _client(server) as (_, base):
        window = await run_sharded(base, [COMPLETION, CHAT], level, SETTINGS, 2, connection=conn)
    assert split_concurrency(5, 2) == [3, 2]
    assert server.peak == 5 and server.auth == {"Bearer k"}
    # Every record exact: 40 requests, the sample taken cyclically once over, five tokens each in 4 chunks.
    assert len(window.records) == 40 and all(r.ok for r in window.records)
    assert sorted(r.index for r in window.records) == [0] * 20 + [1] * 20
    assert all([c.tokens for c in r.chunks] == [1, 2, 1, 1] and r.output_tokens == 5 for r in window.records)
    # From the 5th send to the last one the two processes together hold 5 in flight (one counter for both).
    begin, end = steady_window(level, window.records) or (0.0, 0.0)
    overlap = sum(max(0.0, min(r.end, end) - max(r.start, begin)) for r in window.records)
    assert 4.5 <= overlap / (end - begin) <= 5.0 + 1e-9
    inside = [n for t, n in server.timeline if begin + 0.01 < t < end - 0.01]
    assert inside and max(inside) == 5
    assert window.health is not None and not window.stopped


async def test_a_sharded_open_loop_deals_one_schedule() -> None:
    server = CountingServer(delay_s=0.2)
    level = LoadLevel(LoadKind.RATE, 40.0, num_requests=16)
    async with _client(server) as (_, base):
        window = await run_sharded(base, [COMPLETION], level, SETTINGS, 2)
    assert len(window.records) == 16 and all(r.ok for r in window.records)
    sent = sorted(r.start for r in window.records)
    planned = arrival_offsets(level, [COMPLETION] * 16, SETTINGS.seed)
    t0 = sent[0] - planned[0]
    assert all(abs((s - t0) - p) < 0.03 for s, p in zip(sent, planned, strict=True))
    assert server.peak > 3  # arrivals do not wait for completions


async def test_a_sharded_window_stops_on_request() -> None:
    server = CountingServer(delay_s=30.0)
    level = LoadLevel(LoadKind.CONCURRENCY, 4, num_requests=100)
    t = time.perf_counter()
    async with _client(server) as (_, base):
        window = await run_sharded(
            base, [COMPLETION], level, SETTINGS, 2, should_stop=lambda: time.perf_counter() - t > 3
        )
    assert window.stopped and window.records == ()


@contextlib.contextmanager
def _hogs(core: int, n: int = 3) -> Iterator[None]:
    """``n`` busy loops pinned to ``core`` (as ``taskset -c core``) for the block's duration."""
    code = f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]
    try:
        time.sleep(0.3)  # pinned and spinning before the window starts
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _last_core() -> int:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores: one for the client, one for the server under test")
    return cores[-1]


async def _measure(server: FakeServer, clients: Clients) -> Measured:
    """Measure with the client processes on their cores and this thread (the fake server's loop) off them."""
    level = LoadLevel(LoadKind.CONCURRENCY, 8, num_requests=300, warmup_requests=8)
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, mine - set(clients.cpus or ()))  # this thread only (Linux: pid 0 is the caller)
    try:
        async with _client(server) as (session, base), make_client() as control:
            return await measure_level(
                control,
                session,
                Target(base, None),
                [COMPLETION],
                level,
                SETTINGS,
                slo=SLO(),
                num_speculative_tokens=0,
                clients=clients,
            )
    finally:
        os.sched_setaffinity(0, mine)


async def test_a_starved_client_is_remeasured_with_more_processes_and_stays_marked() -> None:
    """Client processes pinned to one core beside three busy loops (a co-tenant hogging the client's core):
    the window is client-bound, measured again from two processes, and still marked, saying how many tried."""
    core = _last_core()
    with _hogs(core):
        measured = await _measure(CountingServer(delay_s=0.005), Clients(1, 2, (core,)))
    lr = measured.result
    assert measured.client_processes == 2 and lr.client_processes == 2
    assert lr.client_bound and lr.client_bound_reason is not None
    assert "(2 client processes)" in lr.client_bound_reason, lr.client_bound_reason
    assert lr.num_requests == 300 and lr.errors == 0  # the figures are still there, marked
    assert lr.spec_decode is None and lr.gauge_samples == 0  # no metrics URL: acceptance unknown, not guessed


async def test_the_same_pinned_client_without_a_co_tenant_is_quiet() -> None:
    core = _last_core()
    measured = await _measure(CountingServer(delay_s=0.005), Clients(1, 2, (core,)))
    assert not measured.result.client_bound, measured.result.client_bound_reason
    assert measured.client_processes == 1 and measured.result.num_requests == 300
