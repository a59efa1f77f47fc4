"""A job's report: one self-contained HTML page a platform engineer decides from.

``report_data`` gathers what the page shows from the store (the job, its trials, its published answers, its
traffic sample); ``render_html`` writes the page. The page carries its data as one JSON block and draws the
charts from it with uPlot, which is inlined with its CSS: no CDN, no request at view time (GPU clusters are
often air-gapped). uPlot because it is small (51 kB minified, no dependencies, MIT), maintained, and draws
thousands of points on a canvas without a framework; the tables are plain HTML written here, so the page
reads without JavaScript too. A simulated job's page says SIMULATED on every chart and in its title.
"""

from __future__ import annotations

import html
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from importlib import resources
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from tuner import tuning
from tuner.domain import (
    Engine,
    LevelResult,
    Objective,
    Recommendation,
    SpecConfig,
    SpecDecodeStats,
    TrialResult,
    TrialStatus,
    from_jsonable,
    to_jsonable,
)
from tuner.search.objective import level_metric
from tuner.store.models import JobRow, RecommendationRow, TrialRow

MAX_PREDICTED_SERIES = 8  # the best-predicted skipped configurations drawn; the table lists them all
LOG_TAIL_CHARS = 2000
ASSETS = "report_assets"  # package data of tuner (not a package: no code in it)
# uPlot's banner names its home page; the page must hold no address (the licence travels beside it).
_UPLOT_BANNER = "https://github.com/leeoniya/uPlot"


def report_data(session: Session, job_id: str, team: str | None = None) -> dict[str, Any]:
    """Everything the report shows, as JSON-ready data (404 for a job the team cannot see)."""
    job = tuning.get_job(session, job_id, team)
    rows = tuning.list_trials(session, job_id)
    results = {r.number: from_jsonable(TrialResult, r.result) for r in rows if r.result}
    objective = Objective(job.objective)
    levels = _levels(job, results.values())
    baseline = _baseline_metric(results.values(), objective)
    recs = list(
        session.scalars(
            select(RecommendationRow).where(RecommendationRow.job_id == job_id).order_by(RecommendationRow.id)
        )
    )
    traffic = tuning.get_traffic(session, job.traffic_id)
    cost = tuning.job_cost(job, rows)
    best = job.best or {}
    return {
        "job": {
            "id": job.id,
            "model": job.model,
            "revision": job.revision,
            "hardware": job.hardware,
            "engine": job.engine,
            "simulated": job.engine == Engine.SIMULATED.value,
            "status": job.status,
            "objective": job.objective,
            "error": job.error,
            "created_at": _iso(job.created_at),
            "started_at": _iso(job.started_at),
            "finished_at": _iso(job.finished_at),
            "slo": job.slo,
            "level_weights": tuning.job_spec(job).level_weights,
        },
        "levels": levels,
        "provenance": _provenance(list(results.values()), recs, traffic.workload_class, traffic.request_count, job),
        "trials": [_trial(r, results.get(r.number), baseline, objective, job.started_at) for r in rows],
        "speedup": _speedup_series(results, baseline, objective, levels, best.get("skipped") or []),
        "acceptance": _acceptance(results.values()),
        "answer": _answer(recs, best, levels),
        "skipped": [
            {
                "label": from_jsonable(SpecConfig, s["spec"]).label(),
                "predicted_speedup": s["predicted_speedup"],
                "per_level": s.get("per_level") or {},
                "reason": s["reason"],
            }
            for s in best.get("skipped") or []
        ],
        "notes": best.get("notes") or [],
        "cost": to_jsonable(cost) | {"gpu_hours": round(cost.gpu_hours, 4)},
    }


# ---------------------------------------------------------------------------------------------- the data
def _iso(t: datetime | None) -> str | None:
    return t.isoformat() if t else None


def _levels(job: JobRow, results: Iterable[TrialResult]) -> list[dict[str, Any]]:
    """The job's levels in order, as the trials measured them (label, value, kind)."""
    seen: dict[str, dict[str, Any]] = {}
    for res in results:
        for lr in res.levels:
            seen.setdefault(lr.level.label, {"label": lr.level.label, "value": lr.level.value, "kind": lr.level.kind})
    for raw in job.levels:
        label = raw.get("label") if isinstance(raw, Mapping) else None
        if label and label not in seen:
            seen[label] = {"label": label, "value": raw.get("value"), "kind": raw.get("kind")}
    return sorted(seen.values(), key=lambda lv: float(lv["value"] or 0))


