"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02 17:35:17.603121
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuner_api_tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_table(
        "tuner_traffic_samples",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("content", sa.JSON(), nullable=True),
        sa.Column("content_deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("workload_class", sa.String(length=100), nullable=False),
        sa.Column("request_count", sa.Integer(), nullable=False),
        sa.Column("stats", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("tuner_traffic_samples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tuner_traffic_samples_fingerprint"), ["fingerprint"], unique=False)
        batch_op.create_index(batch_op.f("ix_tuner_traffic_samples_workload_class"), ["workload_class"], unique=False)

    op.create_table(
        "tuner_workers",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("hardware", sa.String(length=50), nullable=True),
        sa.Column("vllm_version", sa.String(length=50), nullable=True),
        sa.Column("driver", sa.String(length=100), nullable=True),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "tuner_jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=False),
        sa.Column("revision", sa.String(length=200), nullable=True),
        sa.Column("hardware", sa.String(length=50), nullable=False),
        sa.Column("engine", sa.String(length=20), nullable=False),
        sa.Column("traffic_id", sa.String(length=32), nullable=False),
        sa.Column("objective", sa.String(length=20), nullable=False),
        sa.Column("slo", sa.JSON(), nullable=False),
        sa.Column("levels", sa.JSON(), nullable=False),
        sa.Column("budget", sa.JSON(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("progress", sa.JSON(), nullable=True),
        sa.Column("best", sa.JSON(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("claimed_by", sa.String(length=200), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["traffic_id"],
            ["tuner_traffic_samples.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key"),
    )
    with op.batch_alter_table("tuner_jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tuner_jobs_model"), ["model"], unique=False)
        batch_op.create_index(batch_op.f("ix_tuner_jobs_status"), ["status"], unique=False)

    op.create_table(
        "tuner_recommendations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("scope", sa.String(length=40), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=False),
        sa.Column("revision", sa.String(length=200), nullable=True),
        sa.Column("hardware", sa.String(length=50), nullable=False),
        sa.Column("vllm_version", sa.String(length=50), nullable=True),
        sa.Column("driver", sa.String(length=100), nullable=True),
        sa.Column("engine", sa.String(length=20), nullable=False),
        sa.Column("serving_key", sa.String(length=64), nullable=False),
        sa.Column("workload_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("workload_class", sa.String(length=100), nullable=False),
        sa.Column("traffic_id", sa.String(length=32), nullable=False),
        sa.Column("concurrency_low", sa.Integer(), nullable=False),
        sa.Column("concurrency_high", sa.Integer(), nullable=True),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["tuner_jobs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "scope", name="uq_tuner_recommendations_job_scope"),
    )
    with op.batch_alter_table("tuner_recommendations", schema=None) as batch_op:
        batch_op.create_index("ix_tuner_recommendations_key", ["model", "hardware", "engine"], unique=False)

    op.create_table(
        "tuner_trials",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("purpose", sa.String(length=20), nullable=False),
        sa.Column("method", sa.String(length=30), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("levels", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("engine", sa.String(length=20), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("failure_class", sa.String(length=30), nullable=True),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("log_path", sa.String(length=1000), nullable=True),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("pgid", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["tuner_jobs.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "number", name="uq_tuner_trials_job_number"),
    )
    with op.batch_alter_table("tuner_trials", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tuner_trials_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_tuner_trials_status"), ["status"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tuner_trials_status"))
        batch_op.drop_index(batch_op.f("ix_tuner_trials_job_id"))

    op.drop_table("tuner_trials")
    with op.batch_alter_table("tuner_recommendations", schema=None) as batch_op:
        batch_op.drop_index("ix_tuner_recommendations_key")

    op.drop_table("tuner_recommendations")
    with op.batch_alter_table("tuner_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tuner_jobs_status"))
        batch_op.drop_index(batch_op.f("ix_tuner_jobs_model"))

    op.drop_table("tuner_jobs")
    op.drop_table("tuner_workers")
    with op.batch_alter_table("tuner_traffic_samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tuner_traffic_samples_workload_class"))
        batch_op.drop_index(batch_op.f("ix_tuner_traffic_samples_fingerprint"))

    op.drop_table("tuner_traffic_samples")
    op.drop_table("tuner_api_tokens")
