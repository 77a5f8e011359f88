"""Batches (POST /v1/batches): many jobs submitted together, followed together, and told
about once, when the last of them has finished.

A batch is a row of its own (who sent it, where to tell them, how many jobs) and its jobs
are ordinary jobs that carry its id (`Job.batch_id`): each is queued, run, cancelled,
deleted and kept by retention as any job is. The batch's state is read from its jobs,
never kept twice: counts by status, done when none is PENDING or PROCESSING.
`finished_at` is the one thing written later: set by the transaction that finishes the
batch's last job (models.delivery.notify), which is also what records its `batch.completed`
webhook; cleared by a dead-letter replay of one of its jobs, which reopens the batch.

A job of the batch that is deleted keeps its row (emptied, CANCELLED if it had not ended):
the batch still counts it and lists it as deleted, so its totals never change under it.
Retention never removes job rows, nor batch rows: a batch answers for as long as its
jobs do. It clears a long-finished batch's callback_url and delivery, as it does a job's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Integer, String, Text, func, select
from sqlalchemy.orm import Mapped, mapped_column

from models.db import Base, UTCDateTime, utcnow
from models.errors import JobNotFound
from models.jobs.operations import ANY, job_row
from models.jobs.record import Job, JobStatus, new_job_id

if TYPE_CHECKING:
    from models.runtime import Runtime

BATCH_EVENT = "batch.completed"
UNFINISHED = (JobStatus.PENDING.value, JobStatus.PROCESSING.value)


class Batch(Base):
    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_job_id)
    # The API key that sent it (None: anonymous use); other keys get 404 for it.
    owner: Mapped[str | None] = mapped_column(String(36), index=True)
    # Where to POST `batch.completed` once every job has finished.
    callback_url: Mapped[str | None] = mapped_column(Text)
    total: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    # Set once, in the transaction that finished its last job.
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


@dataclass(frozen=True)
class Standing:
    """A batch as its jobs say it is now."""

    batch: Batch
    counts: dict[str, int]

    @property
    def done(self) -> bool:
        return not any(self.counts.get(s, 0) for s in UNFINISHED)

    def to_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat().replace("+00:00", "Z") if value else None

        return {
            "batch_id": self.batch.id,
            "status": "COMPLETED" if self.done else "PROCESSING",
            "done": self.done,
            "total": self.batch.total,
            "counts": {s.value: self.counts.get(s.value, 0) for s in JobStatus},
            "callback_url": self.batch.callback_url,
            "created_at": iso(self.batch.created_at),
            "finished_at": iso(self.batch.finished_at),
        }


def create_batch(
    rt: Runtime, items: list[dict[str, Any]], *, owner: str | None, callback_url: str | None
) -> tuple[Batch, list[Job]]:
    """The batch's row and all its PENDING jobs, in one transaction: all of them or nothing.
    `items` are each job's checked fields: audio_url and options, or for an uploaded file
    `spooled` (its sealed file, moved into the store here, as create_job does), `duration`
    and `audio_format` with the options."""
    batch = Batch(id=new_job_id(), owner=owner, callback_url=callback_url, total=len(items), created_at=utcnow())
    jobs, refs = [], []
    try:
        with rt.db.session() as session:
            session.add(batch)
            session.flush()  # the batch first: its jobs point at it
            for item in items:
                fields = dict(item)
                job_id, spooled = new_job_id(), fields.pop("spooled", None)
                ref = rt.storage.store_audio(spooled, job_id, session=session) if spooled is not None else ""
                if ref:
                    refs.append(ref)
                jobs.append(
                    job_row(
                        rt,
                        job_id,
                        ref,
                        duration=fields.pop("duration", None),
                        model=fields.pop("model", None),
                        collect=fields.pop("collect", False),
                        owner=owner,
                        batch_id=batch.id,
                        created_at=batch.created_at,
                        **fields,
                    )
                )
            session.add_all(jobs)
            session.flush()
            session.expunge_all()
    except BaseException:
        for ref in refs:
            rt.storage.delete(ref)
        raise
    return batch, jobs


def discard_batch(rt: Runtime, batch_id: str) -> None:
    """Remove a batch that never reached the queue (publishing or the quota refused it),
    with the audio of its uploaded files."""
    with rt.db.session() as session:
        for job in session.scalars(select(Job).where(Job.batch_id == batch_id)).all():
            if job.audio_owned and job.audio_ref:
                rt.storage.delete(job.audio_ref)
            session.delete(job)
        session.flush()
        batch = session.get(Batch, batch_id)
        if batch is not None:
            session.delete(batch)


def get_batch(rt: Runtime, batch_id: str, owner: object = ANY) -> Standing:
    with rt.db.session() as session:
        batch = session.get(Batch, batch_id)
        if batch is None or (owner is not ANY and batch.owner != owner):
            raise JobNotFound(f"no batch with id {batch_id!r}")
        counts = dict(
            session.execute(select(Job.status, func.count()).where(Job.batch_id == batch_id).group_by(Job.status)).all()
        )
        session.expunge(batch)
    return Standing(batch, {k: int(v) for k, v in counts.items()})


def batch_jobs(
    rt: Runtime, batch_id: str, limit: int, after: str | None = None, status: str | None = None
) -> tuple[list[Job], str | None]:
    """A page of the batch's jobs in a stable order (by id), and the id to continue after."""
    query = select(Job).where(Job.batch_id == batch_id)
    if after is not None:
        query = query.where(Job.id > after)
    if status is not None:
        query = query.where(Job.status == status)
    with rt.db.session() as session:
        jobs = list(session.scalars(query.order_by(Job.id).limit(limit + 1)).all())
        session.expunge_all()
    page = jobs[:limit]
    return page, (page[-1].id if len(jobs) > limit else None)


def unfinished_ids(rt: Runtime, batch_id: str) -> list[str]:
    with rt.db.session() as session:
        return list(
            session.scalars(
                select(Job.id).where(Job.batch_id == batch_id, Job.status.in_(UNFINISHED), Job.deleted_at.is_(None))
            ).all()
        )
