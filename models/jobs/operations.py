"""Job operations: create from an upload, look up, finish exactly once, cancel and delete.
Preparing a job (claiming it, decoding its audio) is models.pipeline.preparation; the claim
an inference run holds, and that storing its transcript checks, is models.jobs.claims.

Tasks and views are thin wrappers around these functions; tests call them directly.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from sqlalchemy import select, update

from config import LANGUAGES, PRIORITIES
from models.analysis import hides
from models.errors import (
    AttemptsExhausted,
    ClaimLost,
    InvalidRequest,
    JobCancelled,
    JobNotFound,
    JobNotReady,
    PermanentJobError,
    WhisperqError,
)
from models.jobs import metrics
from models.jobs.analyses import begin_analyses, hide_before_storing
from models.jobs.claims import Claim, claim_locked, holds
from models.jobs.record import Job, JobOptions, JobStatus, Stage, new_job_id, utcnow
from models.jobs.shadows import forget_shadows, score_waiting_shadows
from models.storage import prepared_ref

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)

TASKS = ("transcribe", "translate")
# `owner=ANY` (the default) acts on any job: workers, operators and admin keys. Web
# requests pass their principal's owner (a key id, or None for anonymous use), and a job
# recorded under another owner is "not found", as if it did not exist.
ANY = object()


def _visible(job: Job | None, owner: object) -> TypeGuard[Job]:
    return job is not None and job.deleted_at is None and (owner is ANY or job.owner == owner)


def check_options(language: str | None, priority: str, task: str) -> None:
    """The options any job may carry, whoever submits it; the message says what to send."""
    if language is not None and language not in LANGUAGES:
        raise InvalidRequest(
            f"language {language!r} is not a Whisper language code; use one such as en, de or fr, "
            "or leave it out to detect it"
        )
    if priority not in PRIORITIES:
        raise InvalidRequest(f"priority {priority!r} is not one of: {', '.join(PRIORITIES)}")
    if task not in TASKS:
        raise InvalidRequest(f"task {task!r} is not one of: {', '.join(TASKS)}")


def create_job(
    rt: Runtime,
    spooled: Path | None,
    options: JobOptions = JobOptions(),
    *,
    filename: str | None = None,
    duration: float | None = None,
    audio_format: str | None = None,
    audio_url: str | None = None,
    caller_file: str | None = None,
    owner: str | None = None,
    rerun_of: str | None = None,
    job_id: str | None = None,
    origin: str | None = None,
) -> Job:
    """Move a validated upload into storage and record its PENDING job (before publishing),
    with `options` as the door checked them. A job submitted by URL has no file yet: the
    preparation pool fetches it. A `caller_file` (a checked path under WHISPERQ_INPUT_DIRS) is
    read in place and never deleted.

    `options.model` may name an alias (config.registry): the job's model is chosen here, once,
    by the alias's weights; a share of a model's jobs is marked for shadow decoding."""
    job_id = job_id or new_job_id()
    ref = ""
    try:
        with rt.db.session() as session:
            # The audio goes into the store with the row: on PostgreSQL storage in this very
            # transaction, so a job is never without its audio, nor audio without its job.
            ref = rt.storage.store_audio(spooled, job_id, session=session) if spooled is not None else ""
            job = job_row(
                rt,
                job_id,
                ref or caller_file or "",
                audio_owned=caller_file is None,
                filename=filename,
                duration=duration,
                audio_url=audio_url,
                owner=owner,
                audio_format=audio_format,
                rerun_of=rerun_of,
                origin=origin,
                **options.fields(),
            )
            session.add(job)
    except BaseException:
        if ref:
            rt.storage.delete(ref)
        raise
    log.info(
        "job %s created (%s, priority %s)",
        job_id,
        f"{duration:.1f} s of audio" if duration is not None else "audio to fetch",
        options.priority,
    )
    return job


def job_row(
    rt: Runtime,
    job_id: str,
    audio_ref: str,
    *,
    duration: float | None,
    model: str | None,
    collect: bool = False,
    audio_owned: bool = True,
    **fields: Any,
) -> Job:
    """A PENDING job's row (not yet added to a session): its model chosen here, once. A job that
    asks for redaction is never shadowed: no other model's transcript of it is kept."""
    model, route, shadow = rt.settings.choose(model, job_id)
    if hides(fields.get("analyses")):
        shadow = None
    return Job(
        id=job_id,
        status=JobStatus.PENDING.value,
        audio_ref=audio_ref,
        audio_owned=audio_owned,
        audio_duration=round(duration, 3) if duration is not None else None,
        attempts=0,
        model=model,
        route=route,
        shadow=shadow,
        collect=bool(collect),
        **fields,
    )


