"""Each job's `origin`: the way in it came through (models.pipeline.door). Only a
transcribe.delay() job's transcript may go to the result backend; rows made before this
column have none, and keep theirs in the row only, except those the preparation pool made
from a transcribe.delay() message (no audio of their own, no URL), marked `delay` here.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: Union[str, Sequence[str], None] = "0006"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if "origin" not in {c["name"] for c in inspector.get_columns("jobs")}:
        with op.batch_alter_table("jobs", schema=None) as batch_op:
            batch_op.add_column(sa.Column("origin", sa.String(length=16), nullable=True))
        jobs = sa.table(
            "jobs",
            sa.column("origin", sa.String),
            sa.column("audio_owned", sa.Boolean),
            sa.column("audio_url", sa.Text),
        )
        op.execute(
            jobs.update()
            .where(sa.and_(jobs.c.audio_owned.is_(False), jobs.c.audio_url.is_(None)))
            .values(origin="delay")
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("origin")
