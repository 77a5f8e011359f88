"""The engine ledger (models.jobs.ledger): one row per pass of the engine over a job's windows,
written where the engine runs, with how it ended.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: Union[str, Sequence[str], None] = "0012"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    if "engine_passes" in sa.inspect(op.get_bind()).get_table_names():
        return
    op.create_table(
        "engine_passes",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("model", sa.String(length=64), nullable=True),
        sa.Column("windows", sa.Integer(), nullable=False),
        sa.Column("audio_seconds", sa.Float(), nullable=True),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("process", sa.String(length=255), nullable=False),
        sa.Column("claim_token", sa.Integer(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
    )
    op.create_index("ix_engine_passes_job_id", "engine_passes", ["job_id"])


def downgrade() -> None:
    op.drop_table("engine_passes")