def get_job(rt: Runtime, job_id: str, owner: object = ANY) -> Job:
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if not _visible(job, owner):
            raise JobNotFound(f"no job with id {job_id!r}")
        session.expunge(job)
        return job


def discard_job(rt: Runtime, job_id: str) -> None:
    """Remove a job and its audio that never reached the queue (publishing failed)."""
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is not None:
            if job.audio_owned and job.audio_ref:
                rt.storage.delete(job.audio_ref)
            session.delete(job)


def _fenced(job: Job, claim: Claim | None) -> None:
    """The claim check at commit: a run whose claim was taken over stores nothing."""
    if claim is not None and not holds(job, claim):
        log.warning(
            "job %s: this run's claim (token %d, %s) was taken over by token %d (%s) after its lease "
            "lapsed; its transcript is discarded, not stored",
            job.id,
            claim.token,
            claim.holder,
            job.claim_token,
            job.claim_holder,
        )
        raise ClaimLost(f"job {job.id}: the claim was taken over by another worker; this run's transcript is discarded")


def complete_job(
    rt: Runtime, job_id: str, data: dict[str, Any], claim: Claim | None = None
) -> tuple[dict[str, Any], bool]:
    """Store the transcript once: a job another delivery already completed keeps its own.
    Returns the stored result and whether this call stored it.

    An engine run passes its `claim` (models.jobs.claims): it is counted in `engine_runs`,
    and its transcript stored, only while the claim is still the job's (else ClaimLost)."""
    with rt.db.session(write=True) as session:
        stored = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        _fenced(stored, claim)
        if claim is not None:  # the engine went through all of the job's windows, under the claim
            stored.engine_runs = (stored.engine_runs or 0) + 1
        if stored.state is JobStatus.COMPLETED:
            return cast("dict[str, Any]", stored.result()), False  # a COMPLETED job's result is never None
        refused: WhisperqError | None = None
        scored: list[tuple[str | None, str, float]] = []
        if stored.deleted_at is not None:
            refused = JobCancelled(f"job {job_id} was deleted; its transcript was not stored")
        elif stored.state.finished:
            refused = PermanentJobError(f"the job is {stored.status}; its transcript was not stored")
        elif stored.stage == Stage.ANALYSIS.value:  # stored by another delivery; its analyses run
            return stored.analysing(), False
        else:
            try:  # redaction before anything is stored: the words it hides are kept nowhere
                data, extra = hide_before_storing(stored, data)
            except PermanentJobError as exc:
                stored.fail(str(exc))
                refused = exc
            else:
                result = _store(stored, data, extra)
                # shadow transcripts that came first are scored against this one now
                scored = score_waiting_shadows(session, stored) if stored.shadow else []
    if refused is not None:  # raised once the run is counted
        raise refused
    for primary, candidate, wer in scored:
        metrics.observe_shadow(primary, candidate, wer)
    return result, True


