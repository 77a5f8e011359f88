"""Several hosts: stored files in PostgreSQL large objects (models.storage.postgres), and the
host each worker runs on with that host's free disk and memory in its heartbeat.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from typing import Any, Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: Union[str, Sequence[str], None] = "0003"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("host", sa.String(length=255), nullable=True),
        sa.Column("disk_free_bytes", sa.BigInteger(), nullable=True),
        sa.Column("disk_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_available_bytes", sa.BigInteger(), nullable=True),
        sa.Column("memory_total_bytes", sa.BigInteger(), nullable=True),
    ]


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    present = {c["name"] for c in inspector.get_columns("worker_heartbeats")}
    missing = [c for c in columns() if c.name not in present]
    if missing:
        with op.batch_alter_table("worker_heartbeats", schema=None) as batch_op:
            for column in missing:
                batch_op.add_column(column)
    if "stored_objects" not in set(inspector.get_table_names()):
        op.create_table(
            "stored_objects",
            sa.Column("ref", sa.String(length=255), nullable=False),
            sa.Column("oid", sa.BigInteger(), nullable=False),
            sa.Column("size", sa.BigInteger(), nullable=False),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
            sa.PrimaryKeyConstraint("ref"),
        )


def downgrade() -> None:
    op.drop_table("stored_objects")
    with op.batch_alter_table("worker_heartbeats", schema=None) as batch_op:
        for column in reversed(columns()):
            batch_op.drop_column(column.name)
