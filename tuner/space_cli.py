"""``tuner space``: the search space a job would get, and why each method and option is in or out.

Built by the same ``build_space`` a job's planner calls, from the same inputs: the model's config.json, the
job's methods and drafts, the compat table (with the server's own rules file), and the capabilities of the
vLLM the trials would run on: reported by the fleet's workers (``--server``, ``GET /workers``), else probed
from the local vLLM (``--vllm-python``, ``TUNER_VLLM_PYTHON``). Nothing is launched.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from tuner.domain import Method, VllmCapabilities
from tuner.settings import Settings

LIST_FLAGS = ("--methods",)


@dataclass(frozen=True, kw_only=True)
class SpaceArgs:
    model: str
    config: Path | None = None
    job: Path | None = None
    hardware: str | None = None
    methods: list[str] | None = None
    server: str | None = None
    token: str | None = None
    vllm_python: str | None = None
    json: bool = False


def register(app: typer.Typer, settings: Any) -> None:
    """Add ``tuner space`` to ``app``; ``settings`` makes the service's Settings when the command runs."""

    @app.command("space", help="Print the search space a job would get and why each option is in or out.")
    def space(
        model: Annotated[str, typer.Option(help="the target: HF id or local path")],
        config: Annotated[
            Path | None, typer.Option(help="the model's config.json (default: the model's directory or HF cache)")
        ] = None,
        job: Annotated[
            Path | None, typer.Option(help="a POST /tune body: its methods, drafts, depths and serving args apply")
        ] = None,
        hardware: Annotated[
            str | None, typer.Option(help="the chip family (default: the worker's, else this host's)")
        ] = None,
        methods: Annotated[list[Method] | None, typer.Option(help="e.g. --methods ngram suffix")] = None,
        server: Annotated[
            str | None, typer.Option(help="a spec-tuner URL: use what its workers reported (GET /workers)")
        ] = None,
        token: Annotated[
            str | None, typer.Option(help="API token (default: $TUNER_TOKEN, else the client config file)")
        ] = None,
        vllm_python: Annotated[
            str | None, typer.Option(help="without --server: the interpreter whose vLLM to probe")
        ] = None,
        json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    ) -> None:
        if methods and Method.OFF in methods:
            raise typer.BadParameter("off is always offered (the baseline); name the others", param_hint="--methods")
        args = SpaceArgs(
            model=model,
            config=config,
            job=job,
            hardware=hardware,
            methods=[m.value for m in methods] if methods else None,
            server=server,
            token=token,
            vllm_python=vllm_python,
            json=json_out,
        )
        raise typer.Exit(run(args, settings()))


def run(args: SpaceArgs, settings: Settings) -> int:
    from tuner.search import build_space, read_model_config
    from tuner.wiring import compat_rules

    try:
        job = json.loads(args.job.read_text()) if args.job else {}
        config = json.loads(args.config.read_text()) if args.config else None
    except (OSError, json.JSONDecodeError) as exc:
        print(f"tuner space: {exc}", file=sys.stderr)
        return 2
    if config is None:
        config = read_model_config(args.model, supplied=job.get("hf_config"))
    try:
        capabilities, hardware, origin = _capabilities(args)
    except RuntimeError as exc:
        print(f"tuner space: {exc}", file=sys.stderr)
        return 2
    search = job.get("search") or {}
    methods = args.methods or search.get("methods")
    serving = (job.get("serving") or {}).get("args") or {}
    space = build_space(
        args.model,
        config,
        hardware=hardware,
        vllm_version=capabilities.version if capabilities else None,
        methods=[Method(m) for m in methods] if methods else None,
        depth_range=tuple(search["depth_range"]) if search.get("depth_range") else None,
        drafts={Method(m): list(d) for m, d in (search.get("drafts") or {}).items()} or None,
        compat_overrides={Method(m): v for m, v in (search.get("compat_overrides") or {}).items()} or None,
        rules=compat_rules(settings),
        capabilities=capabilities,
        data_parallel_size=int(serving.get("data_parallel_size", 1)),
        attention_backends=_backends(search.get("attention_backends")),
        target_backend_pinned="attention_backend" in serving,
    )
    report = describe(space, origin=origin, config_found=config is not None)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def _backends(value: Any) -> str | dict[Method, str] | None:
    return {Method(m): b for m, b in value.items()} if isinstance(value, dict) else value


