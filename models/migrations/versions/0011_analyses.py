"""Analyses after the transcript (models.analysis): the analyses a job asked for and each one's
run (job_analyses); how sure the model was (jobs.confidence, jobs.language_probability); words
to listen for per job and per key (jobs.hotwords, api_keys.hotwords).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: Union[str, Sequence[str], None] = "0010"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

JOB_COLUMNS = (
    ("confidence", sa.Float()),
    ("language_probability", sa.Float()),
    ("hotwords", sa.Text()),
    ("analyses", sa.JSON()),
    ("result_extra", sa.JSON()),
)


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    have = {c["name"] for c in inspector.get_columns("jobs")}
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for name, kind in JOB_COLUMNS:
            if name not in have:
                batch_op.add_column(sa.Column(name, kind, nullable=True))
    if "ix_jobs_confidence" not in {i["name"] for i in inspector.get_indexes("jobs")}:
        op.create_index("ix_jobs_confidence", "jobs", ["confidence"])
    if "hotwords" not in {c["name"] for c in inspector.get_columns("api_keys")}:
        with op.batch_alter_table("api_keys", schema=None) as batch_op:
            batch_op.add_column(sa.Column("hotwords", sa.Text(), nullable=True))
    if "job_analyses" not in inspector.get_table_names():
        op.create_table(
            "job_analyses",
            sa.Column("job_id", sa.String(length=36), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
            sa.Column("name", sa.String(length=32), primary_key=True),
            sa.Column("params", sa.JSON(), nullable=True),
            sa.Column("status", sa.String(length=16), nullable=False),
            sa.Column("version", sa.String(length=32), nullable=True),
            sa.Column("output", sa.JSON(), nullable=True),
            sa.Column("error", sa.Text(), nullable=True),
            sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
            sa.Column("runs", sa.Integer(), nullable=False, server_default="0"),
            sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
            sa.Column("seconds", sa.Float(), nullable=True),
        )
        op.create_index("ix_job_analyses_status", "job_analyses", ["status"])


def downgrade() -> None:
    op.drop_table("job_analyses")
    op.drop_index("ix_jobs_confidence", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for name, _ in JOB_COLUMNS:
            batch_op.drop_column(name)
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("hotwords")
