"""GET /recommendation: the best measured configuration, ready to deploy, with its evidence."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from tuner import recommendations
from tuner.api.deps import Reader
from tuner.api.errors import problem_responses
from tuner.api.schemas import PLAIN
from tuner.domain import Engine

router = APIRouter(tags=["recommendation"])


@router.get("/recommendation", responses=problem_responses(404))
async def get_recommendation(
    request: Request,
    who: Reader,
    model: Annotated[str, Query(min_length=1, max_length=500, pattern=PLAIN)],
    hardware: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9_-]{0,49}$")] = None,
    concurrency: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    workload: Annotated[
        str | None, Query(max_length=200, pattern=PLAIN, description="Workload class, fingerprint or sample id")
    ] = None,
    engine: Annotated[Engine, Query(description="Simulated results answer only when asked for")] = Engine.VLLM,
    revision: Annotated[str | None, Query(max_length=200, pattern=PLAIN)] = None,
    serving_key: Annotated[
        str | None,
        Query(pattern=r"^[0-9a-f]{64}$", description="The production serving configuration's key (serving_key)"),
    ] = None,
) -> dict[str, Any]:
    # The hottest read: one thread-pool hop for all of it, in a read-only session (nothing to commit),
    # instead of three (a sync route plus the enter and exit of the committing session dependency).
    def read() -> dict[str, Any]:
        with request.app.state.session_factory() as session:
            return recommendations.find(
                session,
                model=model,
                hardware=hardware,
                concurrency=concurrency,
                workload=workload,
                engine=engine,
                revision=revision,
                serving=serving_key,
                team=who.team_filter,
                cache=request.app.state.render_cache,
            )

    return await run_in_threadpool(read)
