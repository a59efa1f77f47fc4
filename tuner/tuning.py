"""Use cases on jobs, traffic and trials: what the API, the CLI and the runners call.

Functions take a Session and never commit: the caller owns the transaction (the API's request session, or
``store.db.transaction`` in a runner).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from sqlalchemy import CursorResult, Result, and_, or_, select, update
from sqlalchemy.orm import Session

from tuner.domain import (
    Engine,
    JobSpec,
    JobStatus,
    Purpose,
    TrafficRequest,
    fingerprint,
    from_jsonable,
    to_jsonable,
)
from tuner.domain.cost import TrialCost, TuningCost, tuning_cost
from tuner.errors import Conflict, InvalidInput, NotFound
from tuner.store.models import DEFAULT_TEAM, JobRow, TrafficSampleRow, TrialRow, WorkerRow
from tuner.traffic import requests_from_json, requests_to_json, sample_fingerprint, sample_stats


def utc_now() -> datetime:
    return datetime.now(UTC)


@overload
def as_utc(dt: datetime) -> datetime: ...
@overload
def as_utc(dt: None) -> None: ...
def as_utc(dt: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes for timezone-aware columns; they were written in UTC."""
    if dt is not None and dt.tzinfo is None:
        return dt.replace(tzinfo=UTC)
    return dt


def new_id() -> str:
    return uuid.uuid4().hex


# --------------------------------------------------------------------------------------------------
# Traffic
# --------------------------------------------------------------------------------------------------
def create_traffic(
    session: Session,
    requests: Sequence[TrafficRequest],
    *,
    name: str | None = None,
    retention_days: float | None = None,
    team: str = DEFAULT_TEAM,
) -> TrafficSampleRow:
    if not requests:
        raise InvalidInput("the traffic sample holds no request", errors=[{"field": "traffic"}])
    stats = sample_stats(requests)
    now = utc_now()
    row = TrafficSampleRow(
        id=new_id(),
        name=name,
        team=team,
        content=requests_to_json(requests),
        fingerprint=sample_fingerprint(requests),
        workload_class=stats.workload_class,
        request_count=len(requests),
        stats=to_jsonable(stats) | {"workload_class": stats.workload_class},
        created_at=now,
        expires_at=now + timedelta(days=retention_days) if retention_days else None,
    )
    session.add(row)
    session.flush()
    return row


def get_traffic(session: Session, traffic_id: str, team: str | None = None) -> TrafficSampleRow:
    """The sample, if ``team`` owns it (None: any team). Another team's sample is as absent as an unknown id."""
    row = session.get(TrafficSampleRow, traffic_id)
    if row is None or (team is not None and row.team != team):
        raise NotFound(f"no traffic sample {traffic_id}")
    return row


def traffic_requests(session: Session, traffic_id: str, team: str | None = None) -> list[TrafficRequest]:
    row = get_traffic(session, traffic_id, team)
    if row.content is None:
        raise Conflict(f"traffic sample {traffic_id} had its prompts deleted; upload it again to tune on it")
    return requests_from_json(row.content)


def delete_traffic_content(session: Session, traffic_id: str, team: str | None = None) -> TrafficSampleRow:
    """Remove the prompts and what was derived from them (they can hold user data): the baseline trials'
    greedy outputs, kept as the correctness reference. Stats and fingerprint stay, for recommendations.

    A sample a queued or running job still replays is a 409: its runner holds the prompts in memory and would
    write new reference outputs after the delete. Cancel the job first.
    """
    row = get_traffic(session, traffic_id, team)
    active = session.scalars(
        select(JobRow.id).where(
            JobRow.traffic_id == traffic_id,
            JobRow.status.in_([JobStatus.QUEUED.value, JobStatus.RUNNING.value]),
        )
    ).all()
    if active:
        raise Conflict(f"traffic sample {traffic_id} is in use by job(s) {', '.join(active)}; cancel them first")
    _forget_outputs(session, traffic_id)
    if row.content is not None:
        row.content = None
        row.content_deleted_at = utc_now()
    return row


