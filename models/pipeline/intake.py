"""After the one door (models.pipeline.door): recording an admitted job, or a batch of them,
and publishing it through the runtime's broker. `submit` is what a way in calls: the door's
`admit`, then `accept`. A refusal at any step leaves nothing stored and nothing queued.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, cast

from models.access import quotas
from models.access.apikeys import Principal
from models.errors import BrokerUnavailable
from models.jobs import idempotency
from models.jobs.operations import ANY, create_job, discard_job
from models.jobs.record import Job
from models.pipeline.door import Admission, Submission, admit, check_share, earlier_job, idempotent_hit
from models.storage import clean_filename

if TYPE_CHECKING:
    from models.jobs.batches import Batch
    from models.runtime import Broker, Runtime

log = logging.getLogger(__name__)


def _filename(sub: Submission, admitted: Admission) -> str | None:
    if sub.upload is not None:
        return clean_filename(sub.filename)
    if admitted.path is not None:
        return clean_filename(os.path.basename(admitted.path))
    if admitted.audio_url is not None:
        return clean_filename(admitted.audio_url.rsplit("/", 1)[-1].split("?", 1)[0])
    if sub.rerun_of is not None:
        return sub.rerun_of.filename
    return None


def job_fields(admitted: Admission) -> dict[str, Any]:
    """A batch job's row fields (models.jobs.batches.create_batch) from its admission."""
    sub = admitted.submission
    return {
        **admitted.options.fields(),
        "audio_url": admitted.audio_url,
        "filename": _filename(sub, admitted),
        "duration": admitted.seconds,
        "audio_format": admitted.audio_format,
        "origin": sub.door,
        **({"spooled": sub.upload.path} if sub.upload is not None else {}),
    }


def record(rt: Runtime, admitted: Admission) -> Job:
    """The admitted job's PENDING row, its audio moved into the store with it; then its key's
    quota counted again with the row in (racing submissions cannot pass it together)."""
    sub = admitted.submission
    spooled = sub.upload.path if sub.upload is not None else None
    copied = None
    if sub.rerun_of is not None and sub.rerun_of.audio_ref:
        spooled = copied = rt.storage.copy_to_spool(sub.rerun_of.audio_ref)
    try:
        job = create_job(
            rt,
            spooled,
            admitted.options,
            filename=_filename(sub, admitted),
            duration=admitted.seconds,
            audio_format=admitted.audio_format,
            owner=admitted.owner,
            origin=sub.door,
            audio_url=admitted.audio_url
            or (sub.rerun_of.audio_url if sub.rerun_of is not None and copied is None else None),
            caller_file=admitted.path,
            rerun_of=sub.rerun_of.id if sub.rerun_of is not None else None,
            job_id=sub.job_id,
        )
    except BaseException:
        if copied is not None:
            copied.unlink(missing_ok=True)
        raise
    if sub.upload is not None:
        sub.upload.release()  # moved into the store
    quotas.confirm_or_withdraw(rt, job)
    return job


def accept(rt: Runtime, admitted: Admission) -> tuple[Job, bool]:
    """Record the admitted job and publish it; (the job, True). With an idempotency key
    that named a job made before: (that job, False), nothing new stored."""
    sub = admitted.submission
    if admitted.earlier is not None:
        if sub.upload is not None:
            sub.upload.discard()
        return admitted.earlier, False
    job = record(rt, admitted)
    key = admitted.idempotency_key
    if key is not None:
        winner = idempotency.remember(rt, key, admitted.fingerprint or "", job.id)
        if winner != job.id:  # a concurrent request with the same key got there first
            discard_job(rt, job.id)
            return earlier_job(rt, sub.who, winner), False
    try:
        publish(rt, job)
    except BrokerUnavailable:
        if key is not None:
            idempotency.forget(rt, key)
        raise
    return job, True


def submit(rt: Runtime, sub: Submission, *, namespace: str | None = None) -> tuple[Job, bool]:
    """`admit` then `accept`: the one call a door makes for one job. On any refusal an
    upload's spool is removed and nothing is stored or queued."""
    try:
        admitted = admit(rt, sub, namespace=namespace)
    except BaseException:
        if sub.upload is not None:
            sub.upload.discard()
        raise
    try:
        return accept(rt, admitted)
    except BaseException:
        if sub.upload is not None:
            sub.upload.discard()
        raise


def publish(rt: Runtime, job: Job) -> None:
    """Send the job's message (its id and audio reference only); where the broker is away,
    the job is withdrawn and BrokerUnavailable raised: nothing remains."""
    try:
        cast("Broker", rt.broker).publish_job(job)  # None fails here too: the job is withdrawn
    except Exception as exc:
        log.error("job %s: publishing failed (%s); job withdrawn", job.id, exc)
        discard_job(rt, job.id)
        raise BrokerUnavailable(
            "the job queue is unreachable right now; nothing was stored, try again shortly"
        ) from exc


def accept_batch(
    rt: Runtime, who: Principal, admitted: list[Admission], callback: str | None, key: str | None, fingerprint: str
) -> tuple[Batch, bool]:
    """A batch of admitted jobs: the queue budget and the key's share and quota with all of them
    counted, then its row and all its jobs (their audio moved into the store) in one
    transaction, then published. (The batch, True); with an idempotency key that named a
    batch made before, (that batch, False). A refusal stores nothing."""
    from models.jobs.batches import create_batch, discard_batch

    earlier = idempotent_hit(rt, who, key, fingerprint)
    if earlier is not None:
        return _earlier_batch(rt, who, earlier), False
    priority = admitted[0].priority
    check_share(
        rt,
        who,
        priority,
        [a.seconds if a.seconds is not None else rt.settings.unfetched_audio_seconds for a in admitted],
    )
    batch, jobs = create_batch(rt, [job_fields(a) for a in admitted], owner=who.owner, callback_url=callback)
    for a in admitted:
        if a.submission.upload is not None:
            a.submission.upload.release()  # moved into the store
    quotas.confirm_or_withdraw(rt, jobs[0], withdraw=lambda: discard_batch(rt, batch.id))
    if key is not None:
        winner = idempotency.remember(rt, key, fingerprint, batch.id)
        if winner != batch.id:  # a concurrent request with the same key got there first
            discard_batch(rt, batch.id)
            return _earlier_batch(rt, who, winner), False
    _publish_all(rt, batch, jobs, key)
    return batch, True


def _earlier_batch(rt: Runtime, who: Principal, batch_id: str) -> Batch:
    from models.jobs.batches import get_batch

    return get_batch(rt, batch_id, owner=ANY if who.admin else who.owner).batch


def _publish_all(rt: Runtime, batch: Batch, jobs: list[Job], key: str | None) -> None:
    """Publish every job of a batch. If the broker fails before the first, the batch is
    withdrawn (BrokerUnavailable, nothing stored); after some, those are queued and the rest
    FAILED, saying to send them again, so the batch still ends and its webhook is still sent."""
    from models.jobs.batches import discard_batch
    from models.jobs.operations import fail_job

    for n, job in enumerate(jobs):
        try:
            publish(rt, job)  # a failed publish removes that job's row
        except BrokerUnavailable:
            if n == 0:
                discard_batch(rt, batch.id)
                if key is not None:
                    idempotency.forget(rt, key)
                raise
            log.error("batch %s: the broker failed after %d of %d jobs; the rest are FAILED", batch.id, n, len(jobs))
            for rest in jobs[n + 1 :]:
                fail_job(
                    rt, rest.id, "the job queue became unreachable while the batch was queued; submit this audio again"
                )
            return
