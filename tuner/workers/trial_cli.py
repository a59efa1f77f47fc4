"""``tuner trial``: run one trial from the command line and print its figures.

    tuner trial --model M --traffic FILE [--speculative-config JSON]
                [--concurrency N [N ...] | --rate R [R ...]] [--num-requests M] [--json]

The traffic file is JSONL of ``{"prompt", "output_tokens"}`` or OpenAI chat requests, or ShareGPT JSON
(anything :func:`tuner.traffic.parse_traffic` accepts). Each ``--concurrency``/``--rate`` value is one
load level, all measured on one server launch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from tuner.domain import (
    Evaluator,
    LevelResult,
    LoadKind,
    LoadLevel,
    ModelRef,
    ServingConfig,
    SpecConfig,
    TrialContext,
    TrialResult,
    TrialSpec,
    to_jsonable,
)
from tuner.load_levels import DEFAULT_NUM_REQUESTS, DEFAULT_WARMUP_REQUESTS, REQUESTS_PER_SLOT, window_requests
from tuner.settings import parse_cpu_list
from tuner.workers.options import CPU_SERVER_ENV, RunnerOptions, default_client_cpus

# The load flags, as ``tuner trial`` and ``tuner bench`` both take them. A list flag takes its values
# space-separated (``--concurrency 1 8``, as under argparse) or repeated (``--concurrency 1 --concurrency 8``).
Concurrency = Annotated[
    list[int] | None, typer.Option(help="closed-loop levels (requests in flight), e.g. --concurrency 1 8")
]
Rate = Annotated[list[float] | None, typer.Option(help="open-loop Poisson levels (requests/s), e.g. --rate 2 8")]
Timestamps = Annotated[bool, typer.Option("--timestamps", help="replay at the sample's own arrival times")]
NumRequests = Annotated[
    int | None,
    typer.Option(
        help=f"measured requests per level (default: {DEFAULT_NUM_REQUESTS}, or {REQUESTS_PER_SLOT} x the "
        "concurrency when more, so most of the window is steady state)"
    ),
]
Warmup = Annotated[int, typer.Option(help="warm-up requests per level")]
LIST_FLAGS = ("--concurrency", "--rate")


@dataclass(frozen=True)
class LoadArgs:
    concurrency: list[int] | None = None
    rate: list[float] | None = None
    timestamps: bool = False
    num_requests: int | None = None
    warmup: int = DEFAULT_WARMUP_REQUESTS

    def check(self) -> None:
        """--concurrency, --rate and --timestamps are alternatives (argparse's exclusive group did this)."""
        given = [f for f, v in (("--concurrency", self.concurrency), ("--rate", self.rate)) if v]
        given += ["--timestamps"] if self.timestamps else []
        if len(given) > 1:
            raise typer.BadParameter(f"{' and '.join(given)} are alternatives: give one", param_hint=given[0])


@dataclass(frozen=True, kw_only=True)
class TrialArgs(LoadArgs):
    """``tuner trial``'s flags."""

    model: str
    traffic: Path
    speculative_config: str | None = None
    serving: str = "{}"
    gpu_ids: str | None = None
    engine: str = "vllm"
    vllm_command: str | None = None
    vllm_python: str | None = None
    cpu: bool = False
    log_dir: str | None = None
    startup_timeout: float = 900.0
    client_processes: int = 1
    max_client_processes: int | None = None
    client_cpus: str = "auto"
    json: bool = False


def register(app: typer.Typer, *, vllm_executable: Callable[[], str | None] = lambda: None) -> None:
    """Add ``tuner trial`` to ``app``. ``vllm_executable`` is asked for ``TUNER_VLLM_EXECUTABLE`` when the
    command runs (settings are read then, not at import)."""

    @app.command("trial", help="Run one server configuration at one or more load levels and print its figures.")
    def trial(
        model: Annotated[str, typer.Option(help="HF id or local path of the target model")],
        traffic: Annotated[Path, typer.Option(help="JSONL / JSON / ShareGPT traffic sample")],
        speculative_config: Annotated[
            str | None, typer.Option(help="vLLM speculative config as JSON (omit: none)")
        ] = None,
        concurrency: Concurrency = None,
        rate: Rate = None,
        timestamps: Timestamps = False,
        num_requests: NumRequests = None,
        warmup: Warmup = DEFAULT_WARMUP_REQUESTS,
        serving: Annotated[str, typer.Option(help='vLLM serving args as JSON, e.g. {"max_model_len": 4096}')] = "{}",
        gpu_ids: Annotated[str | None, typer.Option(help="comma-separated physical GPU ids")] = None,
        engine: Annotated[Literal["vllm", "simulated"], typer.Option()] = "vllm",
        vllm_command: Annotated[
            str | None, typer.Option(help='server argv prefix as JSON, e.g. ["vllm", "serve"]')
        ] = None,
        vllm_python: Annotated[str | None, typer.Option(help="python of the vLLM venv (module entry point)")] = None,
        cpu: Annotated[bool, typer.Option("--cpu", help="add the environment vLLM needs on a CPU-only host")] = False,
        log_dir: Annotated[str | None, typer.Option()] = None,
        startup_timeout: Annotated[float, typer.Option()] = 900.0,
        client_processes: Annotated[int, typer.Option(help="client processes per window")] = 1,
        max_client_processes: Annotated[int | None, typer.Option(help="re-measure a client-bound window up to")] = None,
        client_cpus: Annotated[
            str,
            typer.Option(
                help="cores for the clients, e.g. 6-7 (the server gets the rest); auto: the last quarter of this "
                "host's cores (1-8); none: no pinning"
            ),
        ] = "auto",
        json_out: Annotated[bool, typer.Option("--json", help="print the TrialResult as JSON")] = False,
    ) -> None:
        args = TrialArgs(
            concurrency=concurrency,
            rate=rate,
            timestamps=timestamps,
            num_requests=num_requests,
            warmup=warmup,
            model=model,
            traffic=traffic,
            speculative_config=speculative_config,
            serving=serving,
            gpu_ids=gpu_ids,
            engine=engine,
            vllm_command=vllm_command,
            vllm_python=vllm_python,
            cpu=cpu,
            log_dir=log_dir,
            startup_timeout=startup_timeout,
            client_processes=client_processes,
            max_client_processes=max_client_processes,
            client_cpus=client_cpus,
            json=json_out,
        )
        args.check()
        raise typer.Exit(run(args, vllm_executable=vllm_executable()))


def load_levels(args: LoadArgs) -> tuple[LoadLevel, ...]:
    n, warmup = args.num_requests, args.warmup
    fixed = n if n is not None else DEFAULT_NUM_REQUESTS
    if args.rate:
        return tuple(LoadLevel(LoadKind.RATE, r, num_requests=fixed, warmup_requests=warmup) for r in args.rate)
    if args.timestamps:
        return (LoadLevel(LoadKind.TIMESTAMPS, 0.0, num_requests=fixed, warmup_requests=warmup),)
    return tuple(
        LoadLevel(
            LoadKind.CONCURRENCY, c, num_requests=fixed if n is not None else window_requests(c), warmup_requests=warmup
        )
        for c in args.concurrency or [1]
    )


def build_trial(args: TrialArgs) -> TrialSpec:
    from tuner.traffic import parse_traffic

    requests = parse_traffic(args.traffic.read_bytes(), args.traffic.name)
    spec = SpecConfig.from_vllm(json.loads(args.speculative_config) if args.speculative_config else None)
    gpu_ids = tuple(int(x) for x in args.gpu_ids.split(",")) if args.gpu_ids else None
    return TrialSpec(
        model=ModelRef(args.model),
        spec=spec,
        levels=load_levels(args),
        requests=tuple(requests),
        serving=ServingConfig(args=json.loads(args.serving)),
        gpu_ids=gpu_ids,
    )


def evaluator(args: TrialArgs, *, vllm_executable: str | None = None) -> Evaluator:
    """The trial's evaluator. The server starts as ``--vllm-command`` says, else as ``vllm_executable serve``
    (``TUNER_VLLM_EXECUTABLE``, as the service does), else by vLLM's module entry point of ``--vllm-python``
    (default ``TUNER_VLLM_PYTHON``)."""
    if args.engine == "simulated":
        from tuner.workers.simulated import SimulatedEngine

        return SimulatedEngine()
    from tuner.workers.vllm_runner import VllmRunner

    return VllmRunner(
        RunnerOptions(
            vllm_command=(
                tuple(json.loads(args.vllm_command))
                if args.vllm_command
                else (vllm_executable, "serve")
                if vllm_executable
                else None
            ),
            vllm_python=args.vllm_python,
            log_dir=args.log_dir,
            startup_timeout_s=args.startup_timeout,
            extra_env=dict(CPU_SERVER_ENV) if args.cpu else {},
            client_processes=args.client_processes,
            max_client_processes=args.max_client_processes,
            client_cpus=_client_cpus(args.client_cpus),
        )
    )


def _client_cpus(text: str) -> tuple[int, ...] | None:
    mode = text.strip().lower()
    if mode == "auto":
        return default_client_cpus()
    return None if mode == "none" else parse_cpu_list(text)


def format_level(lr: LevelResult) -> list[str]:
    """A level's line, then its spec-decode figures and whether the client kept up."""
    row: list[Any] = [
        f"  {lr.level.label:>6}: {lr.output_throughput:8.1f} tok/s {lr.request_throughput:6.2f} req/s",
        f"TTFT p50/p99 {lr.ttft_ms.p50:.1f}/{lr.ttft_ms.p99:.1f} ms",
        f"TPOT mean {lr.tpot_ms.mean:.2f} ms ITL p99 {lr.itl_ms.p99:.2f} ms",
        f"errors {lr.errors}",
    ]
    if lr.achieved_concurrency is not None:
        flag = " BELOW TARGET" if lr.below_target else ""
        row.append(f"running {lr.achieved_concurrency:.1f}{flag}")
    lines = ["  ".join(row)]
    sd = lr.spec_decode
    if sd is not None:
        per_pos = ", ".join(f"{r:.2f}" for r in sd.per_position_rate)
        empty = f", empty steps {sd.empty_step_fraction:.0%}" if sd.empty_step_fraction is not None else ""
        lines.append(
            f"          acceptance rate {sd.acceptance_rate:.3f}, length {sd.acceptance_length:.2f},"
            f" per position [{per_pos}], {sd.mean_proposed_per_draft:.2f} proposed/draft{empty}"
        )
    if lr.steady_share is not None:
        lines.append(f"          steady state {lr.steady_share:.0%} of the window")
    if lr.client_bound:
        lines.append(f"          CLIENT-BOUND: {lr.client_bound_reason} - these figures are the client's ceiling")
    return lines


def format_summary(result: TrialResult) -> str:
    """A human-readable summary: one line per level, then spec-decode figures, correctness, failure."""
    lines = [
        f"trial {result.status.value}: {result.spec.label()} on {result.engine.value} {result.vllm_version or ''}"
        f" (startup {result.startup_s or 0:.1f} s, wall {result.wall_s or 0:.1f} s)".rstrip()
    ]
    for lr in result.levels:
        lines.extend(format_level(lr))
    c = result.correctness
    if c is not None and not c.gated:
        lines.append(f"  correctness: NOT GATED ({c.not_gated})")
    elif c is not None:
        lines.append(
            f"  correctness: {'passed' if c.passed else 'DIVERGED'} (median prefix {c.median_prefix_fraction:.2f},"
            f" identical {c.identical_fraction:.0%})"
        )
    if result.failure is not None:
        lines.append(f"  failure [{result.failure.cls.value}]: {result.failure.reason}")
    if result.log_path:
        lines.append(f"  log: {result.log_path}")
    return "\n".join(lines)


def run(args: TrialArgs, *, vllm_executable: str | None = None) -> int:
    from tuner.cli_progress import TrialView, stderr_console

    trial = build_trial(args)
    view = TrialView(stderr_console(), f"trial {trial.spec.label()}")
    result = evaluator(args, vllm_executable=vllm_executable)(trial, TrialContext(on_progress=view))
    if args.json:
        json.dump(to_jsonable(result), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_summary(result))
    return 0 if result.status.has_figures() else 1