def _forget_outputs(session: Session, traffic_id: str) -> None:
    trials = session.scalars(
        select(TrialRow).join(JobRow, TrialRow.job_id == JobRow.id).where(JobRow.traffic_id == traffic_id)
    )
    for trial in trials:
        if trial.result and trial.result.get("reference_outputs"):
            trial.result = {**trial.result, "reference_outputs": None}


def purge_expired_traffic(session: Session, now: datetime | None = None) -> int:
    now = now or utc_now()
    rows = session.scalars(
        select(TrafficSampleRow).where(
            TrafficSampleRow.expires_at.is_not(None),
            TrafficSampleRow.expires_at <= now,
            TrafficSampleRow.content.is_not(None),
        )
    ).all()
    purged = 0
    for row in rows:
        try:
            delete_traffic_content(session, row.id)  # refuses before it changes anything
        except Conflict:
            continue  # a job still replays it: purged on a later pass, once the job has ended
        purged += 1
    return purged


# --------------------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------------------
def _team_key(team: str, key: str) -> str:
    """Idempotency keys are the client's; two teams choosing the same key must not meet."""
    return f"{team}/{key}"


def job_for_idempotency_key(
    session: Session, key: str, request_fingerprint: str, team: str = DEFAULT_TEAM
) -> JobRow | None:
    """The job an earlier POST with this key created, if any; a different body under the same key is a 409."""
    existing = session.scalars(select(JobRow).where(JobRow.idempotency_key == _team_key(team, key))).first()
    if existing is not None and existing.request_fingerprint != request_fingerprint:
        raise Conflict("this Idempotency-Key was already used with a different request body")
    return existing


def submit_job(
    session: Session,
    spec: JobSpec,
    *,
    idempotency_key: str | None = None,
    request_fingerprint: str | None = None,
    team: str = DEFAULT_TEAM,
) -> tuple[JobRow, bool]:
    """Queue a job. With an idempotency key, a retried POST of the same body returns the same job.

    ``request_fingerprint`` identifies the request as the client sent it (the API passes the body's, so that
    inline traffic, stored anew on every POST, does not make a retry look different); default: the spec's.
    """
    body = to_jsonable(spec)
    body_fp = request_fingerprint or fingerprint(body)
    if idempotency_key:
        existing = job_for_idempotency_key(session, idempotency_key, body_fp, team)
        if existing is not None:
            return existing, False
    traffic = get_traffic(session, spec.traffic_id, team)
    if traffic.content is None:
        raise Conflict(f"traffic sample {spec.traffic_id} had its prompts deleted")
    row = JobRow(
        id=new_id(),
        team=team,
        model=spec.model.name,
        revision=spec.model.revision,
        hardware=spec.hardware,
        engine=spec.engine.value,
        traffic_id=spec.traffic_id,
        objective=spec.objective.value,
        slo=body["slo"],
        levels=body["levels"],
        budget=body["budget"],
        spec=body,
        status=JobStatus.QUEUED.value,
        idempotency_key=_team_key(team, idempotency_key) if idempotency_key else None,
        request_fingerprint=body_fp,
        created_at=utc_now(),
        progress={"trials_finished": 0, "trials_failed": 0, "max_trials": spec.budget.max_trials},
    )
    session.add(row)
    session.flush()
    return row, True


def job_spec(row: JobRow) -> JobSpec:
    return from_jsonable(JobSpec, row.spec)


def get_job(session: Session, job_id: str, team: str | None = None) -> JobRow:
    """The job, if ``team`` owns it (None: any team). Another team's job is as absent as an unknown id."""
    row = session.get(JobRow, job_id)
    if row is None or (team is not None and row.team != team):
        raise NotFound(f"no tune job {job_id}")
    return row


