"""The inference claim (models.jobs.claims): each job's fencing token `claim_token` (0 for the
jobs already there: no run has claimed them), the holder, and when the holder's lease lapses.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: Union[str, Sequence[str], None] = "0007"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

COLUMNS = ("claim_token", "claim_holder", "claim_expires_at")


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    present = {c["name"] for c in inspector.get_columns("jobs")}
    if not set(COLUMNS) <= present:
        with op.batch_alter_table("jobs", schema=None) as batch_op:
            if "claim_token" not in present:
                batch_op.add_column(sa.Column("claim_token", sa.Integer(), nullable=False, server_default="0"))
            if "claim_holder" not in present:
                batch_op.add_column(sa.Column("claim_holder", sa.String(length=255), nullable=True))
            if "claim_expires_at" not in present:
                batch_op.add_column(sa.Column("claim_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        for column in reversed(COLUMNS):
            batch_op.drop_column(column)
