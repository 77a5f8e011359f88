"""The dead-letter store: jobs that used up their attempts, kept for an operator to
inspect, replay or purge. The job row stays FAILED; this row says why and how often."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, ForeignKey, Integer, String, Text, select, update
from sqlalchemy.orm import Mapped, mapped_column

from models.db import Base
from models.errors import AudioPurged, BrokerUnavailable, InvalidRequest, JobNotFound
from models.jobs.record import Job, JobStatus, UTCDateTime, utcnow
from models.security.crypto import SealedAttribute

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)


class DeadLetter(Base):
    __tablename__ = "dead_letters"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    task: Mapped[str] = mapped_column(String(64))
    error: Mapped[str] = mapped_column(Text)
    traceback_token: Mapped[str | None] = mapped_column("traceback", Text)  # sealed: read and write traceback
    attempts: Mapped[int] = mapped_column(Integer)
    worker: Mapped[str | None] = mapped_column(String(255))
    submitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    failed_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    replays: Mapped[int] = mapped_column(Integer, default=0)
    message: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    # A traceback may quote what a job said (a path, a URL, a value): sealed like the transcript.
    traceback = SealedAttribute("traceback_token", "dead_letters.traceback", key="job_id")

    def to_dict(self) -> dict[str, Any]:
        def iso(v: datetime | None) -> str | None:
            return v.isoformat().replace("+00:00", "Z") if v else None

        return {
            "job_id": self.job_id,
            "task": self.task,
            "error": self.error,
            "traceback": self.traceback,
            "attempts": self.attempts,
            "worker": self.worker,
            "submitted_at": iso(self.submitted_at),
            "failed_at": iso(self.failed_at),
            "replays": self.replays,
        }


def move_to_dead_letters(rt: Runtime, job_id: str, task: str, error: str, traceback: str | None) -> None:
    """Fail the job for good and keep it in the dead-letter store."""
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is None or job.state is JobStatus.COMPLETED:
            return
        if not job.state.finished:
            job.fail(f"{error} (gave up after {job.attempts} attempts)")
        dead = session.get(DeadLetter, job_id)
        if dead is None:
            dead = DeadLetter(job_id=job_id, replays=0)
            session.add(dead)
        dead.task, dead.error, dead.traceback = task, error, traceback
        dead.attempts, dead.worker, dead.submitted_at = job.attempts, job.worker, job.created_at
        dead.failed_at = utcnow()
        dead.message = {"audio": job.audio_ref, "language": job.language, "priority": job.priority, "task": job.task}
    log.error("job %s dead-lettered after %s attempts: %s", job_id, dead.attempts, error)


def list_dead(rt: Runtime, limit: int = 100) -> list[dict[str, Any]]:
    with rt.db.session() as session:
        rows = session.scalars(select(DeadLetter).order_by(DeadLetter.failed_at.desc()).limit(limit))
        return [r.to_dict() for r in rows]


def get_dead(rt: Runtime, job_id: str) -> dict[str, Any]:
    with rt.db.session() as session:
        dead = session.get(DeadLetter, job_id)
        if dead is None:
            raise JobNotFound(f"no dead-lettered job with id {job_id!r}")
        return dead.to_dict()


def take_for_replay(rt: Runtime, job_id: str, model: str | None = None) -> Job:
    """Reset a dead job to PENDING with its attempts cleared, on another model (or alias) if
    `model` names one; the caller publishes it."""
    chosen = None
    if model is not None:
        try:
            chosen = rt.settings.choose(model, job_id)
        except LookupError as exc:  # config.registry.UnknownModel names the models
            raise InvalidRequest(str(exc)) from None
    with rt.db.session(write=True) as session:  # retention may be purging it right now
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
        dead = session.get(DeadLetter, job_id)
        if dead is None or job is None:
            raise JobNotFound(f"no dead-lettered job with id {job_id!r}")
        if job.audio_purged_at is not None and (job.audio_owned or not job.audio_ref):
            raise AudioPurged(
                f"job {job_id}'s audio was deleted after the retention period "
                "(WHISPERQ_AUDIO_RETENTION); it cannot be replayed: submit the audio again"
            )
        job.audio_purged_at = None  # a caller's own file: purge its prepared copy again later
        # A job by URL whose audio was never fetched (audio_ref "") fetches it again.
        if job.audio_owned and job.audio_ref and not rt.storage.exists(job.audio_ref):
            raise InvalidRequest(f"job {job_id}'s audio has been deleted; it cannot be replayed")
        job.reset_for_replay()
        if job.batch_id is not None:  # its batch is open again: it finishes, and tells, once more
            from models.jobs.batches import Batch

            session.execute(update(Batch).where(Batch.id == job.batch_id).values(finished_at=None))
        if chosen is not None:
            job.model, job.route, job.shadow = chosen
        session.delete(dead)
        session.flush()
        session.expunge(job)
        return job


def replay(rt: Runtime, job_id: str, model: str | None = None) -> Job:
    """Queue a dead job again with its attempts reset (on `model` if given), through the
    runtime's broker; it is back in the dead letters if publishing fails."""
    job = take_for_replay(rt, job_id, model)
    try:
        if rt.broker is None:
            raise RuntimeError("this process has no broker to publish with")
        rt.broker.publish_job(job)
    except Exception as exc:
        move_to_dead_letters(rt, job_id, "whisperq.transcribe", "replay could not be published", None)
        raise BrokerUnavailable(
            "the job queue is unreachable right now; the job stays in the dead letters, try again shortly"
        ) from exc
    log.info("job %s replayed from the dead-letter queue", job_id)
    return job


def purge(rt: Runtime, job_ids: list[str] | None = None) -> int:
    """Delete dead letters (all, or the given ones); their jobs stay FAILED."""
    with rt.db.session() as session:
        query = select(DeadLetter)
        if job_ids:
            query = query.where(DeadLetter.job_id.in_(job_ids))
        rows = list(session.scalars(query))
        for row in rows:
            session.delete(row)
        return len(rows)
