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
import traceback

from celery import Task, shared_task
from celery.exceptions import Ignore, Reject

from config import broker_priority, publish_transcribe
from config.celeryconfig import inference_queue
from models.errors import InvalidRequest, PermanentJobError, TransientJobError, WhisperqError
from models.jobs.deadletter import bury
from models.jobs.operations import fail_job, get_job, schedule_retry
from models.pipeline.inference import infer_job
from models.pipeline.messages import Finished, MalformedMessage, Prepared
from models.pipeline.preparation import prepare_job
from models.pipeline.shadowing import shadow_job, shadow_message
from models.retry import Verdict, classify
from models.speech.catalog import check_model
from tasks.app import runtime

log = logging.getLogger(__name__)


def worker_id() -> str | None:
    """This worker process's identity, set at worker start (see tasks.worker)."""
    return os.environ.get("WHISPERQ_WORKER_ID")


class JobDeadLettered(Reject):
    """The job used up its attempts: its message is rejected for good."""

    def __str__(self) -> str:
        return str(self.reason)


# transcribe()'s options after the audio, as the API names them (models.pipeline.options);
# `owner` is set here from `api_key`, never by a caller.
POSITIONAL = ("language", "priority", "task", "model")
OPTIONS = ("language", "priority", "task", "model", "word_timestamps", "prompt", "temperature", "callback_url",
           "collect")


class TranscribeTask(Task):
    """Checks every option as the API does, before anything is queued (a bad one raises a
    ValueError saying what to send; a bad key, PermissionError), resolves `api_key` to the
    job's owner and its tier's priorities, and maps the priority tier on the publishing side."""

    def apply_async(self, args=None, kwargs=None, **options):
        args, kwargs = list(args or ()), dict(kwargs or {})
        if len(args) > 1 + len(POSITIONAL):
            raise TypeError(f"transcribe takes the audio's path and at most {len(POSITIONAL)} more positional "
                            f"arguments ({', '.join(POSITIONAL)}); pass the other options by name")
        kwargs.update(zip(POSITIONAL, args[1:]))
        audio = args[0] if args else kwargs.pop("audio", None)
        if not isinstance(audio, str) or not audio:
            raise TypeError("transcribe needs the audio file's path (a string) as its first argument")
        if not os.path.isabs(audio):
            raise ValueError(f"transcribe.delay() takes the absolute path of a file under WHISPERQ_INPUT_DIRS, readable "
                             f"by the workers, not {audio!r}")
        checked = checked_options(self.app.conf.whisperq_settings, {**kwargs, "_audio": audio})
        options.setdefault("priority", broker_priority(checked["priority"], self.app.conf.broker_url))
        return super().apply_async((audio,), checked, **options)


def _length(path: str | None) -> float | None:
    """The audio's length from its header where this process can read the file (the workers
    read it later, so it may not be here); None where not."""
    from models.speech import audio as audio_io

    try:
        with open(path, "rb") as fh:
            return audio_io.probe(fh).duration
    except Exception:  # unreadable here, or not audio: the worker says which
        return None


def checked_options(settings, given: dict) -> dict:
    """The job's options from transcribe.delay()'s keywords, checked as the API checks them."""
    from models.access import quotas
    from models.access.apikeys import ANONYMOUS, authenticate, key_collects
    from models.pipeline.options import check_served, parse_options

    given = dict(given)
    audio = given.pop("_audio", None)
    key = given.pop("api_key", None)
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise TypeError(f"transcribe got unknown option(s) {', '.join(unknown)}; the options are "
                        f"{', '.join(OPTIONS)} and api_key (whose key owns the job)")
    who = ANONYMOUS
    if key is not None:
        try:
            who = authenticate(runtime(), key)
        except WhisperqError as exc:
            raise PermissionError(str(exc)) from None
    checked = parse_options(given, settings, default_priority=who.default_priority())
    if key is not None:
        try:
            who.check_priority(checked["priority"])
        except WhisperqError as exc:
            raise PermissionError(str(exc)) from None
    if checked["model"] is not None and checked["model"] != settings.default_model:
        check_served(runtime(), checked["model"])  # ModelNotServed, as the API's 503
    if who.owner is not None:  # the key's monthly quota, as at the API's door (QuotaExceeded is a WhisperqError)
        try:
            quotas.check(runtime(), who.owner, _length(audio), tier=who.tier)
        except WhisperqError as exc:
            raise PermissionError(str(exc)) from None
    checked["owner"] = who.owner
    checked["collect"] = checked["collect"] or (who.owner is not None and key_collects(runtime(), who.owner))
    return checked


def _after_failure(task: Task, job_id: str, exc: BaseException):
    """Permanent: fail now. Transient: retry with backoff. Out of attempts: dead letters
    (the policy is models.retry's)."""
    verdict = classify(exc)
    if verdict is Verdict.PERMANENT:
        raise exc
    rt = runtime()
    reason = str(exc) if isinstance(exc, WhisperqError) else f"{type(exc).__name__}: {exc}"
    delay = None if verdict is Verdict.EXHAUSTED else schedule_retry(rt, job_id, reason)
    if delay is None:
        bury(rt, job_id, task.name, reason, traceback.format_exc())
        # Celery records the rejection as the task's failure, so r.get() raises it; on
        # RabbitMQ the rejected message goes on to the dead-letter exchange.
        raise JobDeadLettered(f"{reason} (the job is in the dead-letter queue)", requeue=False)
    publish_transcribe(task.app, get_job(rt, job_id), countdown=delay, reply_to=task.request.reply_to)
    raise Ignore()