def list_jobs(
    session: Session, team: str | None, *, limit: int, before: str | None = None, status: str | None = None
) -> list[JobRow]:
    """``team``'s jobs (None: every team's), newest first, at most ``limit``; ``before``: only jobs created
    before that one (the next page), which must itself be the team's."""
    query = select(JobRow)
    if team is not None:
        query = query.where(JobRow.team == team)
    if status is not None:
        query = query.where(JobRow.status == status)
    if before is not None:
        anchor = get_job(session, before, team)
        # ties on created_at are broken by id, so a page boundary between equal timestamps loses nothing
        query = query.where(
            or_(
                JobRow.created_at < anchor.created_at,
                and_(JobRow.created_at == anchor.created_at, JobRow.id < anchor.id),
            )
        )
    return list(session.scalars(query.order_by(JobRow.created_at.desc(), JobRow.id.desc()).limit(limit)))


def list_trials(session: Session, job_id: str, team: str | None = None) -> list[TrialRow]:
    get_job(session, job_id, team)
    return list(session.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.number)))


def job_cost(row: JobRow, trials: Sequence[TrialRow]) -> TuningCost:
    """What the job's finished trials cost in GPU-seconds, by purpose, beside the grid's estimate."""
    grid = (row.best or {}).get("grid_size")
    return tuning_cost(
        (TrialCost(Purpose(t.purpose), t.duration_s, t.gpu_seconds) for t in trials),
        grid_trials=int(grid) if grid else None,
        simulated=row.engine == Engine.SIMULATED.value,
    )


def request_cancel(session: Session, job_id: str, team: str | None = None) -> JobRow:
    """Cancel from any process: a queued job ends now, a running one is stopped by its runner."""
    row = get_job(session, job_id, team)
    if JobStatus(row.status).is_finished():
        raise Conflict(f"job {job_id} is already {row.status}")
    row.cancel_requested = True
    if row.status == JobStatus.QUEUED.value:
        row.status = JobStatus.CANCELLED.value
        row.finished_at = utc_now()
    return row


def claim_job(
    session: Session,
    worker: str,
    *,
    stale_after_s: float,
    job_id: str | None = None,
    hardware: Sequence[str] | None = None,
) -> JobRow | None:
    """Atomically claim one queued job, or a running one whose runner stopped heart-beating.

    ``hardware``: the chip families this runner can run (None: any, e.g. a Ray coordinator).
    The claim is a conditional UPDATE whose WHERE repeats the eligibility test, so of two runners racing for
    the same row exactly one sees rowcount 1 (on SQLite and PostgreSQL alike). A running job whose runner died
    is claimed even when its cancel was requested: the claimer kills what the dead runner left and ends the
    job as cancelled (a queued job is cancelled at once by ``request_cancel``, so it never waits here).
    """
    now = utc_now()
    stale = now - timedelta(seconds=stale_after_s)
    eligible = or_(
        and_(JobRow.status == JobStatus.QUEUED.value, JobRow.cancel_requested.is_(False)),
        and_(JobRow.status == JobStatus.RUNNING.value, or_(JobRow.heartbeat_at.is_(None), JobRow.heartbeat_at < stale)),
    )
    query = select(JobRow.id).where(eligible).order_by(JobRow.created_at)
    if hardware is not None:
        # A job for one chip never runs on another: a worker claims only jobs for its hardware (or "auto"),
        # and simulated jobs, which stand in for any chip.
        query = query.where(
            or_(
                JobRow.hardware.in_([*hardware, "auto"]),
                JobRow.engine == Engine.SIMULATED.value,
            )
        )
    if job_id is not None:
        query = query.where(JobRow.id == job_id)
    for candidate in session.scalars(query.limit(5)).all():
        res = session.execute(
            update(JobRow)
            .where(JobRow.id == candidate, eligible)
            .values(
                status=JobStatus.RUNNING.value,
                claimed_by=worker,
                heartbeat_at=now,
                attempts=JobRow.attempts + 1,
            )
            .execution_options(synchronize_session=False)
        )
        if _rows_matched(res) == 1:
            row = session.get(JobRow, candidate, populate_existing=True)
            assert row is not None
            if row.started_at is None:
                row.started_at = now
            return row
    return None


