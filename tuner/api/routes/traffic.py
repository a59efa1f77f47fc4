"""POST /traffic, GET /traffic/{id}, DELETE /traffic/{id} (removes prompts, keeps stats and fingerprint)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, status
from starlette.concurrency import run_in_threadpool

from tuner import tuning
from tuner.api.deps import Reader, SessionDep, Writer
from tuner.api.errors import problem_responses
from tuner.api.limits import CheckedJsonRoute
from tuner.api.schemas import PLAIN, SampleId, TrafficOut
from tuner.errors import InvalidInput, PayloadTooLarge
from tuner.store.models import TrafficSampleRow
from tuner.traffic import TrafficError, parse_traffic

router = APIRouter(tags=["traffic"], route_class=CheckedJsonRoute)


def traffic_out(row: TrafficSampleRow) -> TrafficOut:
    return TrafficOut(
        id=row.id,
        name=row.name,
        fingerprint=row.fingerprint,
        workload_class=row.workload_class,
        request_count=row.request_count,
        stats=row.stats,
        prompts_deleted=row.content is None,
        created_at=row.created_at,
        expires_at=row.expires_at,
    )


async def _read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the sample is larger than the {limit} byte limit (TUNER_MAX_TRAFFIC_BYTES)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the sample is larger than the {limit} byte limit (TUNER_MAX_TRAFFIC_BYTES)")
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "/traffic",
    status_code=status.HTTP_201_CREATED,
    response_model=TrafficOut,
    responses=problem_responses(),
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/x-ndjson": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "array", "items": {"type": "object"}, "minItems": 1}},
            },
        }
    },
)
async def upload_traffic(
    request: Request,
    who: Writer,
    session: SessionDep,
    name: Annotated[str | None, Query(max_length=200, pattern=PLAIN)] = None,
) -> TrafficOut:
    """Upload a sample as JSONL or JSON: OpenAI chat requests, vLLM custom bench lines, or ShareGPT JSON."""
    settings = request.app.state.settings
    data = await _read_limited(request, settings.max_traffic_bytes)
    filename = (
        "sample.json"
        if "json" in request.headers.get("content-type", "") and "nd" not in request.headers.get("content-type", "")
        else None
    )

    def work() -> TrafficOut:
        try:
            requests = parse_traffic(data, filename)
        except UnicodeDecodeError:
            raise InvalidInput("the sample is not UTF-8 text", errors=[{"field": "body"}]) from None
        except TrafficError as e:
            raise InvalidInput(
                str(e), errors=[{"field": f"line {le.line}", "line": le.line, "message": le.message} for le in e.errors]
            ) from None
        row = tuning.create_traffic(
            session, requests, name=name, retention_days=settings.traffic_retention_days, team=who.team
        )
        return traffic_out(row)

    return await run_in_threadpool(work)


@router.get("/traffic/{traffic_id}", response_model=TrafficOut, responses=problem_responses(404))
def get_traffic(traffic_id: SampleId, who: Reader, session: SessionDep) -> TrafficOut:
    return traffic_out(tuning.get_traffic(session, traffic_id, who.team_filter))


@router.delete("/traffic/{traffic_id}", response_model=TrafficOut, responses=problem_responses(404, 409))
def delete_traffic(traffic_id: SampleId, who: Writer, session: SessionDep) -> TrafficOut:
    """Delete the sample's prompts and everything derived from them (the baseline's reference outputs)."""
    return traffic_out(tuning.delete_traffic_content(session, traffic_id, who.team_filter))
