"""Our replay against ``vllm bench serve`` on the same real server and the same prompts.

    python benchmarks/replay_vs_vllm_bench.py --model DIR [--vllm-python PY] [--cpu] [--concurrency 4]

Starts one server (ngram k=3 by default), then, on it: our closed-loop replay of the prompts, and
``vllm bench serve --dataset-name custom --custom-output-len -1 --ignore-eos`` of the same JSONL. Both
windows are bracketed by /metrics scrapes, so each tool's acceptance length can be checked against the
server's own counters and against its log's "Mean acceptance length" lines. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tuner.domain import SLO, LoadKind, LoadLevel, ModelRef, ServingConfig, SpecConfig, TrafficFormat, TrafficRequest
from tuner.workers import vllm_metrics
from tuner.workers.options import CPU_SERVER_ENV, RunnerOptions
from tuner.workers.replay import ReplaySettings, make_client, run_level, stream_client
from tuner.workers.timing import summarize
from tuner.workers.vllm_server import VllmServer, build_serve_argv, free_port

METRICS = ("output_throughput", "mean_tpot_ms", "mean_ttft_ms", "mean_itl_ms")
_LOG_LINE = re.compile(r"Mean acceptance length: ([\d.]+).*?Accepted: (\d+) tokens, Drafted: (\d+) tokens")


def prompts(n: int, output_tokens: int) -> list[dict]:
    return [
        {
            "prompt": f"def handler_{i}(event):\n    return event['{i % 7}']\n" * (2 + i % 4),
            "output_tokens": output_tokens,
        }
        for i in range(n)
    ]


def log_acceptance(log_text: str) -> tuple[float | None, int]:
    """Mean acceptance length from the server log's interval lines (draft-weighted), and the line count."""
    lines = _LOG_LINE.findall(log_text)
    accepted = sum(int(a) for _, a, _ in lines)
    # Each line gives 1 + accepted/drafts for its interval: recover drafts to combine intervals exactly.
    drafts = sum(int(a) / (float(m) - 1) for m, a, _ in lines if float(m) > 1)
    return (1 + accepted / drafts if drafts else None), len(lines)


async def our_replay(base: str, model: str, items: list[dict], concurrency: int, token_ids: bool = False) -> dict:
    reqs = [
        TrafficRequest(TrafficFormat.COMPLETIONS, prompt=x["prompt"], output_tokens=x["output_tokens"]) for x in items
    ]
    level = LoadLevel(LoadKind.CONCURRENCY, concurrency, num_requests=len(reqs), warmup_requests=0)
    settings = ReplaySettings(model=model, return_token_ids=token_ids)
    async with make_client() as client, stream_client() as streams:
        before = await vllm_metrics.scrape(client, base)
        window = await run_level(streams, base, reqs, level, settings)
        after = await vllm_metrics.scrape(client, base)
    figures = summarize(level, window.records, window.duration_s, slo=SLO())
    sd = vllm_metrics.spec_decode_delta(before, after, 3)
    # The SSE events after the first (the prefill's token). At c1 each is one engine step of one request, and
    # a step yields 1 + the tokens accepted in it, so with token ids decode tokens - decode events are the
    # accepted tokens sent (the server's counter also holds those a stop trimmed, see main) and decode events
    # its decode steps (ngram drafts only where its n-gram matches, so tokens per event is not the acceptance
    # length, which is per drafted step).
    decode = [c.tokens for rec in window.records for c in rec.chunks[1:] if c.tokens > 0]
    return {
        "tokens_per_chunk": sum(decode) / len(decode) if decode and token_ids else None,
        "decode_events": len(decode) if token_ids else None,
        "decode_tokens": sum(decode) if token_ids else None,
        "accepted_tokens": sd.num_accepted_tokens if sd else None,
        "decode_steps": sd.decode_steps if sd else None,
        "output_throughput": figures.output_throughput,
        "mean_tpot_ms": figures.tpot_ms.mean,
        "mean_ttft_ms": figures.ttft_ms.mean,
        "mean_itl_ms": figures.itl_ms.mean,
        "acceptance_length": sd.acceptance_length if sd else None,
        "errors": figures.errors,
        "duration_s": window.duration_s,
    }


async def snapshot(base: str) -> vllm_metrics.MetricsSnapshot:
    async with httpx.AsyncClient(timeout=30) as client:
        return await vllm_metrics.scrape(client, base)


