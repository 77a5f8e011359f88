"""Accepting a submission: validate everything, store, record, publish — or leave nothing."""
from __future__ import annotations

import logging
from typing import Mapping

from celery import Celery
from werkzeug.datastructures import FileStorage

from config import LANGUAGES, PRIORITIES, PREPARE_QUEUE, broker_priority
from models import audio as audio_io
from models.errors import BrokerUnavailable, InvalidRequest
from models.job import Job
from models.jobs import TASKS, create_job, discard_job
from models.runtime import Runtime
from models.speech import check_language, is_multilingual, model_path
from models.storage import clean_filename, safe_suffix

log = logging.getLogger(__name__)

FIELDS = ("language", "priority", "task")


def parse_options(form: Mapping[str, str], settings) -> dict[str, str | None]:
    language = (form.get("language") or "").strip().lower() or None
    if language == "auto":
        language = None
    if language is not None and language not in LANGUAGES:
        raise InvalidRequest(f"language {language!r} is not a Whisper language code; use one such as en, de or fr, or leave it out to detect it")
    language = language or settings.default_language
    check_language(settings, language)
    priority = (form.get("priority") or "normal").strip().lower()
    if priority not in PRIORITIES:
        raise InvalidRequest(f"priority {priority!r} is not one of: {', '.join(PRIORITIES)}")
    task = (form.get("task") or "transcribe").strip().lower()
    if task not in TASKS:
        raise InvalidRequest(f"task {task!r} is not one of: {', '.join(TASKS)}")
    if task == "translate" and not is_multilingual(model_path(settings)):
        raise InvalidRequest("task 'translate' needs a multilingual model; the configured model is English-only")
    return {"language": language, "priority": priority, "task": task}


def submit_upload(rt: Runtime, celery: Celery, upload: FileStorage | None, form: Mapping[str, str]) -> Job:
    """Validate, store, record the PENDING job, then publish. On any error nothing remains."""
    options = parse_options(form, rt.settings)
    if upload is None or not upload.filename:
        raise InvalidRequest("no audio file: send it as the multipart form field 'file'")
    spooled = rt.storage.spool(upload.stream)
    try:
        if spooled.stat().st_size == 0:
            raise InvalidRequest("the uploaded file is empty; choose a file with audio in it")
        info = audio_io.probe(spooled, max_seconds=rt.settings.max_audio_seconds)
        job = create_job(
            rt,
            spooled,
            filename=clean_filename(upload.filename),
            suffix=safe_suffix(upload.filename),
            duration=info.duration,
            **options,
        )
    except BaseException:
        spooled.unlink(missing_ok=True)
        raise
    publish(rt, celery, job)
    return job


def publish(rt: Runtime, celery: Celery, job: Job) -> None:
    """Send the job's message: its id and audio reference only, never audio bytes."""
    try:
        celery.send_task(
            "whisperq.transcribe",
            args=[job.audio_ref],
            kwargs={"language": job.language, "priority": job.priority, "task": job.task},
            task_id=job.id,
            queue=PREPARE_QUEUE,
            priority=broker_priority(job.priority, celery.conf.broker_url),
            # The job row holds the transcript; the result backend is for transcribe.delay().get().
            ignore_result=True,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0},
        )
    except Exception as exc:
        log.error("job %s: publishing failed (%s); job withdrawn", job.id, exc)
        discard_job(rt, job.id)
        raise BrokerUnavailable("the job queue is unreachable right now; nothing was stored, try again shortly") from exc
