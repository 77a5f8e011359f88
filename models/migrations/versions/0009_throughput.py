"""What each inference worker's pool reaches (models.jobs.throughput), in its heartbeat: the
estimates read the speed of batches run side by side, not of jobs run one by one.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: Union[str, Sequence[str], None] = "0008"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if "throughput" not in {c["name"] for c in inspector.get_columns("worker_heartbeats")}:
        with op.batch_alter_table("worker_heartbeats", schema=None) as batch_op:
            batch_op.add_column(sa.Column("throughput", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("worker_heartbeats", schema=None) as batch_op:
        batch_op.drop_column("throughput")