def _ignores_result(task: Task) -> bool:
    """A job from the API keeps its transcript in the job row (encrypted) only: its
    messages ask the result backend to keep nothing, through the replace and retries."""
    return bool(getattr(task.request, "ignore_result", False))


# resultrepr_maxsize=0: the task-succeeded event (which Flower shows) carries no transcript.
@shared_task(name="whisperq.transcribe", bind=True, base=TranscribeTask, acks_late=True, reject_on_worker_lost=True,
             resultrepr_maxsize=0)
def transcribe(self, audio: str, language: str | None = None, priority: str = "normal", task: str = "transcribe",
               model: str | None = None, word_timestamps: bool = False, prompt: str | None = None,
               temperature: float | None = None, callback_url: str | None = None, collect: bool = False,
               owner: str | None = None) -> dict:
    job_id = self.request.id
    worker = self.request.hostname or socket.gethostname()
    options = {"language": language, "priority": priority, "task": task, "model": model,
               "word_timestamps": word_timestamps, "prompt": prompt, "temperature": temperature,
               "callback_url": callback_url, "collect": collect, "owner": owner}
    try:
        prepared = prepare_job(runtime(), job_id, audio, options, worker=worker, worker_id=worker_id())
    except Exception as exc:
        return _after_failure(self, job_id, exc)
    if isinstance(prepared, Finished):
        return prepared.result
    if prepared.shadow:
        _send_shadow(self, prepared)
    tier = prepared.priority
    return self.replace(
        infer.s(prepared.to_message()).set(queue=inference_queue(self.app.conf.whisperq_settings, prepared.model),
                                           priority=broker_priority(tier, self.app.conf.broker_url),
                                           reply_to=self.request.reply_to, ignore_result=_ignores_result(self))
    )


@shared_task(name="whisperq.infer", bind=True, acks_late=True, reject_on_worker_lost=True, resultrepr_maxsize=0)
def infer(self, message: dict) -> dict:
    """The inference pool's task: `message` is a Prepared (models.pipeline.messages) as JSON."""
    rt = runtime()
    worker = self.request.hostname or socket.gethostname()
    job_id = message.get("job_id") if isinstance(message, dict) else None
    if not isinstance(job_id, str):
        raise Reject(f"an inference message without a job_id was dropped: {str(message)[:200]}", requeue=False)
    try:
        prepared = Prepared.from_message(message)
    except MalformedMessage as exc:
        fail_job(rt, job_id, str(exc))
        raise
    except TransientJobError as exc:  # a newer schema: an upgraded worker may read it
        return _after_failure(self, job_id, exc)
    try:
        check_model(rt.settings, prepared.model)  # a message from a deployment with other models
    except InvalidRequest as exc:
        fail_job(rt, job_id, str(exc))
        raise PermanentJobError(str(exc)) from None
    try:
        return infer_job(rt, prepared, rt.batcher_for(prepared.model), worker=worker, worker_id=worker_id())
    except Exception as exc:
        return _after_failure(self, prepared.job_id, exc)


def _send_shadow(task: Task, prepared: Prepared) -> None:
    """The candidate's copy goes to its own queue at low priority; a failure to send it costs
    the job nothing (the copy is deleted)."""
    message = shadow_message(prepared)
    try:
        shadow.apply_async((message.to_message(),), queue=inference_queue(task.app.conf.whisperq_settings, message.model),
                           priority=broker_priority("low", task.app.conf.broker_url), ignore_result=True)
    except Exception:
        log.warning("job %s: the shadow message for %s was not sent", prepared.job_id, message.model, exc_info=True)
        runtime().storage.delete(message.samples_ref)


@shared_task(name="whisperq.shadow", bind=True, acks_late=True, ignore_result=True)
def shadow(self, message: dict) -> None:
    """The inference pool decodes a job again with a candidate model, apart (models.pipeline.shadowing)."""
    rt = runtime()
    try:
        prepared = Prepared.from_message(message)
    except Exception as exc:
        raise Reject(f"a malformed shadow message was dropped: {exc}", requeue=False) from None
    try:
        check_model(rt.settings, prepared.model)
        shadow_job(rt, prepared)
    except Exception:  # a shadow measures; it is never retried and never touches the job
        log.warning("job %s: shadow decoding by %s failed; dropped", prepared.job_id, prepared.model, exc_info=True)


@shared_task(name="whisperq.sweep", bind=True, ignore_result=True)
def sweep(self) -> dict:
    """Beat's periodic pass over stuck, orphaned and expired jobs (see models.jobs.sweeper)."""
    from .broker import run_sweep

    report = run_sweep(self.app)
    return {k: (len(v) if isinstance(v, list) else v) for k, v in vars(report).items()}