def _baseline_metric(results: Iterable[TrialResult], objective: Objective) -> dict[str, float]:
    """Per level, the median metric over every no-speculation run (the baseline and its confirmations)."""
    by_level: dict[str, list[float]] = {}
    for res in results:
        if res.spec.is_off and res.status.has_figures():
            for lr in res.levels:
                by_level.setdefault(lr.level.label, []).append(level_metric(lr, objective))
    return {label: statistics.median(v) for label, v in by_level.items()}


def _level(lr: LevelResult, baseline: Mapping[str, float], objective: Objective) -> dict[str, Any]:
    base = baseline.get(lr.level.label)
    sd = lr.spec_decode
    return {
        "label": lr.level.label,
        "value": lr.level.value,
        "output_throughput": lr.output_throughput,
        "tpot_p50_ms": lr.tpot_ms.p50,
        "tpot_p99_ms": lr.tpot_ms.p99,
        "ttft_p50_ms": lr.ttft_ms.p50,
        "ttft_p99_ms": lr.ttft_ms.p99,
        "errors": lr.errors,
        "speedup": level_metric(lr, objective) / base if base else None,
        "acceptance_length": sd.acceptance_length if sd and sd.num_drafts else None,
        "client_bound": lr.client_bound,
        "client_bound_reason": lr.client_bound_reason,
        "below_target": lr.below_target,
    }


def _trial(
    row: TrialRow,
    res: TrialResult | None,
    baseline: Mapping[str, float],
    objective: Objective,
    job_started: datetime | None,
) -> dict[str, Any]:
    spec = from_jsonable(SpecConfig, row.config)
    start = (
        (tuning.as_utc(row.started_at) - tuning.as_utc(job_started)).total_seconds()
        if row.started_at and job_started
        else None
    )
    failure = res.failure if res else None
    return {
        "number": row.number,
        "purpose": row.purpose,
        "method": row.method,
        "label": spec.label(),
        "status": row.status,
        "engine": row.engine,
        "failure_class": row.failure_class,
        "failure_reason": row.failure_reason,
        "log_tail": (failure.log_tail[-LOG_TAIL_CHARS:] if failure else "") or "",
        "start_s": start,
        "startup_s": res.startup_s if res else None,
        "duration_s": row.duration_s,
        "gpu_seconds": row.gpu_seconds,
        "vllm_version": res.vllm_version if res else None,
        "levels": [_level(lr, baseline, objective) for lr in res.levels] if res else [],
    }


