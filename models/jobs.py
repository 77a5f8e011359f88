"""Job operations: create from an upload, look up, prepare, and finish exactly once.

Tasks and views are thin wrappers around these functions; tests call them directly.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import select

from . import audio as audio_io
from .errors import InvalidRequest, JobNotFound, PermanentJobError, UnsupportedAudio
from .job import Job, JobStatus, new_job_id
from .runtime import Runtime
from .speech import check_language
from .windows import split_windows

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
                id=job_id, status=JobStatus.PENDING.value, task=task, language=language, priority=priority,
                audio_ref=ref, audio_owned=True, filename=filename, audio_duration=round(duration, 3), attempts=0,
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
                id=job_id, status=JobStatus.PENDING.value, task=options.get("task") or "transcribe",
                language=options.get("language"), priority=options.get("priority") or "normal",
                audio_ref=audio_ref, audio_owned=rt.storage.owns(audio_ref),
                filename=Path(audio_ref).name if not rt.storage.owns(audio_ref) else None, attempts=0,
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


def prepare_job(rt: Runtime, job_id: str, audio_ref: str, options: dict[str, Any] | None = None,
                worker: str | None = None) -> dict:
    """Decode, resample to 16 kHz mono, measure and split into windows; store the samples.

    Returns what the inference step needs — references and sample offsets, never audio —
    or ``{"result": ...}`` when the job is already COMPLETED (a duplicate delivery).
    Permanent problems mark the job FAILED and raise PermanentJobError.
    """
    claimed = _claim(rt, job_id, audio_ref, options or {}, worker)
    if isinstance(claimed, dict):
        return {"job_id": job_id, "result": claimed}
    job = claimed
    try:
        if job.task not in TASKS:
            raise InvalidRequest(f"task {job.task!r} is not one of: {', '.join(TASKS)}")
        check_language(rt.settings, job.language)
        path = rt.storage.path(job.audio_ref)
        if not path.is_file():
            raise PermanentJobError(f"the audio file {job.audio_ref!r} does not exist or is not readable by the worker")
        samples = audio_io.decode(path)
    except (UnsupportedAudio, InvalidRequest, PermanentJobError) as exc:
        fail_job(rt, job_id, str(exc))
        raise PermanentJobError(str(exc)) from exc
    except Exception as exc:
        fail_job(rt, job_id, f"{type(exc).__name__}: {exc}")
        raise
    duration = len(samples) / audio_io.SAMPLE_RATE
    windows = split_windows(samples)
    ref = rt.storage.save_samples(job_id, samples)
    with rt.db.session() as session:
        stored = session.get(Job, job_id)
        stored.audio_duration = round(duration, 3)
    log.info("job %s prepared: %.1f s of audio in %d windows", job_id, duration, len(windows))
    return {
        "job_id": job_id,
        "prepared": ref,
        "duration": round(duration, 3),
        "windows": [[w.start, w.end] for w in windows],
        "language": job.language,
        "task": job.task,
        "priority": job.priority,
    }


def finished_result(rt: Runtime, job_id: str) -> dict | None:
    """The stored transcript if the job is COMPLETED; raises if it FAILED; else None."""
    job = get_job(rt, job_id)
    if job.state is JobStatus.FAILED:
        raise PermanentJobError(job.error or "the job has failed")
    return job.result()


def complete_job(rt: Runtime, job_id: str, data: dict[str, Any]) -> dict:
    """Store the transcript once: a job another delivery already completed keeps its own."""
    with rt.db.session() as session:
        stored = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
        if stored.state is JobStatus.COMPLETED:
            return stored.result()
        stored.complete(data["text"], data["language"], data["segments"], data["duration"])
        return stored.result()


def fail_job(rt: Runtime, job_id: str, reason: str) -> None:
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is not None and not job.state.finished:
            job.fail(reason)
    log.warning("job %s failed: %s", job_id, reason)
