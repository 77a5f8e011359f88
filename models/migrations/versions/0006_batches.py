"""Batches (POST /v1/batches; models.jobs.batches): a `batches` table, and each job's
`batch_id` (nullable: most jobs are in none), indexed for a batch's counts and listing.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-08
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: Union[str, Sequence[str], None] = "0005"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if "batches" not in set(inspector.get_table_names()):
        op.create_table(
            "batches",
            sa.Column("id", sa.String(length=36), nullable=False),
            sa.Column("owner", sa.String(length=36), nullable=True),
            sa.Column("callback_url", sa.Text(), nullable=True),
            sa.Column("total", sa.Integer(), nullable=False),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
            sa.PrimaryKeyConstraint("id"),
        )
        op.create_index("ix_batches_owner", "batches", ["owner"], unique=False)
        op.create_index("ix_batches_created_at", "batches", ["created_at"], unique=False)
    if "batch_id" not in {c["name"] for c in inspector.get_columns("jobs")}:
        with op.batch_alter_table("jobs", schema=None) as batch_op:
            batch_op.add_column(sa.Column("batch_id", sa.String(length=36), nullable=True))
    if "ix_jobs_batch_id" not in {i["name"] for i in inspector.get_indexes("jobs")}:
        op.create_index("ix_jobs_batch_id", "jobs", ["batch_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_batch_id", table_name="jobs")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("batch_id")
    op.drop_index("ix_batches_created_at", table_name="batches")
    op.drop_index("ix_batches_owner", table_name="batches")
    op.drop_table("batches")
