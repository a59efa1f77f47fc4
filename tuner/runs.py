"""Use cases of a runner on the job it holds: its trials' records, what it recovers of a runner that died,
its progress, and the outcome it publishes. Like ``tuner.tuning``, functions take a Session and never
commit; they return domain records, never rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tuner import recommendations, tuning
from tuner.domain import (
    Engine,
    FailureClass,
    JobSpec,
    JobStatus,
    Proposal,
    Recovery,
    TrafficRequest,
    TrialProcess,
    TrialProgress,
    TrialResult,
    TrialStatus,
    TuneOutcome,
    from_jsonable,
    to_jsonable,
)
from tuner.domain.cost import gpus_held, trial_gpu_seconds
from tuner.errors import Conflict
from tuner.store.models import TrialRow
from tuner.tuning import Claim, as_utc, utc_now


def job_to_run(session: Session, job_id: str) -> tuple[JobSpec, list[TrafficRequest] | None]:
    """A claimed job's spec and its traffic sample; None for the sample when cancellation was asked for
    (while a dead runner held the job, say): the runner then cleans up and runs nothing."""
    job = tuning.get_job(session, job_id)
    requests = None if job.cancel_requested else tuning.traffic_requests(session, job.traffic_id)
    return tuning.job_spec(job), requests


# --------------------------------------------------------------------------------------------------
# Trials
# --------------------------------------------------------------------------------------------------
def start_trial(session: Session, job_id: str, proposal: Proposal, *, levels: list, worker: str) -> TrialRow:
    """Record a trial as running before anything is launched (so a recoverer knows of it)."""
    row = session.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.number == proposal.number)).first()
    if row is not None and TrialStatus(row.status).is_finished():
        raise Conflict(f"trial {proposal.number} of job {job_id} already finished")
    if row is None:
        row = TrialRow(job_id=job_id, number=proposal.number)
        session.add(row)
    row.purpose = proposal.purpose
    row.method = proposal.spec.method.value
    row.config = to_jsonable(proposal.spec)
    row.levels = levels
    row.status = TrialStatus.RUNNING.value
    row.engine = ""
    row.worker = worker
    row.started_at = utc_now()
    session.flush()
    return row


def set_trial_pgid(session: Session, job_id: str, number: int, pgid: int) -> None:
    session.execute(
        update(TrialRow)
        .where(TrialRow.job_id == job_id, TrialRow.number == number)
        .values(pgid=pgid)
        .execution_options(synchronize_session=False)
    )


def set_trial_stage(session: Session, job_id: str, number: int, progress: TrialProgress) -> None:
    """Where a running trial is (server starting, level i of n, ...); a finished trial keeps its status."""
    level = f"{progress.level} of {progress.levels} ({progress.label})" if progress.level is not None else None
    session.execute(
        update(TrialRow)
        .where(TrialRow.job_id == job_id, TrialRow.number == number, TrialRow.status == TrialStatus.RUNNING.value)
        .values(stage=progress.stage.value, stage_level=level)
        .execution_options(synchronize_session=False)
    )


def finish_trial(session: Session, job_id: str, number: int, result: TrialResult) -> TrialResult | None:
    """Store a result once; returns the trial's stored result. A second result for a finished trial is not
    stored (no result stored twice): the first one is returned, so a retry whose first commit went through
    carries on with it. None: no such trial, or it was abandoned (failed without a result)."""
    row = session.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.number == number)).first()
    if row is None:
        return None
    if TrialStatus(row.status).is_finished():
        return trial_result(row)
    now = utc_now()
    row.status = result.status.value
    row.engine = result.engine.value
    row.result = to_jsonable(result)
    row.failure_class = result.failure.cls.value if result.failure else None
    row.failure_reason = result.failure.reason if result.failure else None
    row.log_path = result.log_path
    row.pgid = result.pgid if result.pgid is not None else row.pgid
    row.finished_at = now
    started = as_utc(row.started_at)
    row.duration_s = (
        result.wall_s if result.wall_s is not None else (now - started).total_seconds() if started else None
    )
    job = tuning.get_job(session, job_id)
    serving = tuning.job_spec(job).serving
    row.gpu_seconds = trial_gpu_seconds(row.duration_s, gpus_held(serving, result.hardware or job.hardware))
    return result


def trial_result(row: TrialRow) -> TrialResult | None:
    return from_jsonable(TrialResult, row.result) if row.result else None


def finished_trial_processes(session: Session, host: str, since: datetime) -> list[TrialProcess]:
    """Trials run on ``host`` that are over (in the store) but recorded a process group: where an orphan
    server can be left when the job was recovered from another host, which cannot kill it."""
    open_states = (TrialStatus.QUEUED.value, TrialStatus.RUNNING.value)
    rows = session.scalars(
        select(TrialRow).where(
            TrialRow.pgid.is_not(None),
            TrialRow.status.not_in(open_states),
            TrialRow.worker.like(f"%@{host}"),
            TrialRow.finished_at >= since,
        )
    )
    # every row has a pgid (the query's filter); the check says so to the type checker
    return [TrialProcess(r.job_id, r.number, r.pgid, r.worker) for r in rows if r.pgid is not None]


def mark_trial_abandoned(session: Session, row: TrialRow, reason: str) -> None:
    """A trial whose runner died: failed as infrastructure, so the number is never reused for a result."""
    row.status = TrialStatus.FAILED.value
    row.failure_class = FailureClass.INFRA.value
    row.failure_reason = reason
    row.finished_at = utc_now()
    row.engine = row.engine or "unknown"


def _running_trials(session: Session, job_id: str) -> list[TrialRow]:
    return list(
        session.scalars(select(TrialRow).where(TrialRow.job_id == job_id, TrialRow.status == TrialStatus.RUNNING.value))
    )


# --------------------------------------------------------------------------------------------------
# Recovery, progress, publication
# --------------------------------------------------------------------------------------------------
def recover(session: Session, job_id: str) -> Recovery:
    """What a runner taking over ``job_id`` must know: trials its dead runner left running are failed here
    (``INFRA``, so their numbers never carry a result) and returned with the process groups they recorded;
    finished trials come back with their results, and those that failed without one as abandoned."""
    stale = _running_trials(session, job_id)
    left = tuple(TrialProcess(job_id, r.number, r.pgid, r.worker) for r in stale if r.pgid)
    for row in stale:
        mark_trial_abandoned(session, row, f"runner {row.worker} died during the trial; re-queued")
    results: dict[int, TrialResult] = {}
    abandoned: list[tuple[int, str | None]] = []
    rows = tuning.list_trials(session, job_id)
    for row in rows:
        if not TrialStatus(row.status).is_finished():
            continue
        result = trial_result(row)
        if result is None:  # failed without a result: its runner died (now, or in an earlier recovery)
            abandoned.append((row.number, row.worker))
        else:
            results[row.number] = result
    return Recovery(
        results=results,
        abandoned=tuple(abandoned),
        left_running=left,
        known=tuple(sorted(r.number for r in rows)),
    )


def job_best(outcome: TuneOutcome, engine: Engine) -> dict[str, Any]:
    """The job's ``best`` (what GET /tune/{id} shows): the configuration to deploy so far and its evidence."""
    return {
        "speculative_config": outcome.deployed.to_vllm(),
        "label": outcome.deployed.label(),
        "trial": outcome.best_trial,
        "speedup": to_jsonable(outcome.speedup),
        "notes": list(outcome.notes),
        "skipped": to_jsonable(outcome.skipped),
        "grid_size": outcome.grid_size,
        "deployed_losses": dict(outcome.deployed_losses),
        "engine": engine.value,
        "simulated": engine is Engine.SIMULATED,
    }


