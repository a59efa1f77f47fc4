"""The load generator against an in-process stand-in for the OpenAI API (aiohttp.web on a real socket)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from tuner.domain import SLO, LoadKind, LoadLevel, TrafficFormat, TrafficRequest
from tuner.workers.replay import ReplaySettings, arrival_offsets, build_request, run_level, send_one, stream_client
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
    assert body == {
        "model": "m", "prompt": "p", "max_tokens": 5, "ignore_eos": True, "temperature": 0.7,
        "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True,
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
