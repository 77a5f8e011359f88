"""The inference claim: one worker at a time runs the engine on a job, across processes and
hosts, whatever the broker delivers twice.

models.pipeline.inference stops one process from running a job twice; a second delivery to
another process (a second pool or host, Redis's visibility timeout, a message the sweeper put
back while its first run goes on) is stopped here, in the job's row:

- **take** before the engine runs, where the claim is free or its lease has lapsed: record
  the holder (host:pid) and the lease's end, and raise `claim_token`, a fencing token that
  only ever grows. An inference run takes it in the very transaction that records its attempt
  (`claim_locked`, from models.jobs.operations.begin_inference), so a worker killed after
  taking it has always had the attempt counted. A job already finished can always be taken:
  nothing runs on it, its delivery is answered and dropped.
- **renew** while the run goes on (`kept`: every third of WHISPERQ_CLAIM_LEASE_SECONDS), so
  that a live holder keeps its claim however long its windows wait in the batcher, and a
  killed one (SIGKILL, a lost host) loses it within one lease: its redelivered message then
  takes it over.
- **fence** at commit: the transcript is stored, and the run counted in `engine_runs`, only
  while the row's token is still the one the run took (models.jobs.operations.complete_job).
  A holder whose lease lapsed and was taken over has its run discarded, never stored.
- **release** when the run ends, however it ends: a retry may take the claim at once.

The claim lives in three columns of the job row rather than a table of its own: a job has one
claim, and the fence is read in the very transaction, on the very row (locked), that stores
the transcript. Lease ends are read on the workers' clocks; a clock that runs ahead costs at
worst a run that is discarded, never a second transcript.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from sqlalchemy import or_, select, update

from models.db import rowcount
from models.errors import ClaimHeld, PermanentJobError
from models.jobs.record import FINISHED, Job, utcnow

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)


@dataclass
class Claim:
    """A run's hold on a job: its fencing token, and whether a renewal found it taken over."""

    job_id: str
    token: int
    holder: str
    lease: float  # seconds
    lost: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


def holder_id() -> str:
    """Who holds a claim, for operators and logs (the token, not this, decides)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def take_claim(rt: Runtime, job_id: str, holder: str, lease: float, now: datetime | None = None) -> Claim:
    """Take the job's claim for `lease` seconds. Raises ClaimHeld (with the seconds until the
    holder's lease could have lapsed) where another run holds it live, PermanentJobError for
    a job that does not exist."""
    now = now or utcnow()
    with rt.db.session() as session:
        token = session.execute(
            update(Job)
            .where(
                Job.id == job_id,
                or_(Job.claim_expires_at.is_(None), Job.claim_expires_at <= now, Job.status.in_(FINISHED)),
            )
            .values(
                claim_token=Job.claim_token + 1, claim_holder=holder, claim_expires_at=now + timedelta(seconds=lease)
            )
            .returning(Job.claim_token)
            .execution_options(synchronize_session=False)
        ).scalar_one_or_none()
        if token is None:
            held = session.execute(select(Job.claim_holder, Job.claim_expires_at).where(Job.id == job_id)).one_or_none()
    if token is not None:
        return Claim(job_id, token, holder, lease)
    if held is None:
        raise PermanentJobError(f"job {job_id} does not exist")
    raise _held(job_id, *held, now)


def claim_locked(job: Job, holder: str, lease: float, now: datetime | None = None) -> Claim:
    """`take_claim` on a row the caller has locked (SELECT ... FOR UPDATE, or SQLite's write
    lock), in the caller's transaction: what the caller records beside it (an inference
    attempt) commits with the claim or not at all, so no kill can land between the two."""
    now = now or utcnow()
    if job.claim_expires_at is not None and job.claim_expires_at > now and job.status not in FINISHED:
        raise _held(job.id, job.claim_holder, job.claim_expires_at, now)
    job.claim_token = (job.claim_token or 0) + 1
    job.claim_holder, job.claim_expires_at = holder, now + timedelta(seconds=lease)
    return Claim(job.id, job.claim_token, holder, lease)


def _held(job_id: str, other: str | None, until: datetime | None, now: datetime) -> ClaimHeld:
    until = cast(datetime, until)  # a claim that was not taken over has an expiry
    return ClaimHeld(
        f"job {job_id} is being transcribed by {other} (its claim lasts until {until:%H:%M:%S} UTC unless renewed)",
        retry_in=max(1.0, (until - now).total_seconds() + 1.0),
    )


def renew_claim(rt: Runtime, claim: Claim, now: datetime | None = None) -> bool:
    """Extend a held claim by its lease; False where it was released or taken over."""
    now = now or utcnow()
    with rt.db.session() as session:
        renewed = rowcount(
            session.execute(
                update(Job)
                .where(Job.id == claim.job_id, Job.claim_token == claim.token, Job.claim_expires_at.is_not(None))
                .values(claim_expires_at=now + timedelta(seconds=claim.lease))
                .execution_options(synchronize_session=False)
            )
        )
    return renewed == 1


def release_claim(rt: Runtime, claim: Claim) -> None:
    """Free the claim if this run still holds it (a no-op once another run took it over).
    A release the database refuses is logged, not raised: the run's own outcome stands, and
    the claim lapses with its lease."""
    try:
        with rt.db.session() as session:
            session.execute(
                update(Job)
                .where(Job.id == claim.job_id, Job.claim_token == claim.token)
                .values(claim_expires_at=None)
                .execution_options(synchronize_session=False)
            )
    except Exception:
        log.warning(
            "job %s: the claim was not released; it lapses in at most %.0f s", claim.job_id, claim.lease, exc_info=True
        )


def holds(job: Job, claim: Claim) -> bool:
    """The fence: whether `claim` is still the job's (read on the row the caller has locked)."""
    return job.claim_token == claim.token


@contextmanager
def kept(rt: Runtime, claim: Claim, seconds: float) -> Iterator[Claim]:
    """Renew the claim every third of its lease while the block runs, for at most `seconds`
    (the run's own time limit: a run stuck past it must not hold the job for ever). A renewal
    that finds the claim taken over sets `claim.lost`; one the database refused is tried again."""
    stop = threading.Event()
    until = time.monotonic() + seconds

    def renew() -> None:
        while not stop.wait(claim.lease / 3) and time.monotonic() < until:
            try:
                if not renew_claim(rt, claim):
                    claim.lost.set()
                    return
            except Exception:
                log.warning("job %s: the claim's lease was not renewed; trying again", claim.job_id, exc_info=True)

    thread = threading.Thread(target=renew, name=f"whisperq-claim-{claim.job_id[:8]}", daemon=True)
    thread.start()
    try:
        yield claim
    finally:
        stop.set()
        thread.join()
