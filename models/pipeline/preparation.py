"""Preparing a job in the preparation pool: claim it (once, whatever the broker delivers
twice), fetch its audio if it came by URL, decode it once, find its windows, and hand the
samples over to inference."""
from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from models.access import quotas
from models.speech import audio as audio_io
from models.errors import (
    AttemptsExhausted,
    AudioTooLong,
    InvalidRequest,
    JobCancelled,
    JobExpired,
    PermanentJobError,
    TransientJobError,
    UnsupportedAudio,
)
from models.jobs.operations import TASKS, fail_job
from models.jobs.record import Job, JobStatus, Stage, utcnow
from models.jobs.workers import served_models
from models.pipeline.messages import Finished, Prepared
from models.pipeline.options import FIELDS, parse_options
from models.speech.catalog import check_language
from models.speech.windows import split_windows
from models.security.sealed import open_stored
from models.storage import caller_file

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)


def _claim(rt: Runtime, job_id: str, audio_ref: str, options: dict[str, Any], worker: str | None,
           worker_id: str | None) -> Job | dict:
    """Begin an attempt: mark the job PROCESSING and count it.

    Returns the stored result instead when the job is already COMPLETED (a duplicate
    delivery). Raises JobExpired for a job past its time-to-live, PermanentJobError for a
    FAILED one, and AttemptsExhausted when a redelivery finds no attempts left (a job
    whose workers keep dying is a poison job: it goes to the dead-letter store).
    """
    refusal = None
    with rt.db.session(write=True) as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
        if job is None:
            # Submitted with transcribe.delay(path): the task id is the job id. A path that
            # is not the caller's file to give fails at once, for good, saying why.
            try:
                audio_ref, refusal = caller_file(audio_ref, rt.settings.input_dirs, rt.settings.data_dir), None
                # A message written by any producer (docs/messages): its options are checked here too.
                options = {**options, **parse_options(
                    {k: v for k, v in options.items() if k in FIELDS and v is not None}, rt.settings,
                    default_priority=options.get("priority") or "normal")}
                if options.get("owner") is not None and not _is_key(rt, options["owner"]):
                    raise InvalidRequest(f"owner {str(options['owner'])[:80]!r} is not the id of an API key "
                                         "(`whisperq keys list`); leave it out, or give transcribe.delay() api_key=")
            except ValueError as exc:
                audio_ref, refusal = str(audio_ref)[:4096], str(exc)
                options = {}  # the refused job is shown with the defaults, not what was refused
            model, route, shadow = rt.settings.choose(options.get("model"), job_id)
            job = Job(
                id=job_id, status=JobStatus.PENDING.value, task=options.get("task") or "transcribe",
                language=options.get("language"), priority=options.get("priority") or "normal",
                model=model, route=route, shadow=shadow, word_timestamps=bool(options.get("word_timestamps")),
                prompt=options.get("prompt"), temperature=options.get("temperature"),
                callback_url=options.get("callback_url"), owner=options.get("owner"),
                collect=bool(options.get("collect")),
                audio_ref=audio_ref, audio_owned=False, filename=Path(audio_ref).name[:255] or None, attempts=0,
                created_at=utcnow(),
            )
            if refusal is not None:
                job.status, job.error, job.finished_at = JobStatus.FAILED.value, refusal, utcnow()
                log.warning("job %s: refused: %s", job_id, refusal)
            session.add(job)
        if job.state is JobStatus.COMPLETED:
            log.info("job %s already COMPLETED; duplicate delivery ignored", job_id)
            return job.result()
        if job.state is JobStatus.EXPIRED:
            raise JobExpired(job.error or "the job expired")
        if job.state is JobStatus.CANCELLED:
            raise JobCancelled(f"job {job_id} was cancelled; it is not run")
        if job.state is JobStatus.FAILED and refusal is None:
            raise PermanentJobError(job.error or "the job has failed")
        ttl = timedelta(seconds=rt.settings.job_ttl_seconds)
        if job.state is JobStatus.PENDING and not job.attempts and job.waiting_since() < utcnow() - ttl:
            job.expire()
            expired = job.error
        else:
            expired = None
    if refusal is not None:  # raised after the session has committed the FAILED job
        raise PermanentJobError(refusal)
    if expired is not None:  # raised after the session has committed the EXPIRED state
        raise JobExpired(expired)
    with rt.db.session(write=True) as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        if job.state is JobStatus.COMPLETED:  # another delivery finished in between
            return job.result()
        if job.state.finished:
            raise PermanentJobError(job.error or f"the job is {job.status}")
        if rt.job_retries.exhausted(job.attempts):
            raise AttemptsExhausted(
                f"the job was started {job.attempts} times without finishing (its worker was lost each time)"
            )
        job.start(worker, worker_id)
        session.flush()
        session.expunge(job)
        return job


def _tier(rt: Runtime, owner: str | None) -> str | None:
    from models.access.apikeys import ApiKey

    if owner is None:
        return None
    with rt.db.session() as session:
        return session.scalar(select(ApiKey.tier).where(ApiKey.id == owner))


def _is_key(rt: Runtime, key_id) -> bool:
    from models.access.apikeys import ApiKey

    if not isinstance(key_id, str):
        return False
    with rt.db.session() as session:
        return session.get(ApiKey, key_id) is not None


