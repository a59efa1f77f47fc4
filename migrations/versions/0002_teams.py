"""teams: tokens, jobs and traffic samples belong to a team; existing rows to the default team

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-04 21:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# tuner.auth.DEFAULT_TEAM, spelled out: a migration is frozen history and must not change when the code does
DEFAULT_TEAM = "default"
TABLES = ("tuner_api_tokens", "tuner_jobs", "tuner_traffic_samples")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("team", sa.String(length=100), nullable=False, server_default=DEFAULT_TEAM))
            if table != "tuner_api_tokens":
                batch_op.create_index(batch_op.f(f"ix_{table}_team"), ["team"], unique=False)
    # idempotency keys are kept per team, as "<team>/<key>"
    with op.batch_alter_table("tuner_jobs", schema=None) as batch_op:
        batch_op.alter_column(
            "idempotency_key", existing_type=sa.String(length=200), type_=sa.String(length=320), existing_nullable=True
        )
    op.execute(
        sa.text(
            "UPDATE tuner_jobs SET idempotency_key = :team || '/' || idempotency_key WHERE idempotency_key IS NOT NULL"
        ).bindparams(team=DEFAULT_TEAM)
    )


def downgrade() -> None:
    prefix = DEFAULT_TEAM + "/"
    op.execute(
        sa.text(
            "UPDATE tuner_jobs SET idempotency_key = substr(idempotency_key, :start) WHERE idempotency_key LIKE :prefix"
        ).bindparams(start=len(prefix) + 1, prefix=prefix + "%")
    )
    op.execute(sa.text("UPDATE tuner_jobs SET idempotency_key = NULL WHERE length(idempotency_key) > 200"))
    with op.batch_alter_table("tuner_jobs", schema=None) as batch_op:
        batch_op.alter_column(
            "idempotency_key", existing_type=sa.String(length=320), type_=sa.String(length=200), existing_nullable=True
        )
    for table in reversed(TABLES):
        with op.batch_alter_table(table, schema=None) as batch_op:
            if table != "tuner_api_tokens":
                batch_op.drop_index(batch_op.f(f"ix_{table}_team"))
            batch_op.drop_column("team")
