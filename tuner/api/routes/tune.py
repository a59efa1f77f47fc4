"""POST /tune, GET /tune/{id}, GET /tune/{id}/trials, POST /tune/{id}/cancel."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response, status
from fastapi.responses import HTMLResponse
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from tuner import model_files, report, tuning
from tuner.api.deps import Reader, SessionDep, SettingsDep, Writer
from tuner.api.errors import problem_responses
from tuner.api.limits import CheckedJsonRoute
from tuner.api.schemas import CostOut, JobId, JobOut, TrialOut, TuneIn
from tuner.domain import (
    Engine,
    JobSpec,
    JobStatus,
    ModelRef,
    SpecConfig,
    TrafficRequest,
    TrialStatus,
    fingerprint,
    from_jsonable,
)
from tuner.errors import InvalidInput
from tuner.load_levels import default_levels
from tuner.settings import Settings
from tuner.store.models import JobRow, TrialRow
from tuner.traffic import TrafficError, over_context, parse_items

router = APIRouter(tags=["tune"], route_class=CheckedJsonRoute)


def job_out(row: JobRow) -> JobOut:
    return JobOut(
        id=row.id,
        status=row.status,
        model=row.model,
        revision=row.revision,
        hardware=row.hardware,
        engine=row.engine,
        simulated=row.engine == Engine.SIMULATED.value,
        objective=row.objective,
        traffic_id=row.traffic_id,
        progress=row.progress,
        best=row.best,
        error=row.error,
        cancel_requested=row.cancel_requested,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        links={
            "self": f"/tune/{row.id}",
            "trials": f"/tune/{row.id}/trials",
            "cancel": f"/tune/{row.id}/cancel",
            "report": f"/tune/{row.id}/report",
            "recommendation": f"/recommendation?model={row.model}"
            + ("&engine=simulated" if row.engine == Engine.SIMULATED.value else ""),
        },
    )


def trial_out(row: TrialRow) -> TrialOut:
    return TrialOut(
        number=row.number,
        purpose=row.purpose,
        method=row.method,
        speculative_config=from_jsonable(SpecConfig, row.config).to_vllm(),
        status=row.status,
        engine=row.engine,
        simulated=row.engine == Engine.SIMULATED.value,
        failure_class=row.failure_class,
        failure_reason=row.failure_reason,
        log_path=row.log_path,
        worker=row.worker,
        started_at=row.started_at,
        finished_at=row.finished_at,
        duration_s=row.duration_s,
        gpu_seconds=row.gpu_seconds,
        phase=row.stage if row.status == TrialStatus.RUNNING.value else None,
        level=row.stage_level if row.status == TrialStatus.RUNNING.value else None,
        result=row.result,
    )


@router.post(
    "/tune",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses={
        200: {"model": JobOut, "description": "A retry with the same Idempotency-Key: the first job"},
        **problem_responses(404, 409),
    },
)
def create_tune_job(
    body: TuneIn,
    who: Writer,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200, pattern=r"^[\x21-\x7e]+$")] = None,
) -> JobOut:
    """Queue a tune job. Returns 202 with the job and its Location; an Idempotency-Key makes retries safe.

    A retry with the same key and the same body returns the first job (200); the same key with another body
    is a 409. The key is matched on the body as sent, so inline traffic does not make a retry look new.
    """
    if body.trust_remote_code and not settings.allow_trust_remote_code:
        raise InvalidInput(
            "trust_remote_code is disabled on this server (TUNER_ALLOW_TRUST_REMOTE_CODE)",
            errors=[{"field": "trust_remote_code", "message": "not allowed by the server's settings"}],
        )
    request_fp = fingerprint(body.model_dump(mode="json"))
    if idempotency_key:
        existing = tuning.job_for_idempotency_key(session, idempotency_key, request_fp, who.team)
        if existing is not None:
            return _located(job_out(existing), response, created=False)
    try:
        row, created = _submit(body, session, settings, idempotency_key, request_fp, who.team)
    except IntegrityError:
        # A twin POST with the same key committed first: drop this attempt (its inline sample too), answer theirs.
        session.rollback()
        existing = (
            tuning.job_for_idempotency_key(session, idempotency_key, request_fp, who.team) if idempotency_key else None
        )
        if existing is None:
            raise
        return _located(job_out(existing), response, created=False)
    return _located(job_out(row), response, created=created)


def _located(job: JobOut, response: Response, *, created: bool) -> JobOut:
    response.headers["Location"] = f"/tune/{job.id}"
    if not created:
        response.status_code = status.HTTP_200_OK
    return job


def _inline_traffic(items: list[dict[str, Any]], settings: Settings) -> list[TrafficRequest]:
    if len(items) > settings.max_inline_requests:
        raise InvalidInput(
            f"too many inline requests ({len(items)} > {settings.max_inline_requests}); upload them with POST /traffic",
            errors=[{"field": "traffic", "message": "too many inline requests"}],
        )
    try:
        return parse_items(items)
    except TrafficError as e:
        raise InvalidInput(
            f"traffic: {e}",
            errors=[{"field": f"traffic.{le.line - 1}", "item": le.line - 1, "message": le.message} for le in e.errors]
            or [{"field": "traffic", "message": str(e)}],
        ) from None


def _check_context(body: TuneIn, requests: list[TrafficRequest], settings: Settings) -> None:
    """A request longer than the servers' context is refused now, with its index, not after a start-up."""
    model_dir = model_files.local_dir(body.model, settings.model_root_list)
    context = model_files.context_length(body.serving.args, body.hf_config, model_dir)
    if context is None:
        return
    too_long = over_context(requests, context, model_files.token_counter(model_dir))
    if too_long:
        shown = ", ".join(f"{i} ({n} tokens)" for i, n in too_long[:20])
        raise InvalidInput(
            f"{len(too_long)} of {len(requests)} requests need more than the {context}-token context "
            f"(prompt plus output): {shown}{' ...' if len(too_long) > 20 else ''}",
            errors=[
                {"field": f"traffic.{i}", "item": i, "message": f"needs {n} > {context} tokens"} for i, n in too_long
            ],
        )


