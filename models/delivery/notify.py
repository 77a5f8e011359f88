"""Completion webhooks through an outbox: one delivery per state change, whatever runs twice.

When a job with a `callback_url` reaches COMPLETED, FAILED, CANCELLED or EXPIRED, the
same transaction that changes its status adds a :class:`WebhookDelivery` row (a session
hook sees every status change, whichever code made it). Only after that transaction
commits is a `whisperq.notify` message published for the row; if publishing fails the
sweeper publishes it later. A job's task that runs twice cannot change the status twice,
so it cannot make a second row; a notify message delivered twice finds the row delivered,
or leased by the other delivery, and does nothing.

A batch (models.jobs.batches) with a `callback_url` gets one `batch.completed` delivery,
recorded by the transaction that finishes its last job: once a job's new status is flushed,
that transaction locks the batch's row, counts the batch's unfinished jobs, and where there
are none, sets the batch's `finished_at` with `UPDATE ... WHERE finished_at IS NULL`;
only the transaction whose update took the row records the delivery. Two workers finishing
the last two jobs at once queue on the batch's row lock (on SQLite on the database's write
lock, held from the job's update on), so the second counts with the first committed: one of
them sees none left, never both, never neither. For such a delivery `job_id` holds the
batch's id (the event says which it is).

Each attempt is recorded on the row (time, status code, error) and shown on the job.
Retries back off with full jitter while 5xx, 429, time-outs and connection errors last,
for up to WHISPERQ_WEBHOOK_RETRY_WINDOW; any other 4xx (and a redirect) stops them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import JSON, String, Text, event, func, insert, inspect, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from models.db import Base, rowcount
from models.jobs.batches import BATCH_EVENT, UNFINISHED, Batch
from models.jobs.record import EVENTS, Job, JobStatus, UTCDateTime, new_job_id, utcnow
from models.retry import RetryPolicy

if TYPE_CHECKING:
    from config import Settings
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
    publishes the new deliveries through its broker. Without one (a process with no
    Celery app), or if the publish fails, the sweeper sends them (``overdue``)."""
    if not event.contains(Session, "before_flush", _record_state_changes):
        event.listen(Session, "before_flush", _record_state_changes)
        event.listen(Session, "after_flush", _record_finished_batches)
        event.listen(Session, "after_commit", _publish_committed)
        event.listen(Session, "after_rollback", _forget_rolled_back)


def _record_state_changes(session: Session, _context: Any, _instances: Any) -> None:
    for obj in list(session.new) + list(session.dirty):
        if not isinstance(obj, Job) or not obj.callback_url or obj.deleted_at is not None:
            continue
        added = inspect(obj).attrs.status.history.added
        if not added or JobStatus(added[-1]) not in EVENTS:
            continue
        delivery = WebhookDelivery(
            id=new_job_id(),
            job_id=obj.id,
            event=EVENTS[JobStatus(added[-1])],
            url=obj.callback_url,
            status="pending",
            created_at=utcnow(),
            next_attempt_at=utcnow(),
            attempts=[],
        )
        session.add(delivery)
        session.info.setdefault("whisperq_deliveries", []).append(delivery.id)


def _record_finished_batches(session: Session, _context: Any) -> None:
    """After the flush that wrote a batch job's final status: finish its batch if that was
    the last one, and record the batch's delivery, exactly once (see the module's docstring)."""
    batches = set()
    for obj in list(session.new) + list(session.dirty):
        if isinstance(obj, Job) and obj.batch_id is not None:
            added = inspect(obj).attrs.status.history.added
            if added and JobStatus(added[-1]).finished:
                batches.add(obj.batch_id)
    if not batches:
        return
    conn = session.connection()
    for batch_id in sorted(batches):  # one order for every transaction: no deadlock between two
        url = conn.execute(
            select(Batch.callback_url).where(Batch.id == batch_id, Batch.finished_at.is_(None)).with_for_update()
        ).first()
        if url is None:  # no such batch, or finished already
            continue
        left = conn.execute(
            select(func.count()).select_from(Job).where(Job.batch_id == batch_id, Job.status.in_(UNFINISHED))
        ).scalar_one()
        if left:
            continue
        now = utcnow()
        taken = conn.execute(
            update(Batch).where(Batch.id == batch_id, Batch.finished_at.is_(None)).values(finished_at=now)
        ).rowcount
        if not taken or not url[0]:
            continue
        delivery_id = new_job_id()
        conn.execute(
            insert(WebhookDelivery).values(
                id=delivery_id,
                job_id=batch_id,
                event=BATCH_EVENT,
                url=url[0],
                status="pending",
                created_at=now,
                next_attempt_at=now,
                attempts=[],
            )
        )
        session.info.setdefault("whisperq_deliveries", []).append(delivery_id)
        log.info("batch %s: its last job finished; webhook %s recorded", batch_id, delivery_id)


def _publish_committed(session: Session) -> None:
    ids = session.info.pop("whisperq_deliveries", None)
    broker = getattr(session.info.get("runtime"), "broker", None)
    if ids and broker is not None:
        try:
            broker.publish_notify(ids)
        except Exception as exc:  # the sweeper publishes it later
            log.warning("could not publish webhook deliveries %s now (%s); the sweeper will", ids, exc)


