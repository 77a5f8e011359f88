"""The MQTT bridge: the replies it still owes its clients (models.delivery.mqtt_replies), kept
in the database so that a restart of the bridge or of the MQTT broker loses none.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: Union[str, Sequence[str], None] = "0004"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    if "mqtt_replies" in set(sa.inspect(op.get_bind()).get_table_names()):
        return
    op.create_table(
        "mqtt_replies",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("client", sa.String(length=64), nullable=False),
        sa.Column("reply_topic", sa.String(length=1024), nullable=False),
        sa.Column("correlation_id", sa.String(length=200), nullable=False),
        sa.Column("last_status", sa.String(length=16), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_mqtt_replies_job_id", "mqtt_replies", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_mqtt_replies_job_id", table_name="mqtt_replies")
    op.drop_table("mqtt_replies")