def _capabilities(args: SpaceArgs) -> tuple[VllmCapabilities | None, str, str]:
    """The capabilities to build for, the hardware, and where the capabilities came from."""
    if args.server:
        from tuner.client import ClientError, TunerClient
        from tuner.client_config import resolve

        try:
            token = resolve(args.server, args.token).token  # the flag, $TUNER_TOKEN, or the client config file
            with TunerClient(args.server, token) as client:
                workers = client.workers()
        except ClientError as exc:
            raise RuntimeError(f"{args.server}/workers: {exc}") from exc
        if args.hardware:
            workers = [w for w in workers if args.hardware in (w.get("families") or [w.get("hardware")])]
        reported = [w for w in workers if w.get("vllm_capabilities")]
        if not reported:
            which = f" for {args.hardware}" if args.hardware else ""
            raise RuntimeError(f"no worker{which} at {args.server} has reported its vLLM's capabilities")
        worker = reported[0]  # the most recently seen
        reported_caps = VllmCapabilities.from_dict(worker["vllm_capabilities"])
        return reported_caps, args.hardware or worker.get("hardware") or "auto", f"reported by worker {worker['name']}"
    from tuner.workers.hardware import worker_host_report
    from tuner.workers.options import default_vllm_python
    from tuner.workers.vllm_probe import ProbeError, probe_python

    python = args.vllm_python or default_vllm_python()
    try:
        caps: VllmCapabilities | None = probe_python(python)
        origin = f"probed from {caps.source if caps else python}"
    except ProbeError as exc:
        caps, origin = None, f"none: {exc}; the compat table alone decides"
    hardware = args.hardware or worker_host_report(python).get("hardware") or "auto"
    return caps, hardware, origin


def describe(space: Any, *, origin: str, config_found: bool) -> dict[str, Any]:
    """The space as a plain dict: what is offered, what is left out and why, the options' verdicts."""
    caps = space.capabilities
    verdicts: dict[str, dict[str, str | None]] = {}
    for v in space.option_verdicts:
        verdicts.setdefault(v.method.value, {})[v.option] = v.reason
    return {
        "model": space.model,
        "hardware": space.hardware,
        "vllm_version": space.vllm_version,
        "capabilities": origin,
        "config_json": "read" if config_found else "not found: MTP heads and drafter fit cannot be read",
        "schedule_field": space.schedule_field,
        "schedule_refused": space.schedule_refusal,
        "offered": [
            {
                "arm": o.key,
                "method": o.method.value,
                "adaptive": o.adaptive,
                "draft": o.draft,
                "source": o.source,
                "depths": list(o.depths),
                "lookups": [list(x) for x in o.lookups],
                "options": verdicts.get(o.method.value, {}),
            }
            for o in space.options
        ],
        "left_out": [{"method": e.method.value, "draft": e.draft, "reason": e.reason} for e in space.excluded],
        "unknown_methods": list(caps.unknown_methods) if caps else [],
        "notes": list(space.notes),
        "grid_size": space.grid_size,
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Search space for {report['model']} on {report['hardware']}, vLLM {report['vllm_version'] or 'unknown'}",
        f"  capabilities: {report['capabilities']}",
        f"  config.json: {report['config_json']}",
        "  per-batch-size schedule: "
        + (f"refused: {report['schedule_refused']}" if report["schedule_refused"] else report["schedule_field"]),
        "offered:",
    ]
    for arm in report["offered"]:
        what = arm["arm"] if arm["method"] == "off" else f"{arm['arm']} ({arm['source']})"
        detail = "" if arm["method"] == "off" else f"  K {','.join(map(str, arm['depths']))}"
        if arm["lookups"]:
            detail += "  lookups " + ",".join(f"{a}-{b}" for a, b in arm["lookups"])
        lines.append(f"  {what}{detail}")
        for option, reason in arm["options"].items():
            lines.append(f"      {option}: " + ("allowed" if reason is None else f"no ({reason})"))
    if report["left_out"]:
        lines.append("left out:")
        for e in report["left_out"]:
            lines.append(f"  {e['method']}{'@' + e['draft'] if e['draft'] else ''}: {e['reason']}")
    if report["notes"]:
        lines.append("notes:")
        lines += [f"  {n}" for n in report["notes"]]
    lines.append(f"grid: {report['grid_size']} configurations")
    return "\n".join(lines)