def _store(job: Job, data: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The transcript stored on its (locked) row: the job COMPLETED, or waiting for its analyses."""
    job.store_transcript(
        data["text"],
        data["language"],
        data["segments"],
        data["duration"],
        data.get("model"),
        data.get("language_probability"),
    )
    job.result_extra = extra or None
    if job.analyses and begin_analyses(job):  # COMPLETED once they are done (models.jobs.analyses)
        return job.analysing()
    job.finish()
    return cast("dict[str, Any]", job.result())  # COMPLETED now


def mark_held(rt: Runtime, job_id: str, worker_id: str | None) -> None:
    """A worker has reserved this job's message: if that worker dies, the sweeper knows
    the message is stuck in a dead worker's buffer, not waiting in the queue."""
    if not worker_id:
        return
    with rt.db.session() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.in_([JobStatus.PENDING.value, JobStatus.PROCESSING.value]))
            .values(worker_id=worker_id, held_at=utcnow())
        )


def begin_inference(
    rt: Runtime, job_id: str, worker: str | None, worker_id: str | None, holder: str, lease: float
) -> tuple[Claim, dict[str, Any] | None]:
    """Take the job's inference claim for `holder` (models.jobs.claims) and mark the job as in
    inference, in one transaction; returns the claim, and the stored result if it is already done.

    A job found already in inference was being run by a worker that is gone (this is a
    redelivery): that costs it an attempt, and the last one sends it to the dead letters.
    The attempt commits with the claim, so a worker killed at any point after taking the
    claim has cost one. Raises ClaimHeld, taking nothing, while another run holds the claim.
    """
    with rt.db.session(write=True) as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
        if job is None:
            raise PermanentJobError(f"job {job_id} does not exist")
        claim = claim_locked(job, holder, lease)
        if job.state is JobStatus.COMPLETED:
            return claim, job.result()
        if job.stage == Stage.ANALYSIS.value:  # transcribed; a late copy of its message runs nothing
            return claim, job.analysing()
        if job.state is JobStatus.CANCELLED:
            raise JobCancelled(f"job {job_id} was cancelled; it is not run")
        if job.state.finished:
            raise PermanentJobError(job.error or f"the job is {job.status}")
        if job.cancel_requested:
            job.progress_seconds = None  # a lost attempt's: no partial transcript was kept, none is billed
            job.cancel()
            return claim, job.result() or {"job_id": job_id, "cancelled": True}
        if job.stage == Stage.INFER:
            if job.attempts >= rt.settings.max_attempts:
                raise AttemptsExhausted(
                    f"inference was started {job.attempts} times without finishing (its worker was lost each time)"
                )
            job.attempts += 1
        if job.state is JobStatus.PENDING:
            job.start(worker, worker_id)
        job.stage, job.worker, job.worker_id = Stage.INFER.value, worker, worker_id
        job.infer_started_at, job.progress_seconds = utcnow(), 0.0
        return claim, None


def schedule_retry(rt: Runtime, job_id: str, error: str) -> float | None:
    """After a transient failure: the delay before the next attempt, or None when the
    attempts are used up (the caller dead-letters the job)."""
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is None or job.state.finished:
            return None
        delay = rt.job_retries.next_delay(job.attempts)
        if delay is None:
            return None
        job.retry_later(f"attempt {job.attempts} failed: {error}", utcnow() + timedelta(seconds=delay))
    log.warning("job %s: attempt failed (%s); retrying in %.1f s", job_id, error, delay)
    return delay


def fail_job(rt: Runtime, job_id: str, reason: str) -> None:
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is not None and not job.state.finished:
            job.fail(reason)
    log.warning("job %s failed: %s", job_id, reason)


def record_progress(rt: Runtime, job_id: str, seconds: float) -> bool:
    """Audio seconds transcribed so far; returns whether a cancel has been asked for."""
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is None:
            return True
        job.progress_seconds = round(seconds, 3)
        return bool(job.cancel_requested) or job.deleted_at is not None


