"""Preparing a job in the preparation pool: claim it (once, whatever the broker delivers
twice), fetch its audio if it came by URL, decode it once, find its windows, and hand the
samples over to inference."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from models.access import quotas
from models.access.admission import Backlog, QueueFull, check_queue
from models.access.apikeys import Principal
from models.errors import (
    AttemptsExhausted,
    AudioTooLong,
    InvalidRequest,
    JobCancelled,
    JobExpired,
    PermanentJobError,
    TransientJobError,
    UnsupportedAudio,
    WhisperqError,
)
from models.jobs.operations import TASKS, fail_job
from models.jobs.record import Job, JobStatus, Stage, utcnow
from models.jobs.workers import served_models
from models.pipeline.messages import Finished, Prepared
from models.pipeline.request import FIELDS, OWNERSHIP, POSITIONAL, names_for
from models.registry.catalog import check_language
from models.security.sealed import open_stored
from models.speech import audio as audio_io
from models.speech.windows import split_windows
from models.storage import check_job_id

if TYPE_CHECKING:
    import numpy as np

    from models.runtime import Runtime

log = logging.getLogger(__name__)

LENGTH_SLACK = 1.0  # seconds a decode may run past its header's length before the header is taken to have lied


def _claim(
    rt: Runtime,
    job_id: str,
    audio_ref: str,
    options: dict[str, Any],
    worker: str | None,
    worker_id: str | None,
    trusted: bool = True,
) -> Job | None:
    """Begin an attempt: mark the job PROCESSING and count it.

    A message naming a job this service does not know (transcribe.delay(), or a raw producer)
    goes through the one door first (`_admit_message`); its id must be a job id (a lower-case
    UUID). A producer's message (unsigned: not `trusted`) naming a job that exists changes
    nothing. Returns None then, and when the job is already COMPLETED (a duplicate delivery):
    nothing is run and nothing is answered. Raises JobExpired for a job past its time-to-live,
    PermanentJobError for a FAILED one, and AttemptsExhausted when a redelivery finds no
    attempts left (a job whose workers keep dying is a poison job: it goes to the
    dead-letter store).
    """
    try:
        check_job_id(job_id)
    except ValueError as exc:  # never a row, never a file of that name: nothing is made
        _dropped(job_id, f"its job id is not one: {exc}")
        return None
    with rt.db.session() as session:
        known = session.get(Job, job_id) is not None
    if not known:
        _admit_message(rt, job_id, audio_ref, options)
    elif not trusted:  # a producer's message names a job that exists: it changes nothing
        _dropped(job_id, "it names a job that exists, and a producer's message may only create one")
        return None
    with rt.db.session(write=True) as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        if job.state is JobStatus.COMPLETED or job.stage == Stage.ANALYSIS.value:
            done = "COMPLETED" if job.state is JobStatus.COMPLETED else "transcribed (its analyses run)"
            log.info("job %s already %s; duplicate delivery ignored", job_id, done)
            return None
        if job.state is JobStatus.EXPIRED:
            raise JobExpired(job.error or "the job expired")
        if job.state is JobStatus.CANCELLED:
            raise JobCancelled(f"job {job_id} was cancelled; it is not run")
        if job.state.finished:
            raise PermanentJobError(job.error or f"the job is {job.status}")
        ttl = timedelta(seconds=rt.settings.job_ttl_seconds)
        if job.state is JobStatus.PENDING and not job.attempts and job.waiting_since() < utcnow() - ttl:
            job.expire()
            expired = job.error
        else:
            expired = None
    if expired is not None:  # raised after the session has committed the EXPIRED state
        raise JobExpired(expired)
    with rt.db.session(write=True) as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        if job.state is JobStatus.COMPLETED or job.stage == Stage.ANALYSIS.value:  # finished in between
            return None
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


def _dropped(job_id: str, why: str) -> None:
    from models.jobs.metrics import observe_dropped

    log.warning("a whisperq.transcribe message (id %s) was dropped unread: %s", str(job_id)[:64], why)
    observe_dropped("whisperq.transcribe", "names an existing job" if "exists" in why else "bad job id")


def _message_principal(rt: Runtime, job_id: str, options: dict[str, Any]) -> tuple[Principal, str]:
    """Whom a message's job is for, and which way it came in, by the one door's `identify`.
    Only the key itself (`api_key`) or an owner token this deployment sealed for this very job
    id (transcribe.delay(api_key=...)) names an owner; a bare `owner` key id names no one, a
    revoked key is refused, and a message with neither is anonymous use, where it is allowed."""
    from models.pipeline import door

    key, owner, token = options.get("api_key"), options.get("owner"), options.get("owner_token")
    if key is not None:
        if not isinstance(key, str):
            raise InvalidRequest("api_key must be the API key itself, as a string")
        return door.identify(rt, token=key, how="give the message's api_key"), "raw"
    if owner is not None:
        if token is None:
            raise InvalidRequest(
                "a message names its owner with api_key (the key itself), never with a bare key id; "
                "transcribe.delay(api_key=...) does this for you"
            )
        if door.owner_from_token(job_id, token) != owner:
            raise InvalidRequest("owner_token was issued for another owner; submit with transcribe.delay(api_key=...)")
        return door.identify(rt, key_id=owner, what="this job's owner", how=""), "delay"
    how = "give the message's api_key, or call transcribe.delay(..., api_key='wq_...')"
    return door.identify(rt, how=how), "delay"


def _admit_message(rt: Runtime, job_id: str, audio_ref: Any, options: dict[str, Any]) -> None:
    """A job named only by its message (transcribe.delay(), a raw producer): through the one
    door as any other way in, its row made PENDING; or, refused, a FAILED row saying why (the
    message is input from outside: it is never retried), then PermanentJobError."""
    from models.pipeline import door, intake

    fields = {k: v for k, v in options.items() if k in FIELDS and v is not None}
    owner = None
    try:
        if not isinstance(audio_ref, str):
            raise InvalidRequest("the message's audio must be the absolute path of a file, as a string")
        who, origin = _message_principal(rt, job_id, options)
        owner = who.owner  # a refusal from here on is shown to the key that sent it
        _check_names(options, origin)
        # local=False: a file shared storage has not shown this host yet is retried by prepare_job.
        admitted = door.admit(
            rt, door.Submission(who, origin, fields=fields, path=audio_ref, job_id=job_id), queue=False, local=False
        )
        intake.record(rt, admitted)
        return
    except IntegrityError:  # another delivery of the same message made it meanwhile
        return
    except (WhisperqError, ValueError) as exc:
        refusal = str(exc)
    with rt.db.session(write=True) as session:
        if session.get(Job, job_id) is None:
            model, route, shadow = rt.settings.choose(None, job_id)
            ref = str(audio_ref)[:4096]
            session.add(
                Job(
                    id=job_id,
                    status=JobStatus.FAILED.value,
                    error=refusal,
                    finished_at=utcnow(),
                    task="transcribe",
                    priority="normal",
                    model=model,
                    route=route,
                    shadow=shadow,
                    audio_ref=ref,
                    audio_owned=False,
                    filename=Path(ref).name[:255] or None,
                    attempts=0,
                    created_at=utcnow(),
                    origin="raw",
                    owner=owner,
                )
            )
    log.warning("job %s: refused: %s", job_id, refusal)
    raise PermanentJobError(refusal)


def _check_names(options: dict[str, Any], origin: str) -> None:
    """A message carries the audio's path as its one argument, and the options its door takes
    (models.pipeline.request) and who owns the job as keyword arguments; anything else is
    refused, saying what the message may carry."""
    if "_positional" in options:
        raise InvalidRequest(
            f"the message's args are the audio's path and at most {len(POSITIONAL)} options "
            f"({', '.join(POSITIONAL)}); send the other options as keyword arguments"
        )
    known = set(names_for(origin)) | set(OWNERSHIP)
    unknown = sorted(name for name in options if name not in known)
    if unknown:
        raise InvalidRequest(
            f"unknown option(s) {', '.join(repr(u) for u in unknown)}; a message takes "
            f"{', '.join(names_for(origin))} and {', '.join(OWNERSHIP)} (docs/producers.md)"
        )


def _tier(rt: Runtime, owner: str | None) -> str | None:
    from models.access.apikeys import ApiKey

    if owner is None:
        return None
    with rt.db.session() as session:
        return session.scalar(select(ApiKey.tier).where(ApiKey.id == owner))


def prepare_job(
    rt: Runtime,
    job_id: str,
    audio_ref: str,
    options: dict[str, Any] | None = None,
    worker: str | None = None,
    worker_id: str | None = None,
    trusted: bool = True,
) -> Prepared | Finished:
    """Decode, resample to 16 kHz mono, measure and split into windows; store the samples.

    Returns the inference pool's message (models.pipeline.messages) — references and sample
    offsets, never audio — or Finished when the job is already COMPLETED (a duplicate delivery)
    or the message may not act on it. `trusted`: the message is signed by this deployment
    (tasks.broker.signing); a producer's (raw) message may only create a new job.
    Permanent problems mark the job FAILED and raise PermanentJobError; transient ones
    raise TransientJobError for the task to retry.
    """
    job = _claim(rt, job_id, audio_ref, options or {}, worker, worker_id, trusted)
    if job is None:
        return Finished(job_id)
    try:
        if job.task not in TASKS:
            raise InvalidRequest(f"task {job.task!r} is not one of: {', '.join(TASKS)}")
        check_language(rt.settings, job.language, job.model)
        if job.audio_url and not job.audio_ref:
            job.audio_ref = _fetch(rt, job)
        if not rt.storage.exists(job.audio_ref):
            # Shared storage may not have caught up yet: worth another attempt.
            raise TransientJobError(f"the audio file {job.audio_ref!r} does not exist or is not readable by the worker")
        samples = _decode_stored(rt, job.audio_ref, job.audio_format, rt.settings.audio_limit(_tier(rt, job.owner)))
        check_decoded(rt, job, len(samples) / audio_io.SAMPLE_RATE)
    except (quotas.QuotaExceeded, QueueFull) as exc:
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
    if job.shadow and shadow is None:  # no copy for a queue that no worker takes from
        log.info("job %s: not shadowed by %s: no live inference worker serves it", job_id, job.shadow)
    shadow_ref = rt.storage.save_samples(f"{job_id}.shadow", samples) if shadow else None
    log.info("job %s prepared: %.1f s of audio in %d windows", job_id, duration, len(windows))
    return Prepared(
        job_id,
        ref,
        round(duration, 3),
        tuple(windows),
        language=job.language,
        task=job.task,
        priority=job.priority,
        word_timestamps=bool(job.word_timestamps),
        prompt=job.prompt or None,
        temperature=float(job.temperature or 0.0),
        model=job.model or rt.settings.default_model,
        hotwords=job.hotwords or None,
        shadow=shadow,
        shadow_ref=shadow_ref,
    )


def check_decoded(rt: Runtime, job: Job, seconds: float) -> None:
    """Limits on what was decoded, not what the header claimed: the key's monthly quota with
    the job at its decoded length (every job), and, where the audio is longer than the door
    measured it, the key's share of the queue with that difference added (QueueFull, a
    refusal for good: the file is not what its header said)."""
    quotas.check_measured(rt, job, seconds)
    claimed = job.audio_duration
    if job.owner is not None and claimed is not None and seconds > claimed + LENGTH_SLACK:
        try:
            check_queue(rt, job.priority, owner=job.owner, ahead=Backlog(0, seconds - claimed))
        except QueueFull as exc:
            raise QueueFull(
                f"the audio decodes to {seconds:.1f} s, not the {claimed:.1f} s its header claimed, and "
                f"at that length it is past this API key's share of the queue: {exc}",
                exc.retry_after,
            ) from exc


def _decode_stored(rt: Runtime, ref: str, audio_format: str | None, max_seconds: float | None = None) -> np.ndarray:
    """The stored audio's samples (decrypted as they are read), its container pinned as the
    door found it, at most `max_seconds` of it (the job's tier's limit; else
    WHISPERQ_MAX_AUDIO_SECONDS). A key this worker lacks may be
    a configuration still rolling out: retried. A file that fails authentication is not."""
    from models.security.crypto import DecryptionError

    try:
        with rt.storage.open(ref) as fh:
            return audio_io.decode(fh, format=audio_format, max_seconds=max_seconds or rt.settings.max_audio_seconds)
    except PermissionError as exc:  # a caller's file swapped for a link, or made unreadable
        raise PermanentJobError(f"the audio file could not be read: {exc}") from None
    except DecryptionError as exc:
        log.error("%s", exc)  # for the operator: which file, which key, which chunk
        if exc.missing_key:
            raise TransientJobError(
                f"the stored audio is encrypted with key id {exc.key_id!r}, which this worker "
                "does not have; add it to WHISPERQ_ENCRYPTION_KEYS"
            ) from None
        raise PermanentJobError(
            "the stored audio failed decryption (it was altered or damaged); submit the audio again"
        ) from None


def _fetch(rt: Runtime, job: Job) -> str:
    """Fetch a job submitted by URL into storage (preparation pool); returns its reference.
    Its length, unknown at the door, is checked now as the door checks an upload's: against
    its key's tier's limit and what is left of the key's monthly quota."""
    from models.access.s3_sources import is_s3_url
    from models.delivery.fetch import fetch_audio
    from models.delivery.s3_fetch import fetch_s3_audio

    tmp = rt.storage.tmp_dir / f"fetch-{job.id}"
    try:
        url = cast(str, job.audio_url)  # a job by URL
        if is_s3_url(url):  # read with the deployment's credentials, if the job's key may still name it
            fetch_s3_audio(rt, url, tmp, job.owner, create=rt.storage.writer)  # written encrypted
        else:
            fetch_audio(url, tmp, rt.settings, create=rt.storage.writer)  # written encrypted
        with open_stored(tmp, what="the fetched audio") as fh:
            info = audio_io.probe(fh, max_seconds=rt.settings.audio_limit(_tier(rt, job.owner)))
        quotas.check_measured(rt, job, info.duration)
        ref = rt.storage.store_audio(tmp, job.id)
    except (UnsupportedAudio, AudioTooLong) as exc:
        raise PermanentJobError(f"the audio at audio_url: {exc}") from exc
    except quotas.QuotaExceeded as exc:
        raise PermanentJobError(str(exc)) from exc  # FAILED by prepare_job, billed nothing
    finally:
        tmp.unlink(missing_ok=True)
    with rt.db.session() as session:
        stored = cast(Job, session.get(Job, job.id))  # the job being prepared
        stored.audio_ref, stored.audio_duration, stored.audio_format = ref, round(info.duration, 3), info.format
    job.audio_format = info.format  # pinned for the decode that follows
    job.audio_duration = round(info.duration, 3)  # measured: the decode is not checked against the quota again
    log.info("job %s: fetched %.1f s of audio from its audio_url", job.id, info.duration)
    return ref
