"""The sweeper (run by Celery beat): put back jobs whose worker vanished, expire jobs
that waited past their time-to-live, and forget old idempotency keys.

A message whose worker was killed is redelivered by the broker in the end (RabbitMQ at
once, Redis after `visibility_timeout`, hours later). The sweeper does not wait for
that: a job PROCESSING on a worker that no longer answers, or past its hard time limit,
is published again; its next start counts as a new attempt, and a job that keeps
killing its workers ends in the dead-letter store. A late redelivery of the old message
finds the job done and does nothing.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable

from sqlalchemy import func, select

from .deadletter import bury
from .idempotency import forget_old
from .job import Job, JobStatus, utcnow
from .runtime import Runtime

log = logging.getLogger(__name__)

# A worker that claimed a job moments ago may not have answered the liveness probe yet.
GRACE = timedelta(seconds=60)
# A retry still waiting this long after its due time lost its delayed message.
LOST_RETRY = timedelta(hours=1)


@dataclass
class SweepReport:
    requeued: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    retried_lost: list[str] = field(default_factory=list)
    keys_forgotten: int = 0


def sweep(rt: Runtime, holdings: dict[str, set[str]], publish: Callable[[Job], None],
          grace: timedelta = GRACE) -> SweepReport:
    """One pass. `holdings` maps each worker process that answered now to the job ids it
    holds; `publish(job)` sends a job's transcribe message again.

    A job whose recorded worker did not answer, or answered without holding it (its
    message was lost when the broker went away), is put back after `grace`."""
    report = SweepReport()
    now = utcnow()
    ttl = timedelta(seconds=rt.settings.job_ttl_seconds)
    with rt.db.session() as session:
        waiting = func.coalesce(Job.queued_at, Job.created_at)
        for job in session.scalars(select(Job).where(Job.status == JobStatus.PENDING.value, Job.attempts == 0, waiting < now - ttl)):
            job.expire()
            report.expired.append(job.id)
    with rt.db.session() as session:
        rows = session.scalars(
            select(Job).where(Job.status.in_([JobStatus.PENDING.value, JobStatus.PROCESSING.value]))
            .where((Job.status == JobStatus.PROCESSING.value) | Job.worker_id.is_not(None))
        ).all()
        stuck = []
        for job in rows:
            since = max(t for t in (job.started_at, job.held_at, job.created_at) if t is not None)
            over_limit = job.state is JobStatus.PROCESSING and (job.started_at or since) + timedelta(
                seconds=rt.settings.time_limit(job.audio_duration)) < now
            gone = job.worker_id is not None and job.worker_id not in holdings
            dropped = job.worker_id in holdings and job.id not in holdings[job.worker_id]
            if over_limit:
                stuck.append((job.id, "past its time limit"))
            elif (gone or dropped) and since < now - grace:
                stuck.append((job.id, f"its worker {job.worker_id} is gone" if gone else "its worker no longer holds it"))
    for job_id, why in stuck:
        with rt.db.session() as session:
            job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
            if job.state.finished:
                continue
            exhausted = job.state is JobStatus.PROCESSING and job.attempts >= rt.settings.max_attempts
            if not exhausted:
                if job.state is JobStatus.PROCESSING:
                    job.retry_later(f"attempt {job.attempts} did not finish: {why}", now)
                job.worker_id = None
                session.flush()
                session.expunge(job)
        if exhausted:
            bury(rt, job_id, "whisperq.transcribe", f"attempt {job.attempts} did not finish: {why}", None)
            report.dead.append(job_id)
        else:
            publish(job)
            report.requeued.append(job_id)
            log.warning("job %s put back on the queue: %s", job_id, why)
    # A retry whose delayed message was lost with its worker: publish it again.
    with rt.db.session() as session:
        lost = session.scalars(
            select(Job).where(Job.status == JobStatus.PENDING.value, Job.next_attempt_at.is_not(None),
                              Job.next_attempt_at < now - LOST_RETRY)
        ).all()
        for job in lost:
            job.next_attempt_at = now
            session.expunge(job)
    for job in lost:
        publish(job)
        report.retried_lost.append(job.id)
    report.keys_forgotten = forget_old(rt)
    return report