def prepare_job(rt: Runtime, job_id: str, audio_ref: str, options: dict[str, Any] | None = None,
                worker: str | None = None, worker_id: str | None = None) -> Prepared | Finished:
    """Decode, resample to 16 kHz mono, measure and split into windows; store the samples.

    Returns the inference pool's message (models.pipeline.messages) — references and sample
    offsets, never audio — or Finished when the job is already COMPLETED (a duplicate delivery).
    Permanent problems mark the job FAILED and raise PermanentJobError; transient ones
    raise TransientJobError for the task to retry.
    """
    claimed = _claim(rt, job_id, audio_ref, options or {}, worker, worker_id)
    if isinstance(claimed, dict):
        return Finished(job_id, claimed)
    job = claimed
    try:
        if job.task not in TASKS:
            raise InvalidRequest(f"task {job.task!r} is not one of: {', '.join(TASKS)}")
        check_language(rt.settings, job.language, job.model)
        if job.audio_url and not job.audio_ref:
            job.audio_ref = _fetch(rt, job)
        if not rt.storage.exists(job.audio_ref):
            # Shared storage may not have caught up yet: worth another attempt.
            raise TransientJobError(f"the audio file {job.audio_ref!r} does not exist or is not readable by the worker")
        samples = _decode_stored(rt, job.audio_ref, job.audio_format)
        if job.owner is not None and job.audio_duration is None:  # transcribe.delay(api_key=...): now measured
            quotas.check_measured(rt, job, len(samples) / audio_io.SAMPLE_RATE)
    except quotas.QuotaExceeded as exc:
        fail_job(rt, job_id, str(exc))
        raise PermanentJobError(str(exc)) from exc
    except (UnsupportedAudio, AudioTooLong, InvalidRequest, PermanentJobError) as exc:
        fail_job(rt, job_id, str(exc))
        raise PermanentJobError(str(exc)) from exc
    duration = len(samples) / audio_io.SAMPLE_RATE
    windows = split_windows(samples)
    ref = rt.storage.save_samples(job_id, samples)
    with rt.db.session(write=True) as session:
        stored = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        if stored.cancel_requested:
            stored.cancel()
            cancelled = True
        else:
            cancelled = False
            stored.audio_duration = round(duration, 3)
            # Handed over: the inference message waits in its queue, held by no worker yet.
            stored.stage, stored.worker_id = Stage.QUEUED.value, None
    if cancelled:
        rt.storage.delete(ref)
        raise JobCancelled(f"job {job_id} was cancelled while it was prepared")
    shadow = job.shadow if job.shadow and job.shadow in served_models(rt) else None
    shadow_ref = rt.storage.save_samples(f"{job_id}.shadow", samples) if shadow else None
    log.info("job %s prepared: %.1f s of audio in %d windows", job_id, duration, len(windows))
    return Prepared(job_id, ref, round(duration, 3), tuple(windows), language=job.language, task=job.task,
                    priority=job.priority, word_timestamps=bool(job.word_timestamps), prompt=job.prompt or None,
                    temperature=float(job.temperature or 0.0), model=job.model or rt.settings.default_model,
                    shadow=shadow, shadow_ref=shadow_ref)


def _decode_stored(rt: Runtime, ref: str, audio_format: str | None):
    """The stored audio's samples (decrypted as they are read), its container pinned as the
    door found it, at most WHISPERQ_MAX_AUDIO_SECONDS of it. A key this worker lacks may be
    a configuration still rolling out: retried. A file that fails authentication is not."""
    from models.security.crypto import DecryptionError

    try:
        with rt.storage.open(ref) as fh:
            return audio_io.decode(fh, format=audio_format, max_seconds=rt.settings.max_audio_seconds)
    except DecryptionError as exc:
        log.error("%s", exc)  # for the operator: which file, which key, which chunk
        if exc.missing_key:
            raise TransientJobError(f"the stored audio is encrypted with key id {exc.key_id!r}, which this worker "
                                    "does not have; add it to WHISPERQ_ENCRYPTION_KEYS") from None
        raise PermanentJobError("the stored audio failed decryption (it was altered or damaged); "
                                "submit the audio again") from None


def _fetch(rt: Runtime, job: Job) -> str:
    """Fetch a job submitted by URL into storage (preparation pool); returns its reference.
    Its length, unknown at the door, is checked now as the door checks an upload's: against
    its key's tier's limit and what is left of the key's monthly quota."""
    from models.delivery.fetch import fetch_audio

    tmp = rt.storage.tmp_dir / f"fetch-{job.id}"
    try:
        fetch_audio(job.audio_url, tmp, rt.settings, create=rt.storage.writer)  # written encrypted
        with open_stored(tmp, what="the fetched audio") as fh:
            info = audio_io.probe(fh, max_seconds=rt.settings.audio_limit(_tier(rt, job.owner)))
        quotas.check_measured(rt, job, info.duration)
        ref = rt.storage.adopt(tmp, job.id)
    except (UnsupportedAudio, AudioTooLong) as exc:
        raise PermanentJobError(f"the audio at audio_url: {exc}") from exc
    except quotas.QuotaExceeded as exc:
        raise PermanentJobError(str(exc)) from exc  # FAILED by prepare_job, billed nothing
    finally:
        tmp.unlink(missing_ok=True)
    with rt.db.session() as session:
        stored = session.get(Job, job.id)
        stored.audio_ref, stored.audio_duration, stored.audio_format = ref, round(info.duration, 3), info.format
    job.audio_format = info.format  # pinned for the decode that follows
    job.audio_duration = round(info.duration, 3)  # measured: the decode is not checked against the quota again
    log.info("job %s: fetched %.1f s of audio from its audio_url", job.id, info.duration)
    return ref
