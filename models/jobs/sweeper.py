"""The sweeper (run by Celery beat): put back jobs whose message was lost or whose worker
vanished, expire jobs that waited past their time-to-live, and forget old idempotency keys.

RabbitMQ hands a message back to its queue as soon as its consumer's connection closes
(a killed worker, a broker restart), so there the broker redelivers and the sweeper only
puts back jobs past their hard time limit. Redis cannot: a message reserved by a worker
sits in its ``unacked`` hash until `visibility_timeout` (hours), and one popped as the
broker went down is gone. So on Redis the sweeper looks at the queues themselves: a job
whose message waits in no queue and is held by no live worker, on two looks a moment
apart, is published again. If a worker had started it (preparing or transcribing), that
run was cut short and counts as an attempt, so a job that keeps killing its workers ends
in the dead-letter store; a message lost while it waited costs nothing. A late
redelivery of an old message finds the job done and does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, cast

from sqlalchemy import func, or_, select

from models.jobs.analyses import stale_analyses, touch
from models.jobs.deadletter import move_to_dead_letters
from models.jobs.idempotency import forget_old
from models.jobs.record import Job, JobStatus, Stage, utcnow

if TYPE_CHECKING:
    from models.runtime import Broker, Runtime

log = logging.getLogger(__name__)

# A retry still waiting this long after its due time lost its delayed message.
LOST_RETRY = timedelta(hours=1)
LOST = "its message was lost by the broker"


@dataclass
class SweepReport:
    requeued: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    retried_lost: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    keys_forgotten: int = 0
    notifications_resent: int = 0
    analyses_resent: list[str] = field(default_factory=list)


def sweep(
    rt: Runtime,
    holdings: dict[str, set[str]],
    broker: Broker | None = None,
    grace: timedelta | None = None,
    waiting: set[str] | None = None,
    confirm: Callable[[set[str]], set[str]] | None = None,
) -> SweepReport:
    """One pass. `holdings` maps each worker process that answered now to the job ids it
    holds; `broker` (the runtime's by default) sends a job's transcribe message again; `waiting` is the ids
    whose messages wait in the broker's queues, read before `holdings`, or None where the
    broker cannot list them (RabbitMQ, which redelivers by itself); `confirm(ids)` takes a
    second look and returns those still neither waiting nor held; `grace` (WHISPERQ_SWEEP_GRACE
    unless given) is how long a job's message may be neither before it is sent again."""
    report = SweepReport()
    now = utcnow()
    # A worker that took a job moments ago may not have answered the liveness probe yet.
    grace = timedelta(seconds=rt.settings.sweep_grace_seconds) if grace is None else grace
    publish = cast("Broker", broker or rt.broker).publish_job
    ttl = timedelta(seconds=rt.settings.job_ttl_seconds)
    with rt.db.session() as session:
        queued_since = func.coalesce(Job.queued_at, Job.created_at)
        for job in session.scalars(
            select(Job).where(Job.status == JobStatus.PENDING.value, Job.attempts == 0, queued_since < now - ttl)
        ):
            job.expire()
            report.expired.append(job.id)
    with rt.db.session() as session:
        rows = session.scalars(
            select(Job).where(
                Job.status.in_([JobStatus.PENDING.value, JobStatus.PROCESSING.value]),
                # a job whose transcript is stored waits for its analyses: swept below
                or_(Job.stage.is_(None), Job.stage != Stage.ANALYSIS.value),
            )
        ).all()
        held = set().union(*holdings.values())
        stuck: list[tuple[str, str]] = []
        for job in rows:
            since = max(
                t
                for t in (job.started_at, job.held_at, job.created_at, job.queued_at, job.next_attempt_at)
                if t is not None
            )
            over_limit = (
                job.state is JobStatus.PROCESSING
                and (job.started_at or since) + timedelta(seconds=rt.settings.time_limit(job.audio_duration)) < now
            )
            if over_limit:
                stuck.append((job.id, "past its time limit"))
            elif waiting is not None and job.id not in waiting and job.id not in held and since < now - grace:
                if job.state is JobStatus.PROCESSING and job.stage in (Stage.PREPARE, Stage.INFER):
                    gone = job.worker_id not in holdings
                    why = f"its worker {job.worker_id} is gone" if gone else "its worker no longer holds it"
                    stuck.append((job.id, why))
                else:
                    stuck.append((job.id, LOST))
    unseen = {job_id for job_id, why in stuck if why != "past its time limit"}
    if unseen and confirm is not None:
        still = confirm(unseen)
        stuck = [(job_id, why) for job_id, why in stuck if job_id not in unseen or job_id in still]
    for job_id, why in stuck:
        with rt.db.session(write=True) as session:
            job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
            if job.state.finished:
                continue
            exhausted = why is not LOST and job.state is JobStatus.PROCESSING and rt.job_retries.exhausted(job.attempts)
            if not exhausted:
                if why is LOST:
                    report.lost.append(job_id)
                    if job.state is JobStatus.PROCESSING:  # prepared, then its inference message was lost
                        job.retry_later(f"{LOST}; attempt {job.attempts} runs again", now)
                        job.attempts -= 1
                elif job.state is JobStatus.PROCESSING:
                    job.retry_later(f"attempt {job.attempts} did not finish: {why}", now)
                job.worker_id = None
                session.flush()
                session.expunge(job)
        if exhausted:
            move_to_dead_letters(
                rt, job_id, "whisperq.transcribe", f"attempt {job.attempts} did not finish: {why}", None
            )
            report.dead.append(job_id)
        else:
            publish(job)
            report.requeued.append(job_id)
            log.warning("job %s put back on the queue: %s", job_id, why)
    # A retry whose delayed message was lost with its worker: publish it again.
    with rt.db.session() as session:
        lost = session.scalars(
            select(Job).where(
                Job.status == JobStatus.PENDING.value,
                Job.next_attempt_at.is_not(None),
                Job.next_attempt_at < now - LOST_RETRY,
            )
        ).all()
        for job in lost:
            job.next_attempt_at = now
            session.expunge(job)
    for job in lost:
        publish(job)
        report.retried_lost.append(job.id)
    # An analysis whose message was lost (or whose worker died without a redelivery): sent again;
    # a second delivery of one already done does nothing.
    for job_id, name, priority, seconds in stale_analyses(rt):
        touch(rt, job_id, name)
        cast("Broker", broker or rt.broker).publish_analyses(job_id, [name], priority, seconds)
        report.analyses_resent.append(f"{job_id}.{name}")
    report.keys_forgotten = forget_old(rt)
    return report
