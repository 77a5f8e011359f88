"""A key's S3 sources: the BUCKET/PREFIX entries its audio_url=s3://… may name
(models.access.s3_sources).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: Union[str, Sequence[str], None] = "0009"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    if "s3_sources" not in {c["name"] for c in inspector.get_columns("api_keys")}:
        with op.batch_alter_table("api_keys", schema=None) as batch_op:
            batch_op.add_column(sa.Column("s3_sources", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_column("s3_sources")
