"""GET /healthz and GET /metrics (Prometheus text, computed from the store so every runner's work counts)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from tuner.api.deps import SessionDep
from tuner.api.errors import PUBLIC_RESPONSES

router = APIRouter(tags=["ops"])


@router.get("/healthz", responses=PUBLIC_RESPONSES)
def healthz(session: SessionDep) -> dict[str, str]:
    session.execute(text("SELECT 1"))
    return {"status": "ok"}


@router.get(
    "/metrics",
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}, "description": "Prometheus text"},
        **PUBLIC_RESPONSES,
    },
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
