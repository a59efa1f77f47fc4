"""Probe: TTFT and e2e of our replay client against a raw blocking socket, on one real vLLM server.

    .venv/bin/python benchmarks/ttft_probe.py <model dir> [--vllm-python PATH]

Starts one CPU vLLM server (about 2 minutes here), sends 64-token streaming completions sequentially through a
plain socket and through ``tuner.workers.replay.send_one`` (at concurrency 1 and 4), and prints the times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from tuner.domain import TrafficFormat, TrafficRequest
from tuner.workers.options import CPU_SERVER_ENV, default_vllm_python
from tuner.workers.replay import ReplaySettings, send_one, stream_client
from tuner.workers.vllm_server import VllmServer, free_port

PROMPT = "def fibonacci(n):\n    a, b = 0, 1\n" * 3


def raw_request(port: int, model: str) -> tuple[float, float]:
    """(TTFT ms, e2e ms) of one streaming completion over a blocking socket, no HTTP library."""
    body = json.dumps(
        {"model": model, "prompt": PROMPT, "max_tokens": 64, "ignore_eos": True, "stream": True, "temperature": 0}
    ).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    sock.sendall(head.encode() + b"\r\n\r\n" + body)
    buf, first = b"", None
    while b"[DONE]" not in buf:
        data = sock.recv(65536)
        if not data:
            break
        if first is None and b"data:" in data:
            first = time.perf_counter()
        buf += data
    sock.close()
    end = time.perf_counter()
    return ((first or end) - t0) * 1000, (end - t0) * 1000


async def ours(base: str, model: str, concurrency: int) -> list[tuple[float, float]]:
    req = TrafficRequest(TrafficFormat.COMPLETIONS, prompt=PROMPT, output_tokens=64)
    settings = ReplaySettings(model=model)
    async with stream_client() as client:
        recs = await asyncio.gather(*(send_one(client, base, i, req, settings) for i in range(concurrency)))
    return [((r.chunks[0].t - r.start) * 1000, (r.end - r.start) * 1000) for r in recs if r.chunks]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--vllm-python", default=default_vllm_python())
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ttft-probe-"))
    port = free_port()
    argv = [
        args.vllm_python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        args.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--max-model-len",
        "512",
    ]
    env = {**os.environ, **CPU_SERVER_ENV, "VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}
    with VllmServer(argv, port=port, log_path=tmp / "server.log", env=env) as server:
        server.wait_ready(600)
        for _ in range(3):  # warm-up
            raw_request(port, args.model)
        fmt = lambda pairs: ", ".join(f"{a:.1f}/{b:.1f}" for a, b in pairs)  # noqa: E731
        print("TTFT/e2e ms, raw socket, sequential:", fmt([raw_request(port, args.model) for _ in range(5)]))
        print(
            "TTFT/e2e ms, replay, c1:",
            fmt([p for _ in range(5) for p in asyncio.run(ours(server.base_url, args.model, 1))]),
        )
        for _ in range(3):
            print("TTFT/e2e ms, replay, c4:", fmt(asyncio.run(ours(server.base_url, args.model, 4))))


if __name__ == "__main__":
    main()
