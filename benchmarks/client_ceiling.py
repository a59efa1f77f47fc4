"""How fast can the load generator go? Our replay against ``vllm bench serve`` on a server faster than both.

    python -m benchmarks.client_ceiling --tokenizer DIR [--vllm-python PY] [--concurrency 16 64 256]
                                        [--output-len 64] [--runs 2] [--server-core 0] [--client-core 1] [--check]

The server is ``benchmarks/fake_server/fast_openai.js`` (Node, one process pinned to ``--server-core``): it
answers each request with ``output-len`` one-token SSE events at once, so the client is the bottleneck. Each
client runs in its own process pinned to ``--client-core``, alternately, on the same server and the same
request count; both send completions with ``ignore_eos``. Events are counted by the server and by each
client (every event of ours is checked: each record must hold exactly ``output-len`` tokens).

``vllm bench serve`` needs a tokenizer for its random dataset (``--tokenizer``: any local HF tokenizer
directory, e.g. the tiny test model ``tests/workers/make_tiny_model.py`` builds). ``--check`` exits 1 when
our tok/s is below vllm bench's at any concurrency (the median of ``--runs`` runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tuner.domain import LoadLevel, TrafficFormat, TrafficRequest
from tuner.workers.options import default_vllm_python
from tuner.workers.replay import ReplaySettings, run_level, stream_client

SERVER_JS = Path(__file__).parent / "fake_server" / "fast_openai.js"


def _pinned(core: int | None, argv: list[str]) -> list[str]:
    return ["taskset", "-c", str(core), *argv] if core is not None and shutil.which("taskset") else argv


async def _ours(base: str, concurrency: int, n: int, output_len: int) -> dict:
    reqs = [TrafficRequest(TrafficFormat.COMPLETIONS, prompt=f"p{i}", output_tokens=output_len) for i in range(64)]
    level = LoadLevel(value=concurrency, num_requests=n)
    async with stream_client() as client:
        cpu0 = time.process_time()
        window = await run_level(client, base, reqs, level, ReplaySettings(model="m"))
        cpu = time.process_time() - cpu0
    bad = [r for r in window.records if not r.ok or r.num_output_tokens != output_len]
    if bad:
        raise SystemExit(f"{len(bad)} records wrong, e.g. {bad[0]}")
    tokens = sum(r.num_output_tokens for r in window.records)
    return {
        "tok_s": tokens / window.duration_s,
        "req_s": len(window.records) / window.duration_s,
        "events": sum(len(r.chunks) for r in window.records),
        "client_cpu_share": cpu / window.duration_s,
    }


def _run_ours(base: str, c: int, n: int, output_len: int, core: int | None) -> dict:
    argv = [sys.executable, "-m", "benchmarks.client_ceiling", "--ours-only", base, str(c), str(n), str(output_len)]
    out = subprocess.run(_pinned(core, argv), capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_vllm_bench(
    python: str, tokenizer: str, base: str, c: int, n: int, output_len: int, core: int | None, tmp: Path
) -> dict:
    name = f"bench-{c}-{time.monotonic_ns()}.json"
    argv = [
        python, "-m", "vllm.entrypoints.cli.main", "bench", "serve",
        "--backend", "vllm", "--base-url", base, "--endpoint", "/v1/completions",
        "--model", "m", "--tokenizer", tokenizer,
        "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", str(output_len),
        "--ignore-eos", "--num-prompts", str(n), "--max-concurrency", str(c), "--request-rate", "inf",
        "--save-result", "--result-dir", str(tmp), "--result-filename", name, "--disable-tqdm",
    ]  # fmt: skip
    env = os.environ | {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run(_pinned(core, argv), capture_output=True, text=True, check=True, timeout=900, env=env)
    data = json.loads((tmp / name).read_text())
    return {"tok_s": data["output_throughput"], "req_s": data["request_throughput"]}


def _stats(base: str) -> dict:
    return httpx.get(f"{base}/stats", timeout=10).json()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--ours-only":
        base, c, n, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        print(json.dumps(asyncio.run(_ours(base, c, n, out))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--vllm-python", default=str(default_vllm_python()))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--num-prompts", type=int, default=0, help="per level; default max(1000, 5 x concurrency)")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--server-core", type=int, default=0)
    ap.add_argument("--client-core", type=int, default=1)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()

    port = 18000 + os.getpid() % 1000
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(_pinned(args.server_core, ["node", str(SERVER_JS), str(port)]), stdout=subprocess.PIPE)
    assert server.stdout is not None
    server.stdout.readline()
    rows = []
    ok = True
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for c in args.concurrency:
                n = args.num_prompts or max(1000, 5 * c)
                ours, bench = [], []
                for _ in range(args.runs):  # alternating, so drift hits both
                    before = _stats(base)
                    o = _run_ours(base, c, n, args.output_len, args.client_core)
                    sent = _stats(base)["events"] - before["events"]
                    assert o["events"] == sent - n, (o["events"], sent)  # every token event seen (usage aside)
                    ours.append(o)
                    bench.append(
                        _run_vllm_bench(
                            args.vllm_python, args.tokenizer, base, c, n, args.output_len, args.client_core, Path(tmp)
                        )
                    )
                o_tok = statistics.median(x["tok_s"] for x in ours)
                b_tok = statistics.median(x["tok_s"] for x in bench)
                o_req = statistics.median(x["req_s"] for x in ours)
                b_req = statistics.median(x["req_s"] for x in bench)
                cpu = statistics.median(x["client_cpu_share"] for x in ours)
                rows.append((c, n, b_tok, o_tok, o_tok / b_tok, b_req, o_req, cpu))
                ok &= o_tok >= b_tok
    finally:
        server.terminate()
        server.wait(10)
    print(f"one-token SSE events, {args.output_len} per request; client pinned to core {args.client_core}, "
          f"server to core {args.server_core}; median of {args.runs} alternating runs")  # fmt: skip
    print(
        "| concurrency | requests | vllm bench tok/s | ours tok/s | ratio | vllm bench req/s | ours req/s | our CPU |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for c, n, b_tok, o_tok, ratio, b_req, o_req, cpu in rows:
        print(f"| {c} | {n} | {b_tok:,.0f} | {o_tok:,.0f} | {ratio:.2f} | {b_req:,.1f} | {o_req:,.1f} | {cpu:.0%} |")
    if args.check and not ok:
        print("FAIL: our client is slower than vllm bench serve at some concurrency", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
