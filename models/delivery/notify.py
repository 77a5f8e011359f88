"""Completion webhooks through an outbox: one delivery per state change, whatever runs twice.

When a job with a `callback_url` reaches COMPLETED, FAILED, CANCELLED or EXPIRED, the
same transaction that changes its status adds a :class:`WebhookDelivery` row (a session
hook sees every status change, whichever code made it). Only after that transaction
commits is a `whisperq.notify` message published for the row; if publishing fails the
sweeper publishes it later. A job's task that runs twice cannot change the status twice,
so it cannot make a second row; a notify message delivered twice finds the row delivered,
or leased by the other delivery, and does nothing.

Each attempt is recorded on the row (time, status code, error) and shown on the job.
Retries back off with full jitter while 5xx, 429, time-outs and connection errors last,
for up to WHISPERQ_WEBHOOK_RETRY_WINDOW; any other 4xx (and a redirect) stops them.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Callable

from sqlalchemy import JSON, String, Text, event, inspect, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from models.db import Base
from models.jobs.record import EVENTS, Job, JobStatus, UTCDateTime, new_job_id, utcnow
from models.retry import RetryPolicy

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)

# A notify message that was lost (a worker died holding its countdown) is published again
# by the sweeper once its attempt is this late.
LATE = timedelta(minutes=2)


class WebhookDelivery(Base):
    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_job_id)  # the webhook-id
    job_id: Mapped[str] = mapped_column(String(36), index=True)
    event: Mapped[str] = mapped_column(String(32))
    url: Mapped[str] = mapped_column(Text)
    # pending -> delivered | failed (gave up) | dropped (the job was deleted)
    status: Mapped[str] = mapped_column(String(16), default="pending", index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event": self.event,
            "status": self.status,
            "next_attempt_at": _iso(self.next_attempt_at) if self.status == "pending" else None,
            "attempts": list(self.attempts or []),
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


# --- the outbox hook ----------------------------------------------------------------

def install_outbox() -> None:
    """Register the outbox's session hooks, once per process (models.runtime.Runtime does).

    Every session records a delivery for a job with a callback_url that reaches a final
    state, in the same transaction; after the commit, the session's runtime (``info``)
    publishes the new deliveries through its publisher. Without one (a process with no
    Celery app), or if the publish fails, the sweeper sends them (``overdue``)."""
    if not event.contains(Session, "before_flush", _record_state_changes):
        event.listen(Session, "before_flush", _record_state_changes)
        event.listen(Session, "after_commit", _publish_committed)
        event.listen(Session, "after_rollback", _forget_rolled_back)


def _record_state_changes(session: Session, _context, _instances) -> None:
    for obj in list(session.new) + list(session.dirty):
        if not isinstance(obj, Job) or not obj.callback_url or obj.deleted_at is not None:
            continue
        added = inspect(obj).attrs.status.history.added
        if not added or JobStatus(added[-1]) not in EVENTS:
            continue
        delivery = WebhookDelivery(id=new_job_id(), job_id=obj.id, event=EVENTS[JobStatus(added[-1])],
                                   url=obj.callback_url, status="pending", created_at=utcnow(),
                                   next_attempt_at=utcnow(), attempts=[])
        session.add(delivery)
        session.info.setdefault("whisperq_deliveries", []).append(delivery.id)


def _publish_committed(session: Session) -> None:
    ids = session.info.pop("whisperq_deliveries", None)
    publish = getattr(session.info.get("runtime"), "publisher", None)
    if ids and publish is not None:
        try:
            publish(ids)
        except Exception as exc:  # the sweeper publishes it later
            log.warning("could not publish webhook deliveries %s now (%s); the sweeper will", ids, exc)


def _forget_rolled_back(session: Session) -> None:
    session.info.pop("whisperq_deliveries", None)


# --- delivering ----------------------------------------------------------------------

def deliveries_of(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    with rt.db.session() as session:
        rows = session.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)
                               .order_by(WebhookDelivery.created_at)).all()
        return [row.to_dict() for row in rows]


def deliver_pending(rt: Runtime, delivery_id: str, transcript_url: Callable[[str], str]) -> float | None:
    """Make the delivery's next attempt if it is due and nobody else is making it.
    Returns the delay before the next attempt, or None when there is nothing more to do."""
    from models.access.apikeys import webhook_secrets_for
    from models.delivery import webhooks

    settings = rt.settings
    now = utcnow()
    lease = now + timedelta(seconds=settings.webhook_timeout_seconds + 30)
    with rt.db.session() as session:
        taken = session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id, WebhookDelivery.status == "pending",
                   (WebhookDelivery.lease_until.is_(None)) | (WebhookDelivery.lease_until < now),
                   (WebhookDelivery.next_attempt_at.is_(None)) | (WebhookDelivery.next_attempt_at <= now + timedelta(seconds=1)))
            .values(lease_until=lease)
        ).rowcount
    if not taken:
        return None  # delivered, given up, in flight elsewhere, or a duplicate message early
    with rt.db.session() as session:
        delivery = session.get(WebhookDelivery, delivery_id)
        job = session.get(Job, delivery.job_id)
        if job is None or job.deleted_at is not None:
            delivery.status, delivery.finished_at, delivery.lease_until = "dropped", now, None
            return None
        job_dict = job.to_dict()
        job_dict["owner"] = job.owner
        url, first = delivery.url, delivery.created_at
    job_dict["status"] = {v: k for k, v in EVENTS.items()}[delivery.event].value  # the state it reports
    payload = webhooks.payload_for(job_dict, transcript_url(job_dict["job_id"]), settings)
    attempt = webhooks.deliver(url, payload, msg_id=delivery_id, settings=settings,
                               secrets=webhook_secrets_for(rt, job_dict["owner"]))
    record = {"at": _iso(attempt.at), "status_code": attempt.status_code, "error": attempt.error,
              "duration_ms": attempt.duration_ms}
    delay = None
    with rt.db.session() as session:
        delivery = session.get(WebhookDelivery, delivery_id)
        delivery.attempts = list(delivery.attempts or []) + [record]
        delivery.lease_until = None
        done = utcnow()
        if attempt.delivered:
            delivery.status, delivery.finished_at = "delivered", done
        elif attempt.retryable and (delay := RetryPolicy.for_webhooks(settings).next_delay(
                len(delivery.attempts), first_at=first, now=done)) is not None:
            delivery.next_attempt_at = done + timedelta(seconds=delay)
        else:
            delivery.status, delivery.finished_at = "failed", done
    log.info("job %s: webhook %s attempt %d: %s", job_dict["job_id"], delivery.event, len(delivery.attempts),
             "delivered" if attempt.delivered else attempt.error)
    return delay


def overdue(rt: Runtime, now: datetime | None = None) -> list[str]:
    """Pending deliveries whose next attempt is late: their message was lost."""
    now = now or utcnow()
    with rt.db.session() as session:
        return list(session.scalars(
            select(WebhookDelivery.id).where(
                WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at < now - LATE,
                (WebhookDelivery.lease_until.is_(None)) | (WebhookDelivery.lease_until < now))
        ).all())
