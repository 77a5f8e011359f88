"""Job operations: create from an upload, look up, and run a transcription exactly once.

Tasks and views are thin wrappers around these functions; tests call them directly.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from . import audio as audio_io
from .errors import InvalidRequest, JobNotFound, PermanentJobError, UnsupportedAudio
from .job import Job, JobStatus, new_job_id
from .runtime import Runtime
from .speech import check_language, get_engine

log = logging.getLogger(__name__)

TASKS = ("transcribe", "translate")


def create_job(
    rt: Runtime,
    spooled: Path,
    *,
    filename: str | None,
    suffix: str,
    duration: float,
    language: str | None,
    priority: str,
    task: str = "transcribe",
) -> Job:
    """Move a validated upload into storage and record its PENDING job (before publishing)."""
    job_id = new_job_id()
    ref = rt.storage.adopt(spooled, job_id, suffix)
    try:
        with rt.db.session() as session:
            job = Job(
                id=job_id,
                status=JobStatus.PENDING.value,
                task=task,
                language=language,
                priority=priority,
                audio_ref=ref,
                audio_owned=True,
                filename=filename,
                audio_duration=round(duration, 3),
                attempts=0,
            )
            session.add(job)
    except BaseException:
        rt.storage.delete(ref)
        raise
    log.info("job %s created (%.1f s of audio, priority %s)", job_id, duration, priority)
    return job


def get_job(rt: Runtime, job_id: str) -> Job:
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise JobNotFound(f"no job with id {job_id!r}")
        session.expunge(job)
        return job


def discard_job(rt: Runtime, job_id: str) -> None:
    """Remove a job and its audio that never reached the queue (publishing failed)."""
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is not None:
            if job.audio_owned:
                rt.storage.delete(job.audio_ref)
            session.delete(job)


def _claim(rt: Runtime, job_id: str, audio_ref: str, options: dict[str, Any], worker: str | None) -> Job | dict:
    """Mark the job PROCESSING; return the stored result instead if it is already done."""
    with rt.db.session() as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
        if job is None:
            # Submitted with transcribe.delay(path): the task id is the job id.
            job = Job(
                id=job_id,
                status=JobStatus.PENDING.value,
                task=options.get("task") or "transcribe",
                language=options.get("language"),
                priority=options.get("priority") or "normal",
                audio_ref=audio_ref,
                audio_owned=rt.storage.owns(audio_ref),
                filename=Path(audio_ref).name if not rt.storage.owns(audio_ref) else None,
                attempts=0,
            )
            session.add(job)
        if job.state is JobStatus.COMPLETED:
            log.info("job %s already COMPLETED; duplicate delivery ignored", job_id)
            return job.result()
        if job.state is JobStatus.FAILED:
            raise PermanentJobError(job.error or "the job has failed")
        job.start(worker)
        session.flush()
        session.expunge(job)
        return job


def run_job(rt: Runtime, job_id: str, audio_ref: str, options: dict[str, Any] | None = None, worker: str | None = None) -> dict:
    """Transcribe a job's audio and store the transcript; returns the result dict.

    Idempotent: a job that is already COMPLETED returns its stored result and runs nothing.
    Permanent problems (undecodable audio, missing file, unsupported language) mark the job
    FAILED and raise PermanentJobError.
    """
    options = options or {}
    claimed = _claim(rt, job_id, audio_ref, options, worker)
    if isinstance(claimed, dict):
        return claimed
    job = claimed
    try:
        if job.task not in TASKS:
            raise InvalidRequest(f"task {job.task!r} is not one of: {', '.join(TASKS)}")
        check_language(rt.settings, job.language)
        path = rt.storage.path(job.audio_ref)
        if not path.is_file():
            raise PermanentJobError(f"the audio file {job.audio_ref!r} does not exist or is not readable by the worker")
        started = time.perf_counter()
        samples = audio_io.decode(path)
        transcript = get_engine(rt.settings).transcribe(samples, language=job.language, task=job.task)
        elapsed = time.perf_counter() - started
    except (UnsupportedAudio, InvalidRequest, PermanentJobError) as exc:
        _finish_failed(rt, job_id, str(exc))
        raise PermanentJobError(str(exc)) from exc
    except Exception as exc:
        _finish_failed(rt, job_id, f"{type(exc).__name__}: {exc}")
        raise
    log.info(
        "job %s transcribed: %.1f s of audio in %.2f s (real-time factor %.3f)",
        job_id, transcript.duration, elapsed, elapsed / max(transcript.duration, 1e-6),
    )
    with rt.db.session() as session:
        stored = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        if stored.state is JobStatus.COMPLETED:
            return stored.result()  # another delivery finished first: keep its transcript
        data = transcript.to_dict()
        stored.complete(data["text"], data["language"], data["segments"], data["duration"])
        return stored.result()


def _finish_failed(rt: Runtime, job_id: str, reason: str) -> None:
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is not None and not job.state.finished:
            job.fail(reason)
    log.warning("job %s failed: %s", job_id, reason)