def vllm_bench(vllm_cli: list[str], base: str, model: str, dataset: Path, n: int, concurrency: int, out: Path) -> dict:
    cmd = [
        *vllm_cli, "bench", "serve", "--backend", "vllm", "--base-url", base, "--model", model,
        "--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", "-1",
        "--skip-chat-template", "--disable-shuffle", "--ignore-eos", "--num-prompts", str(n),
        "--max-concurrency", str(concurrency), "--request-rate", "inf", "--temperature", "0",
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", str(out.parent),
        "--result-filename", out.name, "--disable-tqdm",
    ]  # fmt: skip
    print("$", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return json.loads(out.read_text())


def run_bench(vllm_cli: list[str], base: str, model: str, dataset: Path, args: argparse.Namespace, out: Path) -> dict:
    """One ``vllm bench serve`` run, with our own /metrics diff over its window for comparison."""
    before = asyncio.run(snapshot(base))
    bench = vllm_bench(vllm_cli, base, model, dataset, args.num_prompts, args.concurrency, out)
    after = asyncio.run(snapshot(base))
    sd = vllm_metrics.spec_decode_delta(before, after, 3)
    return {
        "output_throughput": bench["output_throughput"],
        "mean_tpot_ms": bench["mean_tpot_ms"],
        "mean_ttft_ms": bench["mean_ttft_ms"],
        "mean_itl_ms": bench["mean_itl_ms"],
        "acceptance_length": bench.get("spec_decode_acceptance_length"),
        "metrics_acceptance_length": sd.acceptance_length if sd else None,
        "errors": bench.get("failed", 0),
        "duration_s": bench["duration"],
    }


def _cpus(text: str) -> set[int]:
    """'0', '0-3' or '0,2' -> a CPU set."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--vllm-python", default=None)
    p.add_argument("--cpu", action="store_true", help="CPU-only host: add VLLM_CPU_KVCACHE_SPACE etc.")
    p.add_argument(
        "--speculative-config", default='{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3}'
    )
    p.add_argument("--serving", default='{"max_model_len": 512, "enforce_eager": true}')
    p.add_argument("--num-prompts", type=int, default=160)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--repeats", type=int, default=6, help="run each tool this many times, the order rotating")
    p.add_argument("--settle", type=float, default=3.0, help="idle seconds before every run")
    p.add_argument(
        "--pin",
        nargs=2,
        metavar=("SERVER_CPUS", "CLIENT_CPUS"),
        help="CPU affinity, e.g. '0' '1': the server's processes on the first set, both load generators on the "
        "second, so neither client's own CPU cost is taken from the server (as on a GPU node with spare cores)",
    )
    args = p.parse_args()
    server_cpus, client_cpus = (_cpus(args.pin[0]), _cpus(args.pin[1])) if args.pin else (None, None)

    options = RunnerOptions(vllm_python=args.vllm_python)
    python = options.server_command()[0]
    vllm_cli = [python, "-m", "vllm.entrypoints.cli.main"]
    work = Path(tempfile.mkdtemp(prefix="replay-vs-bench-"))
    dataset = work / "prompts.jsonl"
    items = prompts(args.num_prompts, args.output_tokens)
    dataset.write_text("".join(json.dumps(x) + "\n" for x in items))
    spec = SpecConfig.from_vllm(json.loads(args.speculative_config))
    port = free_port()
    argv = build_serve_argv(
        ModelRef(args.model), ServingConfig(args=json.loads(args.serving)), spec, port, command=options.server_command()
    )
    env = {**os.environ, "VLLM_CACHE_ROOT": str(work / "cache")}
    if args.cpu:
        env.update(CPU_SERVER_ENV)
    if server_cpus is not None:
        # Children inherit the affinity at fork: the API server, EngineCore and its OpenMP threads (vLLM's
        # "auto" binding picks from the allowed CPUs) stay on server_cpus.
        env.update(VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, sorted(server_cpus))), VLLM_CPU_NUM_OF_RESERVED_CPU="0")
        os.sched_setaffinity(0, server_cpus)
    rows: list[tuple[int, str, dict]] = []
    with VllmServer(argv, port=port, log_path=work / "server.log", env=env) as server:
        server.wait_ready(900)
        if client_cpus is not None:
            os.sched_setaffinity(0, client_cpus)  # this process's replay and the vllm bench child it starts
        base = server.base_url
        asyncio.run(our_replay(base, args.model, items[: args.concurrency * 8], args.concurrency))  # warm-up
        tools = {
            "replay": lambda rep: asyncio.run(our_replay(base, args.model, items, args.concurrency)),
            "vllm bench": lambda rep: run_bench(vllm_cli, base, args.model, dataset, args, work / f"b{rep}.json"),
            "replay, token ids": lambda rep: asyncio.run(
                our_replay(base, args.model, items, args.concurrency, token_ids=True)
            ),
        }
        names = list(tools)
        for rep in range(args.repeats):
            # The order rotates each repeat and every run starts after the same idle pause: a fixed order let
            # a slot's position (what ran before it, how long the server idled) pass for a tool's difference.
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                time.sleep(args.settle)
                rows.append((rep, name, tools[name](rep)))
        time.sleep(11)  # let the server log its last interval's SpecDecoding line
        total = vllm_metrics.spec_decode_delta(vllm_metrics.MetricsSnapshot(), asyncio.run(snapshot(base)), 3)
        log_len, log_lines = log_acceptance(server.log_path.read_text(errors="replace"))

    pinned = f"; server on CPUs {sorted(server_cpus)}, clients on {sorted(client_cpus)}" if args.pin else ""
    print(f"vLLM {python}; {args.num_prompts} prompts x {args.output_tokens} tokens, concurrency {args.concurrency}, "
          f"{spec.label()}{pinned}; work dir {work}\n")  # fmt: skip
    print("| run | tool | output tok/s | mean TPOT ms | mean TTFT ms | mean ITL ms | acceptance length | errors |")
    print("|---|---|---|---|---|---|---|---|")
    for rep, tool, r in rows:
        acc = r["acceptance_length"]
        print(
            f"| {rep + 1} | {tool} | {r['output_throughput']:.1f} | {r['mean_tpot_ms']:.2f}"
            f" | {r['mean_ttft_ms']:.1f} | {r['mean_itl_ms']:.2f} | {acc:.3f} | {r['errors']} |"
        )
    med = {t: {k: statistics.median(r[k] for _, tt, r in rows if tt == t) for k in METRICS} for t in names}
    print()
    print("| tool (median of runs) | output tok/s | mean TPOT ms | ratio to vllm bench: tok/s | TPOT |")
    print("|---|---|---|---|---|")
    ref = med["vllm bench"]
    for t in names:
        m = med[t]
        print(
            f"| {t} | {m['output_throughput']:.1f} | {m['mean_tpot_ms']:.2f} | "
            f"{m['output_throughput'] / ref['output_throughput']:.3f} | {m['mean_tpot_ms'] / ref['mean_tpot_ms']:.3f} |"
        )
    print()
    by_rep = {(rep, t): r for rep, t, r in rows}
    for key in ("output_throughput", "mean_tpot_ms"):
        for tool in ("replay", "replay, token ids"):
            paired = [by_rep[rep, tool][key] / by_rep[rep, "vllm bench"][key] for rep in range(args.repeats)]
            print(f"- paired runs (same repeat), {tool} / vllm bench, {key}: " + ", ".join(f"{x:.2f}" for x in paired))
    for t in names:
        lengths = sorted({round(r["acceptance_length"], 4) for _, tt, r in rows if tt == t})
        print(f"- acceptance length, {t}: {lengths}")
    ids_rows = [r for _, t, r in rows if t == "replay, token ids" and r.get("decode_events")]
    per_chunk = [round(r["tokens_per_chunk"], 4) for r in ids_rows]
    print(f"- tokens per SSE event after the first, replay with token ids: {per_chunk}")
    for r in ids_rows:
        # vLLM counts a step's accepted drafts before a stop (max_tokens) trims them from the output, so the
        # counters exceed what was sent by the trimmed tokens: at most K per request, at the last step.
        sent = r["decode_tokens"] - r["decode_events"]
        print(
            f"  - decode tokens - decode events = {sent} accepted tokens sent; the counter {r['accepted_tokens']:.0f}"
            f" (+{r['accepted_tokens'] - sent:.0f} over {args.num_prompts} requests); decode events "
            f"{r['decode_events']}, the counters' step estimate {r['decode_steps']}"
        )
    bench_metrics = sorted({round(r["metrics_acceptance_length"], 4) for _, t, r in rows if t == "vllm bench"})
    print(f"- acceptance length from our /metrics diff over the vllm bench windows: {bench_metrics}")
    print(
        f"- whole run (warm-up included): /metrics counters {total.acceptance_length if total else 0:.4f}; "
        f"server log 'Mean acceptance length' lines ({log_lines}), draft-weighted: {log_len or 0:.4f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
