"""Baseline: the tables as create_all made them before the schema had revisions.

A database made then has these tables and no alembic_version; it is stamped at this
revision after the nullable columns it lacks are added (models.migrations.upgrade).

Revision ID: 0001
Revises:
Create Date: 2026-12-01
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op


# revision identifiers, used by Alembic.
revision: str = "0001"
down_revision: Union[str, Sequence[str], None] = None
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("tier", sa.String(length=16), nullable=False),
        sa.Column("admin", sa.Boolean(), nullable=False),
        sa.Column("shown", sa.String(length=16), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("webhook_secret", sa.Text(), nullable=True),
        sa.Column("previous_webhook_secret", sa.Text(), nullable=True),
        sa.Column("previous_webhook_secret_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("webhook_secret_rotated_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_api_keys_digest", "api_keys", ["digest"], unique=True)

    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.String(length=255), nullable=False),
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_index("ix_idempotency_keys_created_at", "idempotency_keys", ["created_at"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("task", sa.String(length=16), nullable=False),
        sa.Column("language", sa.String(length=8), nullable=True),
        sa.Column("priority", sa.String(length=8), nullable=False),
        sa.Column("audio_ref", sa.Text(), nullable=False),
        sa.Column("audio_owned", sa.Boolean(), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=True),
        sa.Column("audio_duration", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result_text", sa.Text(), nullable=True),
        sa.Column("result_language", sa.String(length=8), nullable=True),
        sa.Column("result_segments", sa.JSON(), nullable=True),
        sa.Column("processing_seconds", sa.Float(), nullable=True),
        sa.Column("stage", sa.String(length=16), nullable=True),
        sa.Column("worker_id", sa.String(length=64), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("held_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("callback_url", sa.Text(), nullable=True),
        sa.Column("audio_url", sa.Text(), nullable=True),
        sa.Column("word_timestamps", sa.Boolean(), nullable=True),
        sa.Column("prompt", sa.Text(), nullable=True),
        sa.Column("temperature", sa.Float(), nullable=True),
        sa.Column("progress_seconds", sa.Float(), nullable=True),
        sa.Column("infer_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=True),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("audio_purged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result_purged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("owner", sa.String(length=36), nullable=True),
        sa.Column("audio_format", sa.String(length=16), nullable=True),
        sa.Column("engine_runs", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"], unique=False)
    op.create_index("ix_jobs_owner", "jobs", ["owner"], unique=False)
    op.create_index("ix_jobs_status", "jobs", ["status"], unique=False)
    op.create_index("ix_jobs_worker_id", "jobs", ["worker_id"], unique=False)

    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_deliveries_job_id", "webhook_deliveries", ["job_id"], unique=False)
    op.create_index("ix_webhook_deliveries_status", "webhook_deliveries", ["status"], unique=False)

    op.create_table(
        "worker_heartbeats",
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pool", sa.String(length=32), nullable=False),
        sa.Column("slots", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("worker_id"),
    )
    op.create_index("ix_worker_heartbeats_last_seen_at", "worker_heartbeats", ["last_seen_at"], unique=False)
    op.create_index("ix_worker_heartbeats_pool", "worker_heartbeats", ["pool"], unique=False)

    op.create_table(
        "dead_letters",
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("task", sa.String(length=64), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("replays", sa.Integer(), nullable=False),
        sa.Column("message", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_index("ix_dead_letters_failed_at", "dead_letters", ["failed_at"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_dead_letters_failed_at", table_name="dead_letters")

    op.drop_table("dead_letters")
    op.drop_index("ix_worker_heartbeats_pool", table_name="worker_heartbeats")
    op.drop_index("ix_worker_heartbeats_last_seen_at", table_name="worker_heartbeats")

    op.drop_table("worker_heartbeats")
    op.drop_index("ix_webhook_deliveries_status", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_job_id", table_name="webhook_deliveries")

    op.drop_table("webhook_deliveries")
    op.drop_index("ix_jobs_worker_id", table_name="jobs")
    op.drop_index("ix_jobs_status", table_name="jobs")
    op.drop_index("ix_jobs_owner", table_name="jobs")
    op.drop_index("ix_jobs_created_at", table_name="jobs")

    op.drop_table("jobs")
    op.drop_index("ix_idempotency_keys_created_at", table_name="idempotency_keys")

    op.drop_table("idempotency_keys")
    op.drop_index("ix_api_keys_digest", table_name="api_keys")

    op.drop_table("api_keys")
