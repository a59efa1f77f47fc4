"""trials: the GPU-seconds each trial held (wall time x the GPUs its server takes), a running trial's stage

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07 13:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tuner_trials", schema=None) as batch_op:
        batch_op.add_column(sa.Column("gpu_seconds", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("stage", sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column("stage_level", sa.String(length=100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tuner_trials", schema=None) as batch_op:
        batch_op.drop_column("stage_level")
        batch_op.drop_column("stage")
        batch_op.drop_column("gpu_seconds")