class LostClaim(Exception):
    """Another runner claimed the job (this one's heartbeat went stale): stop, and write nothing more."""


@dataclass(frozen=True)
class Claim:
    """A runner's hold on a job. ``epoch`` is the job's ``attempts`` after this claim: a later claim by
    anyone raises it, so a write that checks it cannot come from a runner that lost the job."""

    job_id: str
    worker: str
    epoch: int


def own_running_job(session: Session, worker: str) -> JobRow | None:
    """The running job this worker holds, if any: a claim whose commit was lost in a database restart is
    found again by the retry instead of claiming a second job (and leaving the first one stuck)."""
    return session.scalars(
        select(JobRow).where(JobRow.claimed_by == worker, JobRow.status == JobStatus.RUNNING.value).limit(1)
    ).first()


def fence(session: Session, claim: Claim) -> bool:
    """Refresh the claim inside the caller's transaction and check it is still ours; returns cancel-requested.

    Every runner write starts with this. It is an UPDATE of the job row, so on PostgreSQL it holds the row
    lock until the caller commits: a concurrent take-over (a conditional UPDATE of the same row) waits, then
    re-checks its WHERE, sees the fresh heartbeat and does not claim. On SQLite writers are serialised."""
    res = session.execute(
        update(JobRow)
        .where(
            JobRow.id == claim.job_id,
            JobRow.claimed_by == claim.worker,
            JobRow.attempts == claim.epoch,
            JobRow.status == JobStatus.RUNNING.value,
        )
        .values(heartbeat_at=utc_now())
        .execution_options(synchronize_session=False)
    )
    if _rows_matched(res) != 1:
        raise LostClaim(f"job {claim.job_id} is no longer held by {claim.worker} (epoch {claim.epoch})")
    return bool(session.scalar(select(JobRow.cancel_requested).where(JobRow.id == claim.job_id)))


def finished_under(session: Session, claim: Claim) -> JobStatus | None:
    """The job's final status if this very claim ended it (a retried finish whose first commit went through)."""
    row = session.get(JobRow, claim.job_id, populate_existing=True)
    if row is None or row.claimed_by != claim.worker or row.attempts != claim.epoch:
        return None
    status = JobStatus(row.status)
    return status if status.is_finished() else None


def finish_job(
    session: Session, job_id: str, worker: str, status: JobStatus, *, error: str | None = None, epoch: int | None = None
) -> bool:
    conditions = [JobRow.id == job_id, JobRow.claimed_by == worker, JobRow.status == JobStatus.RUNNING.value]
    if epoch is not None:
        conditions.append(JobRow.attempts == epoch)
    res = session.execute(
        update(JobRow)
        .where(*conditions)
        .values(status=status.value, error=error, finished_at=utc_now())
        .execution_options(synchronize_session=False)
    )
    return _rows_matched(res) == 1


def _rows_matched(result: Result[Any]) -> int:
    """The rows an UPDATE matched. ``Session.execute`` is typed to return a ``Result``; for an UPDATE without
    RETURNING it is the cursor's ``CursorResult``, the one that counts rows."""
    if not isinstance(result, CursorResult):
        raise TypeError(f"an UPDATE returned a {type(result).__name__}, which counts no rows")
    return result.rowcount


# --------------------------------------------------------------------------------------------------
# Workers
# --------------------------------------------------------------------------------------------------
def report_worker(session: Session, name: str, report: dict) -> None:
    row = session.get(WorkerRow, name)
    if row is None:
        row = WorkerRow(name=name, report=report)
        session.add(row)
    row.report = report
    row.hardware = report.get("hardware")
    row.vllm_version = report.get("vllm_version")
    row.driver = report.get("driver")
    row.last_seen = utc_now()


def hardware_seen(session: Session, hardware: str) -> bool:
    """Whether any worker has reported this chip family (a Ray runner reports each family its cluster has)."""
    rows = session.scalars(select(WorkerRow)).all()
    return any(r.hardware == hardware or hardware in (r.report or {}).get("families", ()) for r in rows)
