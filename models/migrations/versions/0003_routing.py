"""Routing and learning: a job's alias, shadow model, the job it re-runs, training-data opt-in
and correction; a key's training-data opt-in; shadow transcripts; hot-swapped weights.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Columns are added only where missing (a database made before revisions gets every nullable
column of the current models before it is stamped with the baseline: see models.migrations).
"""

from typing import Any, Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: Union[str, Sequence[str], None] = "0002"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def columns() -> dict[str, list[sa.Column[Any]]]:
    """Fresh Column objects each time: one is attached to the table it is added to."""
    return {
        "jobs": [
            sa.Column("route", sa.String(length=48), nullable=True),
            sa.Column("shadow", sa.String(length=48), nullable=True),
            sa.Column("rerun_of", sa.String(length=36), nullable=True),
            sa.Column("collect", sa.Boolean(), nullable=True),
            sa.Column("correction", sa.JSON(), nullable=True),
            sa.Column("corrected_at", sa.DateTime(timezone=True), nullable=True),
        ],
        "api_keys": [sa.Column("collect", sa.Boolean(), nullable=True)],
    }


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    for table, columns_of in columns().items():
        present = {c["name"] for c in inspector.get_columns(table)}
        missing = [c for c in columns_of if c.name not in present]
        if missing:
            with op.batch_alter_table(table, schema=None) as batch_op:
                for column in missing:
                    batch_op.add_column(column)
    if "ix_jobs_rerun_of" not in {i["name"] for i in inspector.get_indexes("jobs")}:
        op.create_index("ix_jobs_rerun_of", "jobs", ["rerun_of"], unique=False)
    tables = set(inspector.get_table_names())
    if "shadow_results" not in tables:
        op.create_table(
            "shadow_results",
            sa.Column("id", sa.String(length=36), nullable=False),
            sa.Column("job_id", sa.String(length=36), nullable=False),
            sa.Column("model", sa.String(length=48), nullable=False),
            sa.Column("model_version", sa.String(length=80), nullable=True),
            sa.Column("primary_model", sa.String(length=48), nullable=True),
            sa.Column("primary_version", sa.String(length=80), nullable=True),
            sa.Column("text", sa.Text(), nullable=True),
            sa.Column("wer", sa.Float(), nullable=True),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint("id"),
        )
        op.create_index("ix_shadow_results_job_id", "shadow_results", ["job_id"], unique=False)
        op.create_index("ix_shadow_results_created_at", "shadow_results", ["created_at"], unique=False)
    if "model_weights" not in tables:
        op.create_table(
            "model_weights",
            sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
            sa.Column("model", sa.String(length=48), nullable=False),
            sa.Column("weights", sa.Text(), nullable=False),
            sa.Column("version", sa.String(length=80), nullable=False),
            sa.Column("action", sa.String(length=16), nullable=False),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint("id"),
        )
        op.create_index("ix_model_weights_model", "model_weights", ["model"], unique=False)


def downgrade() -> None:
    op.drop_table("model_weights")
    op.drop_table("shadow_results")
    op.drop_index("ix_jobs_rerun_of", table_name="jobs")
    for table, columns_of in columns().items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in reversed(columns_of):
                batch_op.drop_column(column.name)
