"""GET /tune: the team's jobs, newest first, a page at a time (what `tuner jobs` shows)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Response

from tuner import tuning
from tuner.api.deps import Reader, SessionDep
from tuner.api.errors import problem_responses
from tuner.api.routes.tune import job_out
from tuner.api.schemas import ID_PATTERN, JobOut
from tuner.domain import JobStatus

router = APIRouter(tags=["tune"])


@router.get("/tune", response_model=list[JobOut], responses=problem_responses(404))
def list_tune_jobs(
    who: Reader,
    session: SessionDep,
    response: Response,
    limit: Annotated[int, Query(ge=1, le=200, description="At most this many jobs.")] = 20,
    before: Annotated[
        str | None, Query(pattern=ID_PATTERN, description="The next page: jobs created before this job.")
    ] = None,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
) -> list[JobOut]:
    """The team's jobs (an admin token: every team's), newest first. A full page carries a ``Link`` header
    (``rel="next"``) to the next; another team's job as ``before`` is a 404, as it is everywhere."""
    rows = tuning.list_jobs(
        session, who.team_filter, limit=limit, before=before, status=status.value if status else None
    )
    if len(rows) == limit:
        query = {"limit": limit, "before": rows[-1].id} | ({"status": status.value} if status else {})
        response.headers["Link"] = f'</tune?{urlencode(query)}>; rel="next"'
    return [job_out(r) for r in rows]