def _submit(
    body: TuneIn, session: Session, settings: Settings, idempotency_key: str | None, request_fp: str, team: str
) -> tuple[JobRow, bool]:
    if isinstance(body.traffic, list):
        requests = _inline_traffic(body.traffic, settings)
        traffic_id = tuning.create_traffic(
            session, requests, retention_days=settings.traffic_retention_days, team=team
        ).id
    else:
        traffic_id = body.traffic
        requests = tuning.traffic_requests(session, traffic_id, team)  # another team's sample is a 404
    _check_context(body, requests, settings)
    max_num_seqs = body.serving.args.get("max_num_seqs")
    levels = body.levels() or default_levels(
        len(requests),
        num_requests=body.num_requests,
        warmup_requests=body.warmup_requests,
        max_num_seqs=int(max_num_seqs) if isinstance(max_num_seqs, int) else None,
    )
    try:
        weights = body.weights_for(levels)
    except ValueError as e:
        raise InvalidInput(str(e), errors=[{"field": "level_weights", "message": str(e)}]) from None
    spec = JobSpec(
        model=ModelRef(body.model, body.revision, body.trust_remote_code),
        traffic_id=traffic_id,
        hardware=body.hardware,
        engine=body.engine,
        objective=body.objective,
        slo=body.slo.to_domain(),
        levels=levels,
        budget=body.budget.to_domain(),
        methods=tuple(body.search.methods) if body.search.methods else None,
        depth_range=body.search.depth_range,
        drafts={m.value: tuple(p) for m, p in body.search.drafts.items()},
        serving=body.serving.to_domain(),
        model_config=body.hf_config,
        confirm_runs=body.confirm_runs or settings.confirm_runs,
        correctness_prompts=body.correctness_prompts,
        seed=body.seed,
        level_weights=weights,
        compat_overrides={m.value: allow for m, allow in body.search.compat_overrides.items()},
        attention_backends=(
            {m.value: b for m, b in body.search.attention_backends.items()}
            if isinstance(body.search.attention_backends, dict)
            else body.search.attention_backends
        ),
    )
    return tuning.submit_job(session, spec, idempotency_key=idempotency_key, request_fingerprint=request_fp, team=team)


@router.get("/tune/{job_id}", response_model=JobOut, responses=problem_responses(404))
def get_tune_job(job_id: JobId, who: Reader, session: SessionDep) -> JobOut:
    row = tuning.get_job(session, job_id, who.team_filter)
    out = job_out(row)
    cost = tuning.job_cost(row, tuning.list_trials(session, job_id))
    out.cost = CostOut(**dataclasses.asdict(cost), gpu_hours=round(cost.gpu_hours, 4))
    if row.status == JobStatus.QUEUED.value and row.engine == Engine.VLLM.value and row.hardware != "auto":
        if not tuning.hardware_seen(session, row.hardware):
            out.waiting_for = f"no worker has reported {row.hardware} GPUs; the job runs when one does"
    return out


@router.get("/tune/{job_id}/trials", response_model=list[TrialOut], responses=problem_responses(404))
def get_tune_trials(job_id: JobId, who: Reader, session: SessionDep) -> list[TrialOut]:
    return [trial_out(t) for t in tuning.list_trials(session, job_id, who.team_filter)]


@router.get(
    "/tune/{job_id}/report",
    response_class=HTMLResponse,
    responses={
        200: {"content": {"text/html": {}}, "description": "One self-contained HTML page"},
        **problem_responses(404),
    },
)
def get_tune_report(job_id: JobId, who: Reader, session: SessionDep) -> HTMLResponse:
    """The job's report: speedup by concurrency, the deployed K by batch size, acceptance per position,
    throughput against latency with the SLOs, the trial timeline with failures, what was not run and why, the
    cost and the provenance. One HTML file with its charts' code inlined: it opens offline."""
    return HTMLResponse(report.job_report(session, job_id, who.team_filter))


@router.post(
    "/tune/{job_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses=problem_responses(404, 409),
)
def cancel_tune_job(job_id: JobId, who: Writer, session: SessionDep) -> JobOut:
    """Stop a job from any process: its runner stops running trials and their processes. The owning team's
    tokens and admin tokens may; to another team the job does not exist (404)."""
    return job_out(tuning.request_cancel(session, job_id, who.team_filter))
