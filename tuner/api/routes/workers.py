"""GET /workers: what each worker reported of itself (chip, driver, vLLM version, its vLLM's capabilities).

``tuner space --server URL`` builds a job's search space from these, so a person sees what would be tried
on the fleet before a GPU is spent.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import select

from tuner.api.deps import Reader, SessionDep
from tuner.api.errors import problem_responses
from tuner.store.models import WorkerRow

router = APIRouter(tags=["workers"])


@router.get("/workers", responses=problem_responses())
def list_workers(session: SessionDep, who: Reader) -> list[dict[str, Any]]:
    rows = session.scalars(select(WorkerRow).order_by(WorkerRow.last_seen.desc())).all()
    return [
        {
            "name": r.name,
            "hardware": r.hardware,
            "families": (r.report or {}).get("families") or ([r.hardware] if r.hardware else []),
            "vllm_version": r.vllm_version,
            "driver": r.driver,
            "last_seen": r.last_seen.isoformat(),
            "vllm_capabilities": (r.report or {}).get("vllm_capabilities"),
        }
        for r in rows
    ]
