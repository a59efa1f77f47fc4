"""``tuner bench``: measure an already-running OpenAI-compatible server with the trial harness.

    tuner bench --base-url URL --model NAME --traffic FILE (--concurrency N [N ...] | --rate R [R ...])
                [--metrics-url URL] [--api-key KEY] [--header 'Name: value' ...] [--insecure | --ca-cert FILE]
                [--num-requests M] [--max-requests CAP] [--client-processes P] [--json]

The figures are those ``tuner trial`` prints (the same replay, definitions and client-health checks), with no
server launched. People point it at production, so it sends at most ``--max-requests`` requests in all and
scrapes ``/metrics`` only from ``--metrics-url``: behind a load balancer ``<base-url>/metrics`` is whichever
replica answered, so without ``--metrics-url`` acceptance is reported as unknown rather than guessed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from tuner.domain import SLO, LevelResult, LoadLevel, to_jsonable
from tuner.workers.measure import Clients, Target, measure_level
from tuner.workers.replay import Connection, ReplaySettings, make_client, stream_client
from tuner.workers.trial_cli import add_load_arguments, format_level, load_levels

API_KEY_ENV = "OPENAI_API_KEY"  # what `vllm bench serve` and the OpenAI clients read


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add the ``bench`` subcommand; its ``func`` default takes the parsed args and returns an exit code."""
    p = subparsers.add_parser("bench", help="measure a running OpenAI-compatible server with the trial harness")
    p.add_argument("--base-url", required=True, help="the server, e.g. https://llm.internal:8000")
    p.add_argument("--model", required=True, help="the served model name")
    p.add_argument("--traffic", required=True, type=Path, help="JSONL / JSON / ShareGPT traffic sample")
    add_load_arguments(p)
    p.add_argument("--metrics-url", default=None, help="base URL of the same server's /metrics (omit: unknown)")
    p.add_argument("--api-key", default=None, help=f"sent as a bearer token (default: ${API_KEY_ENV})")
    p.add_argument("--header", action="append", default=[], help="an extra request header, 'Name: value'")
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--insecure", action="store_true", help="do not verify the server's TLS certificate")
    tls.add_argument("--ca-cert", default=None, help="a CA bundle to verify the server's certificate with")
    p.add_argument("--max-requests", type=int, default=5000, help="refuse to send more than this in all")
    p.add_argument("--client-processes", type=int, default=1, help="client processes per window")
    p.add_argument("--max-client-processes", type=int, default=None, help="re-measure a client-bound window up to")
    p.add_argument(
        "--token-ids",
        action="store_true",
        help="ask for token ids (exact tokens per chunk, per-token ITL; vLLM only); costs the server some work",
    )
    p.add_argument("--no-ignore-eos", action="store_true", help="let outputs end at EOS (non-vLLM servers)")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout (s)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(func=run)
    return p


def connection(args: argparse.Namespace) -> Connection:
    headers: list[tuple[str, str]] = []
    key = args.api_key or os.environ.get(API_KEY_ENV)
    if key:
        headers.append(("Authorization", f"Bearer {key}"))
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise SystemExit(f"tuner bench: --header wants 'Name: value', got {h!r}")
        headers.append((name.strip(), value.strip()))
    return Connection(tuple(headers), verify_tls=not args.insecure, ca_file=args.ca_cert)


async def bench(args: argparse.Namespace, levels: tuple[LoadLevel, ...], requests: list[Any]) -> list[LevelResult]:
    target = Target(
        args.base_url.rstrip("/"), args.metrics_url.rstrip("/") if args.metrics_url else None, connection(args)
    )
    settings = ReplaySettings(
        model=args.model,
        ignore_eos=not args.no_ignore_eos,
        request_timeout_s=args.timeout,
        return_token_ids=args.token_ids,
    )
    first = max(1, args.client_processes)
    clients = Clients(first, max(first, args.max_client_processes or first))
    out = []
    async with (
        make_client(args.timeout, target.connection) as control,
        stream_client(args.timeout, target.connection) as streams,
    ):
        for level in levels:
            measured = await measure_level(
                control,
                streams,
                target,
                requests,
                level,
                settings,
                slo=SLO(),
                num_speculative_tokens=0,
                clients=clients,
            )
            out.append(measured.result)
    return out


def format_bench(base_url: str, results: list[LevelResult], metrics: bool) -> str:
    lines = [f"bench {base_url}"]
    for lr in results:
        lines.extend(format_level(lr))
    if not metrics:
        lines.append("  acceptance: unknown (no --metrics-url; behind a load balancer /metrics is one replica's)")
    elif all(lr.spec_decode is None for lr in results):
        lines.append("  acceptance: none reported (the server exposes no spec-decode counters: no speculation)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from tuner.traffic import parse_traffic

    levels = load_levels(args)
    total = sum(level.num_requests + level.warmup_requests for level in levels)
    if total > args.max_requests:
        print(
            f"tuner bench: {total} requests planned ({len(levels)} levels), over --max-requests {args.max_requests}",
            file=sys.stderr,
        )
        return 2
    requests = parse_traffic(args.traffic.read_bytes(), args.traffic.name)
    results = asyncio.run(bench(args, levels, requests))
    if args.json:
        doc = {"base_url": args.base_url, "model": args.model, "metrics": args.metrics_url is not None}
        doc["levels"] = [to_jsonable(lr) for lr in results]
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_bench(args.base_url, results, args.metrics_url is not None))
    return 0 if all(lr.num_requests for lr in results) else 1
