"""``tuner space``: the search space a job would get, and why each method and option is in or out.

Built by the same ``build_space`` a job's planner calls, from the same inputs: the model's config.json, the
job's methods and drafts, the compat table (with the server's own rules file), and the capabilities of the
vLLM the trials would run on: reported by the fleet's workers (``--server``, ``GET /workers``), else probed
from the local vLLM (``--vllm-python``, ``TUNER_VLLM_PYTHON``). Nothing is launched.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from tuner.domain import Method, VllmCapabilities
from tuner.settings import Settings


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    p = sub.add_parser("space", help="print the search space a job would get and why each option is in or out")
    p.add_argument("--model", required=True, help="the target: HF id or local path")
    p.add_argument("--config", type=Path, help="the model's config.json (default: the model's directory or HF cache)")
    p.add_argument("--job", type=Path, help="a POST /tune body: its methods, drafts, depths and serving args apply")
    p.add_argument("--hardware", help="the chip family (default: the worker's, else this host's)")
    p.add_argument("--methods", nargs="+", choices=[m.value for m in Method if m is not Method.OFF])
    p.add_argument("--server", help="a spec-tuner URL: use what its workers reported (GET /workers)")
    p.add_argument("--token", default=os.environ.get("TUNER_TOKEN"), help="API token (default: $TUNER_TOKEN)")
    p.add_argument("--vllm-python", help="without --server: the interpreter whose vLLM to probe")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def run(args: argparse.Namespace, settings: Settings) -> int:
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
        depth_range=tuple(search["depth_range"]) if search.get("depth_range") else None,  # type: ignore[arg-type]
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


def _capabilities(args: argparse.Namespace) -> tuple[VllmCapabilities | None, str, str]:
    """The capabilities to build for, the hardware, and where the capabilities came from."""
    if args.server:
        headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
        try:
            resp = httpx.get(args.server.rstrip("/") + "/workers", headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            raise RuntimeError(f"{args.server}: {exc}") from exc
        if resp.status_code != 200:
            detail = resp.json().get("detail", resp.text) if resp.content else resp.reason_phrase
            raise RuntimeError(f"{args.server}/workers answered {resp.status_code}: {detail}")
        workers = resp.json()
        if args.hardware:
            workers = [w for w in workers if args.hardware in (w.get("families") or [w.get("hardware")])]
        reported = [w for w in workers if w.get("vllm_capabilities")]
        if not reported:
            which = f" for {args.hardware}" if args.hardware else ""
            raise RuntimeError(f"no worker{which} at {args.server} has reported its vLLM's capabilities")
        worker = reported[0]  # the most recently seen
        caps = VllmCapabilities.from_dict(worker["vllm_capabilities"])
        return caps, args.hardware or worker.get("hardware") or "auto", f"reported by worker {worker['name']}"
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