def record_progress(
    session: Session, job_id: str, *, finished: int, failed: int, best: Mapping[str, Any] | None
) -> None:
    """Trial counts, and the best so far once there is a baseline to compare with."""
    row = tuning.get_job(session, job_id)
    progress = dict(row.progress or {})
    progress.update(trials_finished=finished, trials_failed=failed)
    row.progress = progress
    if best is not None:
        row.best = dict(best)


def end_job(session: Session, claim: Claim, status: JobStatus, error: str | None = None) -> bool:
    """End the job without an outcome (failed, cancelled). False when this claim had ended it already."""
    if tuning.finished_under(session, claim) is not None:
        return False  # a retry whose first commit went through
    tuning.fence(session, claim)
    return tuning.finish_job(session, claim.job_id, claim.worker, status, error=error, epoch=claim.epoch)


def publish_outcome(
    session: Session,
    claim: Claim,
    spec: JobSpec,
    outcome: TuneOutcome,
    results: Mapping[int, TrialResult],
) -> JobStatus | None:
    """End the job with its outcome: the recommendation stored and the job succeeded, or the job failed when
    its baseline could not be measured. None when this claim had ended it already (a retried commit)."""
    if tuning.finished_under(session, claim) is not None:
        return None
    tuning.fence(session, claim)
    job = tuning.get_job(session, claim.job_id)
    baseline = outcome.baseline_trial
    if baseline is None or baseline not in results or not results[baseline].status.has_figures():
        reason = next((r.failure.reason for r in results.values() if r.spec.is_off and r.failure), "no baseline")
        error = f"the no-speculation baseline could not be measured: {reason}"
        tuning.finish_job(session, claim.job_id, claim.worker, JobStatus.FAILED, error=error, epoch=claim.epoch)
        return JobStatus.FAILED
    traffic = tuning.get_traffic(session, job.traffic_id)
    recommendations.publish(session, job, spec, outcome, dict(results), traffic)
    job.best = job_best(outcome, spec.engine)
    tuning.finish_job(session, claim.job_id, claim.worker, JobStatus.SUCCEEDED, epoch=claim.epoch)
    return JobStatus.SUCCEEDED
