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

import asyncio
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from tuner.domain import SLO, LevelResult, LoadLevel, to_jsonable
from tuner.load_levels import DEFAULT_WARMUP_REQUESTS
from tuner.workers.measure import Clients, Target, measure_level
from tuner.workers.replay import Connection, ReplaySettings, make_client, stream_client
from tuner.workers.trial_cli import (
    Concurrency,
    LoadArgs,
    NumRequests,
    Rate,
    Timestamps,
    Warmup,
    format_level,
    load_levels,
)

API_KEY_ENV = "OPENAI_API_KEY"  # what `vllm bench serve` and the OpenAI clients read


@dataclass(frozen=True, kw_only=True)
class BenchArgs(LoadArgs):
    """``tuner bench``'s flags."""

    base_url: str
    model: str
    traffic: Path
    metrics_url: str | None = None
    api_key: str | None = None
    header: list[str] | None = None
    insecure: bool = False
    ca_cert: str | None = None
    max_requests: int = 5000
    client_processes: int = 1
    max_client_processes: int | None = None
    token_ids: bool = False
    no_ignore_eos: bool = False
    timeout: float = 600.0
    json: bool = False


def register(app: typer.Typer) -> None:
    """Add ``tuner bench`` to ``app``."""

    @app.command("bench", help="Measure a running OpenAI-compatible server with the trial harness.")
    def bench_command(
        base_url: Annotated[str, typer.Option(help="the server, e.g. https://llm.internal:8000")],
        model: Annotated[str, typer.Option(help="the served model name")],
        traffic: Annotated[Path, typer.Option(help="JSONL / JSON / ShareGPT traffic sample")],
        concurrency: Concurrency = None,
        rate: Rate = None,
        timestamps: Timestamps = False,
        num_requests: NumRequests = None,
        warmup: Warmup = DEFAULT_WARMUP_REQUESTS,
        metrics_url: Annotated[
            str | None, typer.Option(help="base URL of the same server's /metrics (omit: unknown)")
        ] = None,
        api_key: Annotated[str | None, typer.Option(help=f"sent as a bearer token (default: ${API_KEY_ENV})")] = None,
        header: Annotated[
            list[str] | None, typer.Option(help="an extra request header, 'Name: value' (repeatable)")
        ] = None,
        insecure: Annotated[
            bool, typer.Option("--insecure", help="do not verify the server's TLS certificate")
        ] = False,
        ca_cert: Annotated[str | None, typer.Option(help="a CA bundle to verify the server's certificate with")] = None,
        max_requests: Annotated[int, typer.Option(help="refuse to send more than this in all")] = 5000,
        client_processes: Annotated[int, typer.Option(help="client processes per window")] = 1,
        max_client_processes: Annotated[int | None, typer.Option(help="re-measure a client-bound window up to")] = None,
        token_ids: Annotated[
            bool,
            typer.Option(
                "--token-ids",
                help="ask for token ids (exact tokens per chunk, per-token ITL; vLLM only); costs the server some work",
            ),
        ] = False,
        no_ignore_eos: Annotated[
            bool, typer.Option("--no-ignore-eos", help="let outputs end at EOS (non-vLLM servers)")
        ] = False,
        timeout: Annotated[float, typer.Option(help="per-request timeout (s)")] = 600.0,
        json_out: Annotated[bool, typer.Option("--json", help="print the figures as JSON")] = False,
    ) -> None:
        if insecure and ca_cert:
            raise typer.BadParameter("--insecure and --ca-cert are alternatives: give one", param_hint="--insecure")
        args = BenchArgs(
            concurrency=concurrency,
            rate=rate,
            timestamps=timestamps,
            num_requests=num_requests,
            warmup=warmup,
            base_url=base_url,
            model=model,
            traffic=traffic,
            metrics_url=metrics_url,
            api_key=api_key,
            header=header,
            insecure=insecure,
            ca_cert=ca_cert,
            max_requests=max_requests,
            client_processes=client_processes,
            max_client_processes=max_client_processes,
            token_ids=token_ids,
            no_ignore_eos=no_ignore_eos,
            timeout=timeout,
            json=json_out,
        )
        args.check()
        raise typer.Exit(run(args))


def connection(args: BenchArgs) -> Connection:
    headers: list[tuple[str, str]] = []
    key = args.api_key or os.environ.get(API_KEY_ENV)
    if key:
        headers.append(("Authorization", f"Bearer {key}"))
    for h in args.header or ():
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            raise typer.BadParameter(f"--header wants 'Name: value', got {h!r}", param_hint="--header")
        headers.append((name.strip(), value.strip()))
    return Connection(tuple(headers), verify_tls=not args.insecure, ca_file=args.ca_cert)


async def bench(args: BenchArgs, levels: tuple[LoadLevel, ...], requests: list[Any]) -> list[LevelResult]:
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


def run(args: BenchArgs) -> int:
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
