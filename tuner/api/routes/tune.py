"""POST /tune, GET /tune/{id}, GET /tune/{id}/trials, POST /tune/{id}/cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Response, status

from tuner import tuning
from tuner.api.deps import CanRead, CanTune, SessionDep, SettingsDep
from tuner.api.schemas import JobOut, TrialOut, TuneIn
from tuner.domain import Engine, JobSpec, ModelRef, SpecConfig, from_jsonable
from tuner.errors import InvalidInput
from tuner.store.models import JobRow, TrialRow
from tuner.traffic import TrafficError, requests_from_json

router = APIRouter(tags=["tune"])


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
        result=row.result,
    )


@router.post("/tune", status_code=status.HTTP_202_ACCEPTED, dependencies=[CanTune], response_model=JobOut)
def create_tune_job(
    body: TuneIn,
    session: SessionDep,
    settings: SettingsDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> JobOut:
    """Queue a tune job. Returns 202 with the job and its Location; an Idempotency-Key makes retries safe."""
    if body.trust_remote_code and not settings.allow_trust_remote_code:
        raise InvalidInput(
            "trust_remote_code is disabled on this server (TUNER_ALLOW_TRUST_REMOTE_CODE)",
            errors=[{"field": "trust_remote_code", "message": "not allowed by the server's settings"}],
        )
    if isinstance(body.traffic, list):
        if len(body.traffic) > settings.max_inline_requests:
            raise InvalidInput("too many inline requests", errors=[{"field": "traffic"}])
        try:
            requests = requests_from_json(body.traffic)
        except (TrafficError, ValueError) as e:
            raise InvalidInput(f"traffic: {e}", errors=[{"field": "traffic", "message": str(e)}]) from None
        if not requests:
            raise InvalidInput("traffic holds no usable request", errors=[{"field": "traffic"}])
        traffic_id = tuning.create_traffic(session, requests, retention_days=settings.traffic_retention_days).id
    else:
        traffic_id = body.traffic
        requests = tuning.traffic_requests(session, traffic_id)
    levels = body.levels() or tuning.default_levels(len(requests), body.num_requests, body.warmup_requests)
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
    )
    row, created = tuning.submit_job(session, spec, idempotency_key=idempotency_key)
    response.headers["Location"] = f"/tune/{row.id}"
    if not created:
        response.status_code = status.HTTP_200_OK
    return job_out(row)


@router.get("/tune/{job_id}", dependencies=[CanRead], response_model=JobOut)
def get_tune_job(job_id: str, session: SessionDep) -> JobOut:
    return job_out(tuning.get_job(session, job_id))


@router.get("/tune/{job_id}/trials", dependencies=[CanRead], response_model=list[TrialOut])
def get_tune_trials(job_id: str, session: SessionDep) -> list[TrialOut]:
    return [trial_out(t) for t in tuning.list_trials(session, job_id)]


@router.post(
    "/tune/{job_id}/cancel", status_code=status.HTTP_202_ACCEPTED, dependencies=[CanTune], response_model=JobOut
)
def cancel_tune_job(job_id: str, session: SessionDep) -> JobOut:
    """Stop a job from any process: its runner stops running trials and their processes."""
    return job_out(tuning.request_cancel(session, job_id))
