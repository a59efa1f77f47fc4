"""SQLAlchemy tables. Ours are prefixed ``tuner_`` so they never collide with Optuna's, which share the database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

DEFAULT_TEAM = "default"  # where rows made before teams existed, and open-mode work, belong


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class TrafficSampleRow(Base):
    __tablename__ = "tuner_traffic_samples"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(200))
    team: Mapped[str] = mapped_column(String(100), index=True, server_default=DEFAULT_TEAM)  # the owner
    content: Mapped[list[Any] | None] = mapped_column(JSON)  # canonical requests; None once deleted
    content_deleted_at: Mapped[datetime | None]
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    workload_class: Mapped[str] = mapped_column(String(100), index=True)
    request_count: Mapped[int] = mapped_column(Integer)
    stats: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime | None]


class JobRow(Base):
    __tablename__ = "tuner_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    team: Mapped[str] = mapped_column(String(100), index=True, server_default=DEFAULT_TEAM)  # the owner
    model: Mapped[str] = mapped_column(String(500), index=True)
    revision: Mapped[str | None] = mapped_column(String(200))
    hardware: Mapped[str] = mapped_column(String(50))
    engine: Mapped[str] = mapped_column(String(20))
    traffic_id: Mapped[str] = mapped_column(ForeignKey("tuner_traffic_samples.id"))
    objective: Mapped[str] = mapped_column(String(20))
    slo: Mapped[dict[str, Any]] = mapped_column(JSON)
    levels: Mapped[list[Any]] = mapped_column(JSON)
    budget: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the full validated request (restrictions, serving, ...)
    status: Mapped[str] = mapped_column(String(20), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    best: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    idempotency_key: Mapped[str | None] = mapped_column(String(320), unique=True)  # "<team>/<client's key>"
    request_fingerprint: Mapped[str] = mapped_column(String(64))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    claimed_by: Mapped[str | None] = mapped_column(String(200))
    heartbeat_at: Mapped[datetime | None]
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class TrialRow(Base):
    __tablename__ = "tuner_trials"
    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_tuner_trials_job_number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("tuner_jobs.id"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    purpose: Mapped[str] = mapped_column(String(20))
    method: Mapped[str] = mapped_column(String(30))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)  # domain.SpecConfig
    levels: Mapped[list[Any]] = mapped_column(JSON)  # concurrency levels / rates measured
    status: Mapped[str] = mapped_column(String(20), index=True)
    engine: Mapped[str] = mapped_column(String(20))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # domain.TrialResult
    failure_class: Mapped[str | None] = mapped_column(String(30))
    failure_reason: Mapped[str | None] = mapped_column(Text)
    log_path: Mapped[str | None] = mapped_column(String(1000))
    worker: Mapped[str | None] = mapped_column(String(200))
    pgid: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    duration_s: Mapped[float | None] = mapped_column(Float)
    gpu_seconds: Mapped[float | None] = mapped_column(Float)  # duration_s x the GPUs its server held
    stage: Mapped[str | None] = mapped_column(String(20))  # a running trial's TrialStage
    stage_level: Mapped[str | None] = mapped_column(String(100))  # and its level: "2 of 3 (c8)"


class RecommendationRow(Base):
    __tablename__ = "tuner_recommendations"
    __table_args__ = (
        UniqueConstraint("job_id", "scope", name="uq_tuner_recommendations_job_scope"),
        Index("ix_tuner_recommendations_key", "model", "hardware", "engine"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("tuner_jobs.id"))
    scope: Mapped[str] = mapped_column(String(40))  # "all" or a concurrency range label such as "c5-16"
    model: Mapped[str] = mapped_column(String(500))
    revision: Mapped[str | None] = mapped_column(String(200))
    hardware: Mapped[str] = mapped_column(String(50))
    vllm_version: Mapped[str | None] = mapped_column(String(50))
    driver: Mapped[str | None] = mapped_column(String(100))
    engine: Mapped[str] = mapped_column(String(20))
    serving_key: Mapped[str] = mapped_column(String(64))
    workload_fingerprint: Mapped[str] = mapped_column(String(64))
    workload_class: Mapped[str] = mapped_column(String(100))
    traffic_id: Mapped[str] = mapped_column(String(32))
    concurrency_low: Mapped[int] = mapped_column(Integer)
    concurrency_high: Mapped[int | None] = mapped_column(Integer)
    body: Mapped[dict[str, Any]] = mapped_column(JSON)  # domain.Recommendation
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiTokenRow(Base):
    __tablename__ = "tuner_api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    team: Mapped[str] = mapped_column(String(100), server_default=DEFAULT_TEAM)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]


class WorkerRow(Base):
    __tablename__ = "tuner_workers"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    hardware: Mapped[str | None] = mapped_column(String(50))
    vllm_version: Mapped[str | None] = mapped_column(String(50))
    driver: Mapped[str | None] = mapped_column(String(100))
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
