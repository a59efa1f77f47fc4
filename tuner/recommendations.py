# Over 400 lines on purpose: publishing and answering share the row layout, the level ranges and the staleness rule.
"""Publish a finished search as recommendations, and answer ``GET /recommendation``.

A job publishes one row for the whole concurrency range (the schedule when the search produced one, else the
static best) and one row per measured level range with that level's winner. Rows are never updated: past
recommendations stay as history, the newest answers. Simulated rows only answer queries asking for them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from tuner.domain import (
    ConcurrencyRange,
    Engine,
    JobSpec,
    LevelResult,
    LevelWinner,
    Recommendation,
    SpecConfig,
    Speedup,
    TrialResult,
    TrialStatus,
    TuneOutcome,
    fingerprint,
    from_jsonable,
    parse_version,
    to_jsonable,
)
from tuner.errors import NotFound
from tuner.store.models import JobRow, RecommendationRow, TrafficSampleRow, WorkerRow

MAX_HISTORY = 20


def level_ranges(concurrencies: Sequence[int], upper: int | None = None) -> list[ConcurrencyRange]:
    """Split 1..upper into ranges around each measured concurrency (boundaries at geometric midpoints)."""
    cs = sorted(set(concurrencies))
    ranges: list[ConcurrencyRange] = []
    low = 1
    for i, c in enumerate(cs):
        if i + 1 < len(cs):
            high = max(c, int((c * cs[i + 1]) ** 0.5))
            ranges.append(ConcurrencyRange(low, high))
            low = high + 1
        else:
            ranges.append(ConcurrencyRange(low, upper))
    return ranges


def _latency(levels: Sequence[LevelResult]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for lr in levels:
        out[lr.level.label] = {
            "output_throughput": lr.output_throughput,
            "request_throughput": lr.request_throughput,
            "goodput": lr.goodput,
            "ttft_ms": to_jsonable(lr.ttft_ms),
            "tpot_ms": to_jsonable(lr.tpot_ms),
            "itl_ms": to_jsonable(lr.itl_ms),
            "e2e_ms": to_jsonable(lr.e2e_ms),
            "achieved_concurrency": lr.achieved_concurrency,
            "below_target": lr.below_target,
            "client_bound": lr.client_bound,
            "client_bound_reason": lr.client_bound_reason,
            "client_processes": lr.client_processes,
            "steady_share": lr.steady_share,
            "errors": lr.errors,
            "acceptance_length": lr.spec_decode.acceptance_length if lr.spec_decode else None,
            "acceptance_per_position": list(lr.spec_decode.per_position_rate) if lr.spec_decode else None,
            "acceptance_conditional": list(lr.spec_decode.conditional_per_position) if lr.spec_decode else None,
            "proposed_per_draft": lr.spec_decode.mean_proposed_per_draft if lr.spec_decode else None,
            "empty_step_fraction": lr.spec_decode.empty_step_fraction if lr.spec_decode else None,
        }
    return out


def _variable_length_note(spec: SpecConfig, results: Sequence[TrialResult]) -> str | None:
    """ngram/suffix: vLLM counts a draft only when a step proposed tokens, so acceptance is not a speedup."""
    if not spec.method.is_variable_length:
        return None
    empty = [
        lr.spec_decode.empty_step_fraction
        for r in results
        for lr in r.levels
        if lr.spec_decode and lr.spec_decode.empty_step_fraction is not None
    ]
    share = f"; {statistics.fmean(empty):.0%} of decode steps proposed nothing" if empty else ""
    return (
        f"{spec.method.value}: acceptance length and per-position rates count only steps that proposed tokens"
        f"{share}. Read the measured speedup, not the acceptance length."
    )


def _acceptance_length(results: Sequence[TrialResult]) -> float | None:
    values = [
        lr.spec_decode.acceptance_length
        for r in results
        for lr in r.levels
        if lr.spec_decode and lr.spec_decode.num_drafts
    ]
    return statistics.fmean(values) if values else None


def publish(
    session: Session,
    job: JobRow,
    spec: JobSpec,
    outcome: TuneOutcome,
    results: Mapping[int, TrialResult],
    traffic: TrafficSampleRow,
) -> list[RecommendationRow]:
    """Store the recommendations of a finished job (idempotent: a job publishes once)."""
    existing = session.scalars(select(RecommendationRow).where(RecommendationRow.job_id == job.id)).all()
    if existing:
        return list(existing)
    measured = [r for r in results.values() if r.levels]
    vllm_version = next((r.vllm_version for r in measured if r.vllm_version), None)
    hardware = next((r.hardware for r in measured if r.hardware), None) or spec.hardware
    driver = None
    if measured and measured[0].worker:
        worker = session.get(WorkerRow, measured[0].worker)
        driver = worker.driver if worker else None
    deployed = outcome.deployed
    simulated = spec.engine is Engine.SIMULATED
    confirm = [results[n] for n in outcome.confirm_trials if n in results and results[n].spec.key() == deployed.key()]
    evidence = confirm or [results[n] for n in (outcome.best_trial,) if n is not None and n in results]
    label_notes = ["SIMULATED: figures come from the analytic model, not from a vLLM run."] if simulated else []
    notes = label_notes + list(outcome.notes)
    if (note := _variable_length_note(deployed, evidence)) is not None:
        notes.append(note)
    if deployed.is_off:
        diverged = sorted({r.spec.label() for r in results.values() if r.status is TrialStatus.DIVERGED})
        why = "nothing beat the no-speculation baseline beyond noise"
        if diverged:
            why = (
                f"nothing that kept the baseline's outputs beat it beyond noise ({', '.join(diverged)} diverged "
                "from the baseline's outputs and cannot be recommended)"
            )
        notes.insert(len(label_notes), f"No speculation: {why}.")
    # every answer carries the job's provenance (a partial mypy checks against Recommendation's fields)
    recommendation = partial(
        Recommendation,
        model=spec.model,
        hardware=hardware,
        vllm_version=vllm_version,
        engine=spec.engine,
        serving=spec.serving,
        job_id=job.id,
        workload_fingerprint=traffic.fingerprint,
        workload_class=traffic.workload_class,
    )
    recs: list[tuple[str, Recommendation]] = [
        (
            "all",
            recommendation(
                spec=deployed,
                concurrency=ConcurrencyRange(1, None),
                speedup=outcome.speedup,
                acceptance_length=_acceptance_length(evidence),
                latency=_latency(evidence[-1].levels) if evidence else {},
                per_level_winners=outcome.per_level_winners,
                notes=tuple(notes),
                trial_numbers=tuple(
                    n for n in (outcome.baseline_trial, outcome.best_trial, *outcome.confirm_trials) if n is not None
                ),
            ),
        )
    ]
    concurrencies = [lvl.concurrency for lvl in spec.levels if lvl.concurrency]
    winners = {w.level: w for w in outcome.per_level_winners}
    for level, rng in zip(sorted(concurrencies), level_ranges(concurrencies), strict=True):
        w = winners.get(f"c{level}")
        if w is None:
            continue
        level_spec, speedup, why = level_answer(outcome, w)
        trial = None
        if not level_spec.is_off:
            if evidence and level_spec.key() == deployed.key():
                trial = evidence[-1]
            elif w.trial_number is not None:
                trial = results.get(w.trial_number)
        recs.append(
            (
                f"c{rng.low}-{rng.high if rng.high is not None else 'inf'}",
                recommendation(
                    spec=level_spec,
                    concurrency=rng,
                    speedup=speedup,
                    acceptance_length=_acceptance_length([trial]) if trial else None,
                    latency=_latency([lr for lr in trial.levels if lr.level.concurrency == level]) if trial else {},
                    per_level_winners=(w,),
                    notes=(*label_notes, why, *outcome.notes),
                    trial_numbers=(w.trial_number,) if trial is not None and w.trial_number is not None else (),
                ),
            )
        )
    rows = []
    for scope, rec in recs:
        row = RecommendationRow(
            job_id=job.id,
            scope=scope,
            model=rec.model.name,
            revision=rec.model.revision,
            hardware=rec.hardware,
            vllm_version=rec.vllm_version,
            driver=driver,
            engine=rec.engine.value,
            serving_key=fingerprint(rec.serving),
            workload_fingerprint=traffic.fingerprint,
            workload_class=traffic.workload_class,
            traffic_id=traffic.id,
            concurrency_low=rec.concurrency.low,
            concurrency_high=rec.concurrency.high,
            body=to_jsonable(rec),
        )
        session.add(row)
        rows.append(row)
    session.flush()
    return rows


def level_answer(outcome: TuneOutcome, w: LevelWinner) -> tuple[SpecConfig, Speedup | None, str]:
    """What to deploy for one concurrency range: the best measured at its level, and how sure we are.

    The winner is read from every trial (confirmation runs included). When it is the deployed config, the
    speedup comes from all its runs on fresh servers; otherwise from one search trial, which must beat the baseline
    by more than the noise to be recommended at all.

    Returns the config the range's row recommends (no speculation when nothing beat the baseline beyond the
    noise), the confirmed speedup (``None`` unless it is the deployed config's, from fresh servers) and the note
    that says why, as :func:`publish` stores them.
    """
    if w.spec.is_off:
        return SpecConfig(), None, f"No speculation at {w.level}: nothing beat the baseline there."
    if outcome.speedup is not None and w.spec.key() == outcome.deployed.key():
        at = outcome.speedup.per_level.get(w.level)
        if at is not None and at <= 1.0 + outcome.noise:
            return (
                SpecConfig(),
                None,
                (
                    f"No speculation at {w.level}: the deployed {w.spec.label()} measured {at:.3f}x there over "
                    f"{outcome.speedup.runs} runs on fresh servers, within noise ({outcome.noise:.1%}) of the baseline."
                ),
            )
        runs = outcome.speedup.runs
        return (
            w.spec,
            outcome.speedup,
            f"Speedup at {w.level} from {runs} runs on fresh servers.",
        )
    if w.speedup <= 1.0 + outcome.noise:
        return (
            SpecConfig(),
            None,
            (
                f"No speculation at {w.level}: the best there, {w.spec.label()} ({w.speedup:.3f}x in one search "
                f"trial), is within noise ({outcome.noise:.1%}) of the baseline."
            ),
        )
    return w.spec, None, f"Speedup at {w.level}: {w.speedup:.3f}x from one search trial (unconfirmed)."


def find(
    session: Session,
    *,
    model: str,
    hardware: str | None = None,
    concurrency: int | None = None,
    workload: str | None = None,
    engine: Engine = Engine.VLLM,
    revision: str | None = None,
    serving: str | None = None,
    team: str | None = None,
    cache: RenderCache | None = None,
) -> dict[str, Any]:
    """The newest matching recommendation, with its history and staleness, as the API returns it.

    ``workload`` is a workload class, or the id or fingerprint of a sample (today's or tomorrow's): a sample
    known to the store stands for its class, and an answer measured on that very sample ranks first.
    ``serving`` is a serving key (``serving_key`` in a response): the production configuration is part of the
    recommendation's key, so answers for other configurations are listed, never silently substituted.
    ``cache`` keeps rendered rows between calls (the API keeps one per process).
    Recommendations are every team's, samples are not: with ``team``, only that team's samples stand for their
    class, and another team's sample id or fingerprint is matched like any other string (against the
    recommendations' own fingerprints and classes), so it reveals nothing the caller could not read anyway.
    """
    q = select(RecommendationRow).where(RecommendationRow.model == model, RecommendationRow.engine == engine.value)
    if hardware and hardware != "auto":
        q = q.where(RecommendationRow.hardware == hardware)
    if revision:
        q = q.where(RecommendationRow.revision == revision)
    if serving:
        q = q.where(RecommendationRow.serving_key == serving)
    sample_fp: str | None = None
    if workload:
        own = select(TrafficSampleRow).where(
            (TrafficSampleRow.id == workload) | (TrafficSampleRow.fingerprint == workload)
        )
        if team is not None:
            own = own.where(TrafficSampleRow.team == team)
        sample = session.scalars(own.order_by((TrafficSampleRow.id == workload).desc()).limit(1)).first()
        if sample is not None:
            sample_fp = sample.fingerprint
            q = q.where(
                (RecommendationRow.workload_class == sample.workload_class)
                | (RecommendationRow.workload_fingerprint == sample.fingerprint)
            )
        else:
            q = q.where(
                (RecommendationRow.workload_class == workload) | (RecommendationRow.workload_fingerprint == workload)
            )
    # bodies are loaded only for the rows rendered (the answer, its history, one per other serving config)
    q = q.options(defer(RecommendationRow.body))
    rows = list(session.scalars(q.order_by(RecommendationRow.created_at.desc(), RecommendationRow.id.desc())))
    if concurrency is not None:
        rows = [
            r
            for r in rows
            if r.concurrency_low <= concurrency and (r.concurrency_high is None or concurrency <= r.concurrency_high)
        ]
    else:
        rows = [r for r in rows if r.scope == "all"]
    # Stable sort over newest-first: the same sample before the same class; a level's own range before "all".
    rows.sort(key=lambda r: (sample_fp is not None and r.workload_fingerprint != sample_fp, r.scope == "all"))
    if not rows:
        what = (
            f"model {model!r}"
            + (f" on {hardware}" if hardware else "")
            + (f" at concurrency {concurrency}" if concurrency is not None else "")
            + (f" for workload {workload!r}" if workload else "")
            + (f" with serving key {serving}" if serving else "")
            + ("" if engine is Engine.VLLM else " (simulated)")
        )
        raise NotFound(f"no {'simulated ' if engine is Engine.SIMULATED else 'measured '}recommendation for {what}")
    best = rows[0]
    same = [r for r in rows[1:] if r.scope == best.scope and r.serving_key == best.serving_key]
    others: dict[str, RecommendationRow] = {}
    for r in rows[1:]:
        if r.serving_key != best.serving_key and r.serving_key not in others:
            others[r.serving_key] = r
    cache = cache or RenderCache()
    out = render(session, best, history=same[:MAX_HISTORY], cache=cache)
    out["matched_by"] = _matched_by(best, workload, sample_fp)
    out["other_serving_configs"] = [
        {
            "serving_key": key,
            "serving": cache.rendered(session, r)[0]["serving"],
            "recommendation_id": r.id,
            "job_id": r.job_id,
        }
        for key, r in others.items()
    ]
    return out


def _matched_by(row: RecommendationRow, workload: str | None, sample_fp: str | None) -> str | None:
    if not workload:
        return None
    if row.workload_fingerprint in (sample_fp, workload):
        return "fingerprint"  # measured on this very traffic
    return "workload_class"


class RenderCache:
    """Rendered recommendation rows, by row. A published row never changes (a job publishes once), so its
    rendering is computed once per process: decoding the body and reading its sample's and job's columns was
    most of a ``GET /recommendation``. Staleness depends on what workers report now and is never cached.
    Bounded: past ``size`` rows the oldest entries go."""

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._rows: dict[tuple[int, str, str], tuple[dict[str, Any], dict[str, Any]]] = {}

    def rendered(self, session: Session, row: RecommendationRow) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the row's answer without staleness or history, the row as a history entry)."""
        key = (row.id, row.job_id, row.scope)
        hit = self._rows.get(key)
        if hit is None:
            hit = _rendered(session, row)
            while len(self._rows) >= self.size:
                self._rows.pop(next(iter(self._rows)), None)
            self._rows[key] = hit
        return hit


def render(
    session: Session,
    row: RecommendationRow,
    history: Sequence[RecommendationRow] = (),
    cache: RenderCache | None = None,
) -> dict[str, Any]:
    cache = cache or RenderCache(size=1 + len(history))
    out = dict(cache.rendered(session, row)[0])
    out["stale"], out["stale_reason"] = _staleness(session, row)
    out["history"] = [cache.rendered(session, h)[1] for h in history]
    return out


def _rendered(session: Session, row: RecommendationRow) -> tuple[dict[str, Any], dict[str, Any]]:
    rec = from_jsonable(Recommendation, row.body)
    # two columns, not two rows: a sample row carries its prompts and a job row its whole spec
    request_count = session.scalar(select(TrafficSampleRow.request_count).where(TrafficSampleRow.id == row.traffic_id))
    objective = session.scalar(select(JobRow.objective).where(JobRow.id == row.job_id))
    speculative = rec.spec.to_vllm()
    created_at = row.created_at.isoformat() if row.created_at else None
    answer = {
        "id": row.id,
        "model": to_jsonable(rec.model),
        "hardware": rec.hardware,
        "vllm_version": rec.vllm_version,
        "driver": row.driver,
        "engine": rec.engine.value,
        "simulated": rec.engine is Engine.SIMULATED,
        "speculation": "off" if speculative is None else rec.spec.method.value,
        "summary": _summary(rec),
        "speculative_config": speculative,
        "serve_args": ["vllm", *rec.serve_args()],
        "deploy_command": rec.deploy_command(),
        "deploy_env": rec.serve_env(),
        "serving": to_jsonable(rec.serving),
        "serving_key": row.serving_key,
        "concurrency": {"low": rec.concurrency.low, "high": rec.concurrency.high},
        "scope": row.scope,
        "speedup": to_jsonable(rec.speedup),
        "acceptance_length": rec.acceptance_length,
        "latency": rec.latency,
        "per_level_winners": to_jsonable(rec.per_level_winners),
        "notes": list(rec.notes),
        "measured_on": {
            "traffic_id": row.traffic_id,
            "fingerprint": row.workload_fingerprint,
            "workload_class": row.workload_class,
            "request_count": request_count,
        },
        "provenance": {
            "job_id": row.job_id,
            "trial_numbers": list(rec.trial_numbers),
            "created_at": created_at,
            "objective": objective,
        },
    }
    as_history = {
        "id": row.id,
        "job_id": row.job_id,
        "created_at": created_at,
        "vllm_version": row.vllm_version,
        "speculative_config": speculative,
    }
    return answer, as_history


def _summary(rec: Recommendation) -> str:
    prefix = "[SIMULATED] " if rec.engine is Engine.SIMULATED else ""
    if rec.spec.is_off:
        why = next((n.partition(": ")[2] for n in rec.notes if n.startswith("No speculation")), "")
        return prefix + "Do not use speculative decoding" + (f": {why}" if why else ".")
    level = rec.per_level_winners[0].level if len(rec.per_level_winners) == 1 else None
    if rec.speedup and level and level in rec.speedup.per_level:
        sp = (
            f"{rec.speedup.per_level[level]:.2f}x at {level} (mean of {rec.speedup.runs} runs on fresh servers; "
            f"{rec.speedup.mean:.2f}x over all levels)"
        )
    elif rec.speedup:
        sp = f"{rec.speedup.mean:.2f}x (range {rec.speedup.low:.2f}-{rec.speedup.high:.2f}, {rec.speedup.runs} runs)"
    elif level:
        sp = f"{rec.per_level_winners[0].speedup:.2f}x at {level} from one search trial (unconfirmed)"
    else:
        sp = "unconfirmed"
    return f"{prefix}Use {rec.spec.label()}: {sp} over no speculation."


def _staleness(session: Session, row: RecommendationRow) -> tuple[bool, str | None]:
    # the two columns only: a worker row also holds its whole hardware report
    workers = session.execute(
        select(WorkerRow.vllm_version, WorkerRow.driver).where(WorkerRow.hardware == row.hardware)
    ).all()
    newest_v = max((w.vllm_version for w in workers if w.vllm_version), key=parse_version, default=None)
    if newest_v and parse_version(newest_v) > parse_version(row.vllm_version):
        return True, f"measured on vLLM {row.vllm_version}; workers for {row.hardware} now report {newest_v}"
    newest_d = max((w.driver for w in workers if w.driver), key=parse_version, default=None)
    if newest_d and row.driver and parse_version(newest_d) > parse_version(row.driver):
        return True, f"measured on driver {row.driver}; workers now report {newest_d}"
    return False, None
