"""`whisperq.transcribe` (preparation pool) hands over to `whisperq.infer` (inference pool).

Internal services may call it directly::

    from tasks import transcribe
    r = transcribe.delay("/shared/audio/call.wav", language="en", priority="high")
    r.get(timeout=600)  # {"job_id": r.id, "text": ..., "segments": [...], ...}

The path must be readable by the workers. The task id is the job id, so the job is
visible at /v1/jobs/<r.id> once a worker has picked it up. Preparation replaces itself
with the inference task under the same id, so `r.get()` waits for the transcript.
"""
from __future__ import annotations

import logging
import os
import socket

from celery import Task, shared_task

from config import INFERENCE_QUEUE, LANGUAGES, PRIORITIES, broker_priority
from models.inference import get_batcher, infer_job
from models.jobs import TASKS, prepare_job
from models.runtime import get_runtime

log = logging.getLogger(__name__)


class TranscribeTask(Task):
    """Checks the arguments and maps the priority tier on the publishing side."""

    def apply_async(self, args=None, kwargs=None, **options):
        args, kwargs = list(args or ()), dict(kwargs or {})
        audio = args[0] if args else kwargs.get("audio")
        if not isinstance(audio, str) or not audio:
            raise TypeError("transcribe needs the audio file's path (a string) as its first argument")
        if not os.path.isabs(audio) and not audio.startswith("audio/"):
            raise ValueError(f"audio path {audio!r} must be absolute, and readable by the workers")
        tier = kwargs.get("priority") or "normal"
        if tier not in PRIORITIES:
            raise ValueError(f"priority {tier!r} is not one of: {', '.join(PRIORITIES)}")
        language = kwargs.get("language")
        if language is not None and language not in LANGUAGES:
            raise ValueError(f"language {language!r} is not a Whisper language code (such as en, de, fr)")
        if kwargs.get("task", "transcribe") not in TASKS:
            raise ValueError(f"task must be one of: {', '.join(TASKS)}")
        options.setdefault("priority", broker_priority(tier, self.app.conf.broker_url))
        return super().apply_async(args, kwargs, **options)


@shared_task(name="whisperq.transcribe", bind=True, base=TranscribeTask, acks_late=True, reject_on_worker_lost=True)
def transcribe(self, audio: str, language: str | None = None, priority: str = "normal", task: str = "transcribe") -> dict:
    job_id = self.request.id
    worker = self.request.hostname or socket.gethostname()
    options = {"language": language, "priority": priority, "task": task}
    prepared = prepare_job(get_runtime(), job_id, audio, options, worker=worker)
    if "result" in prepared:
        return prepared["result"]
    tier = prepared["priority"]
    return self.replace(
        infer.s(prepared).set(queue=INFERENCE_QUEUE, priority=broker_priority(tier, self.app.conf.broker_url))
    )


@shared_task(name="whisperq.infer", bind=True, acks_late=True, reject_on_worker_lost=True)
def infer(self, prepared: dict) -> dict:
    rt = get_runtime()
    return infer_job(rt, prepared, get_batcher(rt))