def _speedup_series(
    results: Mapping[int, TrialResult],
    baseline: Mapping[str, float],
    objective: Objective,
    levels: Sequence[Mapping[str, Any]],
    skipped: Sequence[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """A measured series per configuration (every run of it: median, with the runs' spread as the bar), then
    the best-predicted configurations never run, drawn apart."""
    runs: dict[str, tuple[SpecConfig, dict[str, list[float]]]] = {}
    for res in results.values():
        if res.spec.is_off or res.status is not TrialStatus.SUCCEEDED:
            continue
        _, per_level = runs.setdefault(res.spec.key(), (res.spec, {}))
        for lr in res.levels:
            if lr.level.label in baseline:
                per_level.setdefault(lr.level.label, []).append(level_metric(lr, objective) / baseline[lr.level.label])
    out = []
    for spec, per_level in runs.values():
        points = [
            {
                "label": lv["label"],
                "value": lv["value"],
                "speedup": statistics.median(per_level[lv["label"]]),
                "low": min(per_level[lv["label"]]),
                "high": max(per_level[lv["label"]]),
                "runs": len(per_level[lv["label"]]),
            }
            for lv in levels
            if lv["label"] in per_level
        ]
        out.append({"name": spec.label(), "method": spec.method.value, "kind": "measured", "points": points})
    predicted = sorted((s for s in skipped if s.get("per_level")), key=lambda s: -s["predicted_speedup"])
    for s in predicted[:MAX_PREDICTED_SERIES]:
        spec = from_jsonable(SpecConfig, s["spec"])
        points = [
            {"label": lv["label"], "value": lv["value"], "speedup": s["per_level"][lv["label"]]}
            for lv in levels
            if lv["label"] in s["per_level"]
        ]
        out.append({"name": spec.label(), "method": spec.method.value, "kind": "predicted", "points": points})
    return out


def _acceptance(results: Iterable[TrialResult]) -> list[dict[str, Any]]:
    """Per speculative configuration, acceptance at each draft position over all its runs and levels:
    cumulative (accepted at i / drafts: vLLM's per-position figure) and conditional (given i-1 accepted),
    and the share of decode steps that proposed nothing (ngram and suffix find no match)."""
    totals: dict[str, tuple[SpecConfig, list[SpecDecodeStats]]] = {}
    for res in results:
        if res.spec.is_off or res.status is not TrialStatus.SUCCEEDED:  # a diverged run's acceptance misleads
            continue
        stats = [lr.spec_decode for lr in res.levels if lr.spec_decode and lr.spec_decode.num_drafts]
        if stats:
            totals.setdefault(res.spec.key(), (res.spec, []))[1].extend(stats)
    out = []
    for spec, stats in totals.values():
        width = max(len(s.accepted_per_position) for s in stats)
        summed = SpecDecodeStats(
            num_drafts=sum(s.num_drafts for s in stats),
            num_draft_tokens=sum(s.num_draft_tokens for s in stats),
            num_accepted_tokens=sum(s.num_accepted_tokens for s in stats),
            accepted_per_position=tuple(
                sum(s.accepted_per_position[i] for s in stats if i < len(s.accepted_per_position)) for i in range(width)
            ),
            num_speculative_tokens=spec.num_speculative_tokens,
            decode_steps=(
                sum(s.decode_steps or 0 for s in stats) if all(s.decode_steps is not None for s in stats) else None
            ),
        )
        out.append(
            {
                "name": spec.label(),
                "method": spec.method.value,
                "cumulative": list(summed.per_position_rate),
                "conditional": list(summed.conditional_per_position),
                "acceptance_length": summed.acceptance_length,
                "empty_step_share": summed.empty_step_fraction,
                "drafts": summed.num_drafts,
            }
        )
    return out


def _answer(recs: Sequence[RecommendationRow], best: Mapping[str, Any], levels: Sequence[Mapping[str, Any]]) -> dict:
    """The deployed configuration (K by batch size) and the per-range answers, as published."""
    top = max((float(lv["value"] or 1) for lv in levels), default=1.0)
    ranges = []
    deployed: dict[str, Any] | None = None
    for row in recs:
        rec = from_jsonable(Recommendation, row.body)
        entry = {
            "scope": row.scope,
            "low": row.concurrency_low,
            "high": row.concurrency_high,
            "label": rec.spec.label(),
            "k": rec.spec.k_at(row.concurrency_low),
            # confirmed on fresh servers, else the level winner's search run (said so in the table)
            "speedup": rec.speedup.mean
            if rec.speedup
            else (rec.per_level_winners[0].speedup if rec.per_level_winners else None),
            "confirmed": rec.speedup is not None,
            "deploy_command": rec.deploy_command(),
        }
        if row.scope == "all":
            end = int(max(top, *(b for _, b, _ in rec.spec.schedule or ((0, 1, 0),))))
            marks = sorted(
                {1, end, *(a for a, _, _ in rec.spec.schedule or ()), *(b + 1 for _, b, _ in rec.spec.schedule or ())}
            )
            deployed = entry | {
                "speculative_config": rec.spec.to_vllm(),
                "steps": [{"batch_size": bs, "k": rec.spec.k_at(bs)} for bs in marks if bs <= end],
                "losses": best.get("deployed_losses") or {},
            }
        else:
            ranges.append(entry)
    if deployed is None and best:  # not published (yet): the job's best so far
        deployed = {
            "scope": "all",
            "label": best.get("label"),
            "speedup": (best.get("speedup") or {}).get("mean"),
            "speculative_config": best.get("speculative_config"),
            "steps": [],
            "losses": best.get("deployed_losses") or {},
        }
    return {"deployed": deployed, "ranges": ranges}


def _provenance(
    results: Sequence[TrialResult],
    recs: Sequence[RecommendationRow],
    workload_class: str,
    request_count: int,
    job: JobRow,
) -> dict[str, Any]:
    return {
        "vllm_versions": sorted({r.vllm_version for r in results if r.vllm_version}),
        "hardware": sorted({r.hardware for r in results if r.hardware}) or [job.hardware],
        "drivers": sorted({r.driver for r in recs if r.driver}),
        "workers": sorted({r.worker for r in results if r.worker}),
        "traffic_id": job.traffic_id,
        "workload_class": workload_class,
        "request_count": request_count,
    }


# ---------------------------------------------------------------------------------------------- the page
def _asset(name: str) -> str:
    return resources.files("tuner").joinpath(ASSETS, name).read_text(encoding="utf-8")


def _script_json(data: Any) -> str:
    """JSON safe inside <script>: no sequence in it can close the element or open a comment."""
    return json.dumps(data, allow_nan=False, default=str).replace("<", "\\u003c").replace(">", "\\u003e")


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _num(x: Any, fmt: str = ".3g") -> str:
    return "" if x is None else format(x, fmt)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller)."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def _chart(chart_id: str, title: str, simulated: bool, caption: str) -> str:
    mark = '<div class="watermark">SIMULATED</div>' if simulated else ""
    return (
        f'<figure class="chart-box"><figcaption>{_e(title)}</figcaption>'
        f'<div class="chart" id="{chart_id}">{mark}</div><p class="caption">{_e(caption)}</p></figure>'
    )


def render_html(data: Mapping[str, Any]) -> str:
    """The self-contained page for ``report_data``'s output."""
    job, cost, answer = data["job"], data["cost"], data["answer"]
    sim = bool(job["simulated"])
    title = f"{'[SIMULATED] ' if sim else ''}spec-tuner report: {job['model']} on {job['hardware']} ({job['id']})"
    span = max([(t["start_s"] or 0) + (t["duration_s"] or 0) for t in data["trials"]] or [1.0]) or 1.0
    timeline = []
    for t in data["trials"]:
        left = 100 * ((t["start_s"] or 0.0) / span)
        width = max(0.5, 100 * ((t["duration_s"] or 0) / span))
        startup = 100 * ((t["startup_s"] or 0) / span)
        bar = (
            f'<div class="bar-track"><div class="bar {_e(t["status"])}" style="left:{left:.2f}%;width:{width:.2f}%">'
            f'<div class="startup" style="width:{min(100.0, 100 * startup / width if width else 0):.1f}%"></div>'
            "</div></div>"
        )
        levels = "; ".join(
            f"{_e(lv['label'])}: {_num(lv['output_throughput'], '.1f')} tok/s"
            + (f", {_num(lv['speedup'], '.3f')}x" if lv["speedup"] is not None else "")
            + (" (client-bound)" if lv["client_bound"] else "")
            for lv in t["levels"]
        )
        failure = ""
        if t["failure_class"]:
            failure = f"<b>{_e(t['failure_class'])}</b>: {_e(t['failure_reason'])}"
            if t["log_tail"]:
                failure += f"<details><summary>log tail</summary><pre>{_e(t['log_tail'])}</pre></details>"
        timeline.append(
            [
                str(t["number"]),
                _e(t["purpose"]),
                _e(t["label"]),
                f'<span class="status {_e(t["status"])}">{_e(t["status"])}</span>',
                _num(t["start_s"], ".1f"),
                _num(t["startup_s"], ".1f"),
                _num(t["duration_s"], ".1f"),
                _num(t["gpu_seconds"], ".1f"),
                bar,
                levels,
                failure,
            ]
        )
    client_bound = [
        [str(t["number"]), _e(t["label"]), _e(lv["label"]), _e(lv["client_bound_reason"])]
        for t in data["trials"]
        for lv in t["levels"]
        if lv["client_bound"]
    ]
    deployed = answer["deployed"] or {}
    ranges = [
        [
            _e(r["scope"]),
            f"{r['low']}-{r['high'] if r['high'] is not None else '∞'}",
            _e(r["label"]),
            _num(r["speedup"], ".3f") + ("" if r["confirmed"] or r["speedup"] is None else " (one search run)"),
            f"<code>{_e(r['deploy_command'])}</code>",
        ]
        for r in answer["ranges"]
    ]
    prov = data["provenance"]
    provenance = [
        ["vLLM", _e(", ".join(prov["vllm_versions"]) or "unknown")],
        ["chip", _e(", ".join(prov["hardware"]))],
        ["driver", _e(", ".join(prov["drivers"]) or "unknown")],
        ["workers", _e(", ".join(prov["workers"]))],
        [
            "traffic",
            f"{_e(prov['workload_class'])}, {prov['request_count']} requests (sample {_e(prov['traffic_id'])})",
        ],
        ["objective", _e(job["objective"])],
        ["SLO", _e(json.dumps(job["slo"]))],
        ["engine", _e(job["engine"]) + (" <b>(SIMULATED: no figure here was measured)</b>" if sim else "")],
    ]
    by_purpose = ", ".join(f"{k} {v:.1f}" for k, v in sorted(cost["by_purpose"].items()))
    grid = (
        f"a grid of the same space ({cost['grid_trials']} trials at the median search trial's cost) would have "
        f"held about {cost['grid_gpu_seconds']:.1f} GPU-seconds"
        if cost.get("grid_gpu_seconds") is not None
        else "the space's size is not known yet"
    )
    skipped = [
        [_e(s["label"]), _num(s["predicted_speedup"], ".3f") if s["predicted_speedup"] else "", _e(s["reason"])]
        for s in data["skipped"]
    ]
    accept_rows = [
        [_e(a["name"]), _num(a["acceptance_length"], ".3f"), _num(a["empty_step_share"], ".1%"), str(a["drafts"])]
        for a in data["acceptance"]
    ]
    speed = deployed.get("speedup")
    sections = [
        f'<header><h1>{_e(title)}</h1><p class="status-line">status <b>{_e(job["status"])}</b>'
        + (f" — {_e(job['error'])}" if job["error"] else "")
        + f" · created {_e(job['created_at'])} · finished {_e(job['finished_at'] or '-')}</p>"
        + ('<p class="banner">SIMULATED: these figures come from the simulated engine, not a GPU.</p>' if sim else "")
        + "</header>",
        "<section><h2>The answer</h2>"
        + f"<p>Deploy <b>{_e(deployed.get('label') or 'nothing yet')}</b>"
        + (f": {speed:.3f}x over no speculation" if speed else "")
        + (f'</p><pre class="cmd">{_e(deployed["deploy_command"])}</pre>' if deployed.get("deploy_command") else "</p>")
        + (
            "<p class='loss'>Loses to no speculation at: "
            + _e(", ".join(f"{k} ({v:.3f}x)" for k, v in deployed["losses"].items()))
            + " (the per-range answers give off there)</p>"
            if deployed.get("losses")
            else ""
        )
        + (_table(["scope", "concurrency", "answer", "speedup", "deploy"], ranges) if ranges else "")
        + "</section>",
        '<section class="charts">'
        + _chart(
            "chart-speedup",
            "Speedup over no speculation by concurrency",
            sim,
            "Solid: measured (median of runs; bars: the runs' spread). Dashed, hollow: predicted, never run.",
        )
        + _chart(
            "chart-schedule",
            "Deployed K by batch size, and the per-range answers",
            sim,
            "Step: the configuration deployed for all ranges. Points: each range's own answer.",
        )
        + _chart("chart-accept-cum", "Acceptance by draft position (cumulative)", sim, "accepted at i / drafts")
        + _chart(
            "chart-accept-cond", "Acceptance by draft position (conditional)", sim, "accepted at i / accepted at i-1"
        )
        + _chart(
            "chart-pareto-tpot",
            "Throughput against p99 TPOT, per level",
            sim,
            "Each point a trial at a level; line: SLO",
        )
        + _chart(
            "chart-pareto-ttft",
            "Throughput against p99 TTFT, per level",
            sim,
            "Each point a trial at a level; line: SLO",
        )
        + "</section>",
        "<section><h2>Acceptance</h2>"
        + _table(["configuration", "acceptance length", "empty steps", "drafts"], accept_rows)
        + "</section>",
        "<section><h2>Trials</h2>"
        + _table(
            [
                "#",
                "purpose",
                "configuration",
                "status",
                "start s",
                "start-up s",
                "wall s",
                "GPU-s",
                "timeline",
                "levels",
                "failure",
            ],
            timeline,
            "trials",
        )
        + "</section>",
        "<section><h2>Client-bound levels</h2>"
        + (
            _table(["trial", "configuration", "level", "why"], client_bound)
            if client_bound
            else "<p>None: the client kept up at every level.</p>"
        )
        + "</section>",
        "<section><h2>Not run</h2>"
        + (_table(["configuration", "predicted", "reason"], skipped) if skipped else "<p>Nothing skipped.</p>")
        + "</section>",
        "<section><h2>Cost</h2>"
        + f"<p>{cost['gpu_seconds']:.1f} GPU-seconds ({cost['gpu_hours']:.3f} GPU-hours"
        + (", simulated" if sim else "")
        + f") over {cost['trials']} trials: {by_purpose or 'none yet'}; servers ran {cost['server_seconds']:.1f} s. "
        + f"{grid}.</p></section>",
        "<section><h2>Provenance</h2>" + _table(["", ""], provenance) + "</section>",
        "<section><h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in data["notes"]) + "</ul></section>",
    ]
    uplot = _asset("uPlot.iife.min.js").replace(_UPLOT_BANNER, "uPlot")
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title>"
        f"<style>{_asset('uPlot.min.css')}</style><style>{_asset('report.css')}</style>"
        f'</head><body class="{"simulated" if sim else "measured"}">'
        + "".join(sections)
        + f'<script id="report-data" type="application/json">{_script_json(data)}</script>'
        + f"<script>{uplot}</script><script>{_asset('report.js')}</script>"
        + "</body></html>"
    )


def job_report(session: Session, job_id: str, team: str | None = None) -> str:
    return render_html(report_data(session, job_id, team))