def cancel_running(
    rt: Runtime, job_id: str, partial: dict[str, Any], claim: Claim | None = None
) -> dict[str, Any] | None:
    """A running job stopped at a window boundary: CANCELLED, with what was transcribed
    (kept only while the run's `claim` is still the job's, as complete_job's)."""
    with rt.db.session(write=True) as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        _fenced(job, claim)
        if job.state.finished:
            return job.result()
        kept: dict[str, Any] | None = None if job.deleted_at is not None else partial
        extra: dict[str, Any] = {}
        if kept is not None:
            try:  # what was transcribed is redacted before it is kept, or not kept
                kept, extra = hide_before_storing(job, kept)
            except PermanentJobError:
                kept = None
        job.cancel(kept)
        if extra:
            job.result_extra = {**(job.result_extra or {}), **extra}
        return job.result()


def cancel_job(rt: Runtime, job_id: str, owner: object = ANY) -> Job:
    """Cancel a job that has not finished: one still waiting never runs; one being
    transcribed stops at its next window boundary (its worker marks it CANCELLED)."""
    with rt.db.session(write=True) as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
        if not _visible(job, owner):
            raise JobNotFound(f"no job with id {job_id!r}")
        if job.state.finished:
            raise JobNotReady(f"job {job_id} is already {job.status}; only PENDING or PROCESSING jobs can be cancelled")
        prepared = job.stage in (Stage.QUEUED, Stage.ANALYSIS)
        if job.state is JobStatus.PENDING or prepared:
            job.cancel()
            if "redact" in (job.analyses or {}):  # never the words it was to hide
                job.result_text = job.result_segments = None
        else:
            job.cancel_requested = True
        session.flush()
        session.expunge(job)
    if prepared:  # its inference message will find it CANCELLED
        rt.storage.delete(prepared_ref(job_id))
    log.info("job %s: cancel asked (%s)", job_id, job.status)
    return job


def delete_job(rt: Runtime, job_id: str, owner: object = ANY) -> None:
    """Remove a job's audio and transcript for good; a running job is cancelled first.
    The row stays, emptied, so that a late message finds the job gone."""
    with rt.db.session(write=True) as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
        if not _visible(job, owner):
            raise JobNotFound(f"no job with id {job_id!r}")
        if not job.state.finished:
            if job.state is JobStatus.PENDING or job.stage in (Stage.QUEUED, Stage.ANALYSIS):
                job.cancel()
            else:
                job.cancel_requested = True
        refs = [job.audio_ref] if job.audio_owned and job.audio_ref else []
        refs += [prepared_ref(job_id), prepared_ref(f"{job_id}.shadow")]
        job.deleted_at = utcnow()
        forget_shadows(session, [job_id])
        job.result_text = job.result_segments = job.result_language = job.result_extra = None
        job.analysis_runs.clear()  # what its analyses found goes with it
        job.correction_token = job.corrected_at = None  # a client's correction goes with the transcript
        job.filename = job.audio_url = job.callback_url = None
        job.audio_ref = ""
    for ref in refs:
        rt.storage.delete(ref)
    log.info("job %s deleted", job_id)


def list_jobs(
    rt: Runtime,
    status: str | None = None,
    limit: int = 50,
    cursor: tuple[Any, str] | None = None,
    owner: object = ANY,
    max_confidence: float | None = None,
) -> tuple[list[Job], tuple[Any, str] | None]:
    """Jobs newest first; `cursor` is the (created_at, id) of the last job of the previous
    page. Returns the page and the next cursor (None on the last page). `max_confidence`: only
    transcripts the model was at most this sure of (a reviewer's list)."""
    query = select(Job).where(Job.deleted_at.is_(None))
    if max_confidence is not None:
        query = query.where(Job.confidence.is_not(None), Job.confidence <= max_confidence)
    if owner is not ANY:
        query = query.where(Job.owner.is_(None) if owner is None else Job.owner == owner)
    if status is not None:
        query = query.where(Job.status == status)
    if cursor is not None:
        created, last_id = cursor
        query = query.where((Job.created_at < created) | ((Job.created_at == created) & (Job.id < last_id)))
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    with rt.db.session() as session:
        jobs = list(session.scalars(query).all())
        for job in jobs:
            session.expunge(job)
    page, more = jobs[:limit], len(jobs) > limit
    return page, ((page[-1].created_at, page[-1].id) if more else None)
