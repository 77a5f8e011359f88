"""Models: the model a job asked for and what made its transcript (version, engine, decoding),
and the models an inference worker serves.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

A database made before revisions were kept gets every nullable column of the current models
before it is stamped with the baseline (models.migrations), these included: each is added
only where it is missing.
"""

from typing import Any, Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: Union[str, Sequence[str], None] = "0001"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def columns() -> dict[str, list[sa.Column[Any]]]:
    """Fresh Column objects each time: one is attached to the table it is added to."""
    return {
        "jobs": [
            sa.Column("model", sa.String(length=48), nullable=True),
            sa.Column("model_version", sa.String(length=80), nullable=True),
            sa.Column("decoding", sa.JSON(), nullable=True),
        ],
        "worker_heartbeats": [sa.Column("models", sa.String(length=255), nullable=True)],
    }


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    for table, columns_of in columns().items():
        present = {c["name"] for c in inspector.get_columns(table)}
        missing = [c for c in columns_of if c.name not in present]
        if missing:
            with op.batch_alter_table(table, schema=None) as batch_op:
                for column in missing:
                    batch_op.add_column(column)


def downgrade() -> None:
    for table, columns_of in columns().items():
        with op.batch_alter_table(table, schema=None) as batch_op:
            for column in reversed(columns_of):
                batch_op.drop_column(column.name)