def _forget_rolled_back(session: Session) -> None:
    session.info.pop("whisperq_deliveries", None)


# --- delivering ----------------------------------------------------------------------


def deliveries_of(rt: Runtime, job_id: str) -> list[dict[str, Any]]:
    with rt.db.session() as session:
        rows = session.scalars(
            select(WebhookDelivery).where(WebhookDelivery.job_id == job_id).order_by(WebhookDelivery.created_at)
        ).all()
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
        taken = rowcount(
            session.execute(
                update(WebhookDelivery)
                .where(
                    WebhookDelivery.id == delivery_id,
                    WebhookDelivery.status == "pending",
                    (WebhookDelivery.lease_until.is_(None)) | (WebhookDelivery.lease_until < now),
                    (WebhookDelivery.next_attempt_at.is_(None))
                    | (WebhookDelivery.next_attempt_at <= now + timedelta(seconds=1)),
                )
                .values(lease_until=lease)
            )
        )
    if not taken:
        return None  # delivered, given up, in flight elsewhere, or a duplicate message early
    with rt.db.session() as session:
        delivery = cast(WebhookDelivery, session.get(WebhookDelivery, delivery_id))  # its lease was just taken
        url, first, subject = delivery.url, delivery.created_at, delivery.job_id
        if delivery.event == BATCH_EVENT:
            found = _batch_payload(session, subject, transcript_url)
        else:
            found = _job_payload(session, subject, delivery.event, transcript_url, settings)
        if found is None:
            delivery.status, delivery.finished_at, delivery.lease_until = "dropped", now, None
            return None
    payload, owner = found
    attempt = webhooks.deliver(
        url, payload, msg_id=delivery_id, settings=settings, secrets=webhook_secrets_for(rt, owner)
    )
    record = {
        "at": _iso(attempt.at),
        "status_code": attempt.status_code,
        "error": attempt.error,
        "duration_ms": attempt.duration_ms,
    }
    delay = None
    with rt.db.session() as session:
        delivery = cast(WebhookDelivery, session.get(WebhookDelivery, delivery_id))  # held under our lease
        delivery.attempts = [*(delivery.attempts or []), record]
        delivery.lease_until = None
        done = utcnow()
        if attempt.delivered:
            delivery.status, delivery.finished_at = "delivered", done
        elif (
            attempt.retryable
            and (
                delay := RetryPolicy.for_webhooks(settings).next_delay(len(delivery.attempts), first_at=first, now=done)
            )
            is not None
        ):
            delivery.next_attempt_at = done + timedelta(seconds=delay)
        else:
            delivery.status, delivery.finished_at = "failed", done
    log.info(
        "%s %s: webhook %s attempt %d: %s",
        "batch" if delivery.event == BATCH_EVENT else "job",
        subject,
        delivery.event,
        len(delivery.attempts),
        "delivered" if attempt.delivered else attempt.error,
    )
    return delay


def _job_payload(
    session: Session, job_id: str, event_type: str, transcript_url: Callable[[str], str], settings: Settings
) -> tuple[dict[str, Any], str | None] | None:
    """A job event's body and the key that signs it; None once the job is deleted."""
    from models.delivery import webhooks

    job = session.get(Job, job_id)
    if job is None or job.deleted_at is not None:
        return None
    job_dict = job.to_dict()
    job_dict["owner"] = job.owner
    job_dict["status"] = {v: k for k, v in EVENTS.items()}[event_type].value  # the state it reports
    return webhooks.payload_for(job_dict, transcript_url(job_id), settings), job.owner


def _batch_payload(
    session: Session, batch_id: str, transcript_url: Callable[[str], str]
) -> tuple[dict[str, Any], str | None] | None:
    """`batch.completed`'s body (every job's id, status and transcript URL) and its key."""
    from models.delivery import webhooks

    batch = session.get(Batch, batch_id)
    if batch is None:
        return None
    jobs = session.execute(
        select(Job.id, Job.status, Job.deleted_at, Job.error).where(Job.batch_id == batch_id).order_by(Job.id)
    ).all()
    listed = [
        {
            "job_id": j.id,
            "status": j.status,
            "deleted": j.deleted_at is not None,
            "error": j.error,
            "transcript_url": transcript_url(j.id)
            if j.status == JobStatus.COMPLETED.value and j.deleted_at is None
            else None,
        }
        for j in jobs
    ]
    return webhooks.batch_payload_for(
        batch.id, batch.owner, _iso(batch.created_at), _iso(batch.finished_at), listed
    ), batch.owner


def overdue(rt: Runtime, now: datetime | None = None) -> list[str]:
    """Pending deliveries whose next attempt is late: their message was lost."""
    now = now or utcnow()
    with rt.db.session() as session:
        return list(
            session.scalars(
                select(WebhookDelivery.id).where(
                    WebhookDelivery.status == "pending",
                    WebhookDelivery.next_attempt_at < now - LATE,
                    (WebhookDelivery.lease_until.is_(None)) | (WebhookDelivery.lease_until < now),
                )
            ).all()
        )
