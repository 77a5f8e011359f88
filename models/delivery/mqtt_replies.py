"""What the MQTT bridge (web/mqtt) still owes its clients: one row per accepted request, from
the moment its job exists (the request is acknowledged to the broker only after this row is
written) until the broker has acknowledged the final reply. So a restart of the bridge or of
the MQTT broker loses no reply: a status the broker never acknowledged is published again.

A row's id is the request's own (its client and correlation id), so a request delivered
twice is owed once. `last_status` is the last status the broker acknowledged a message for.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import String, delete, or_, select, update
from sqlalchemy.orm import Mapped, mapped_column

from models.db import Base, UTCDateTime, utcnow
from models.jobs.record import Job

if TYPE_CHECKING:
    from models.runtime import Runtime

MAX_TOPIC = 1024
MAX_CORRELATION = 200


class MqttReply(Base):
    __tablename__ = "mqtt_replies"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # request_id(client, correlation id)
    job_id: Mapped[str] = mapped_column(String(36), index=True)
    client: Mapped[str] = mapped_column(String(64))
    reply_topic: Mapped[str] = mapped_column(String(MAX_TOPIC))
    correlation_id: Mapped[str] = mapped_column(String(MAX_CORRELATION))
    last_status: Mapped[str | None] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


@dataclass(frozen=True)
class PendingReply:
    """A reply still to send: the request's row and its job's status now (None: the job is gone)."""

    id: str
    job_id: str
    client: str
    reply_topic: str
    correlation_id: str
    last_status: str | None
    status: str | None


def request_id(client: str, correlation_id: str) -> str:
    """A request's identity: its client and its correlation id (two clients never meet)."""
    return hashlib.sha256(f"{client}\0{correlation_id}".encode()).hexdigest()


def record_request(rt: Runtime, client: str, correlation_id: str, job_id: str, reply_topic: str) -> str:
    """Record an accepted request: its replies are pending (to be published) from now on. A
    request seen again (the broker delivered it twice, or the client sent it again) is pending
    again, on the topic it names now: what is still to come, or, where its result was delivered
    already, the result again."""
    key = request_id(client, correlation_id)
    with rt.db.session(write=True) as session:
        row = session.get(MqttReply, key, with_for_update=True)
        if row is None:
            session.add(
                MqttReply(
                    id=key,
                    job_id=job_id,
                    client=client,
                    reply_topic=reply_topic,
                    correlation_id=correlation_id,
                    last_status=None,
                )
            )
        else:
            row.job_id, row.reply_topic, row.last_status, row.updated_at = job_id, reply_topic, None, utcnow()
    return key


def pending_replies(rt: Runtime) -> list[PendingReply]:
    """Every reply whose job has moved on since the broker last acknowledged one (or is gone)."""
    query = (
        select(MqttReply, Job.status, Job.deleted_at)
        .outerjoin(Job, Job.id == MqttReply.job_id)
        .where(
            or_(
                MqttReply.last_status.is_(None),
                Job.status.is_(None),
                Job.deleted_at.is_not(None),
                Job.status != MqttReply.last_status,
            )
        )
        .order_by(MqttReply.created_at)
    )
    with rt.db.session() as session:
        return [
            PendingReply(
                r.id,
                r.job_id,
                r.client,
                r.reply_topic,
                r.correlation_id,
                r.last_status,
                None if deleted is not None else status,
            )
            for r, status, deleted in session.execute(query).all()
        ]


def mark_acknowledged(rt: Runtime, reply: PendingReply, status: str, final: bool) -> None:
    """The broker acknowledged the reply for `status`: the final one ends what is pending. A row
    pending again since to another job or topic (the request came again) is left to be told."""
    same = (MqttReply.id == reply.id, MqttReply.job_id == reply.job_id, MqttReply.reply_topic == reply.reply_topic)
    with rt.db.session() as session:
        if final:
            session.execute(delete(MqttReply).where(*same))
        else:
            session.execute(update(MqttReply).where(*same).values(last_status=status, updated_at=utcnow()))
