"""`whisperq.transcribe` (preparation pool) hands over to `whisperq.infer` (inference pool);
`whisperq.shadow` decodes a copy of a job with a candidate model (inference pool).

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
import uuid

from celery import Task, shared_task
from celery.exceptions import Ignore, Reject

from config import broker_priority
from models.errors import (
    ClaimHeld,
    ClaimLost,
    InvalidRequest,
    JobNotFound,
    ModelNotServed,
    PermanentJobError,
    TransientJobError,
    WhisperqError,
)
from models.jobs.deadletter import move_to_dead_letters
from models.jobs.operations import fail_job, get_job, schedule_retry
from models.jobs.record import Stage
from models.pipeline.door import keeps_result
from models.pipeline.inference import infer_job
from models.pipeline.messages import Finished, MalformedMessage, Prepared
from models.pipeline.preparation import prepare_job
from models.pipeline.request import POSITIONAL, names_for
from models.pipeline.shadowing import shadow_job, shadow_message
from models.registry.catalog import check_model
from models.retry import Verdict, classify
from models.storage import prepared_ref
from tasks.app import runtime
from tasks.broker import CeleryBroker
from tasks.broker.signing import check

log = logging.getLogger(__name__)


def worker_id() -> str | None:
    """This worker process's identity, set at worker start (see tasks.worker)."""
    return os.environ.get("WHISPERQ_WORKER_ID")


class JobDeadLettered(Reject):
    """The job used up its attempts: its message is rejected for good."""

    def __str__(self) -> str:
        return str(self.reason)


# transcribe()'s options after the audio, as the API names them (models.pipeline.request
# declares them); `owner` is set here from `api_key`, never by a caller.
OPTIONS = names_for("delay")
# Options the door turns into something else (models.analysis: JobOptions.analyses): the message
# carries them as given, and the preparation pool checks them again.
AS_GIVEN = ("speakers", "redact")


class TranscribeTask(Task):
    """transcribe.delay() is a way in like any other: the one door (models.pipeline.door)
    checks the job before anything is queued (a bad option raises a ValueError saying what to
    send; a bad key or a path outside the key's input directories, PermissionError or
    ValueError), resolves `api_key` to the job's owner, and seals that owner into a token
    bound to the job id, which the preparation pool checks: the message never carries the key,
    and no other message can claim it. The priority tier is mapped on the publishing side."""

    def apply_async(self, args=None, kwargs=None, **options):
        args, kwargs = list(args or ()), dict(kwargs or {})
        if len(args) > 1 + len(POSITIONAL):
            raise TypeError(
                f"transcribe takes the audio's path and at most {len(POSITIONAL)} more positional "
                f"arguments ({', '.join(POSITIONAL)}); pass the other options by name"
            )
        kwargs.update(zip(POSITIONAL, args[1:], strict=False))  # fewer options than POSITIONAL names
        audio = args[0] if args else kwargs.pop("audio", None)
        if not isinstance(audio, str) or not audio:
            raise TypeError("transcribe needs the audio file's path (a string) as its first argument")
        task_id = options.setdefault("task_id", str(uuid.uuid4()))
        checked = checked_options(self.app.conf.whisperq_settings, {**kwargs, "_audio": audio, "_job_id": task_id})
        options.setdefault("priority", broker_priority(checked["priority"], self.app.conf.broker_url))
        return super().apply_async((audio,), checked, **options)


def checked_options(settings, given: dict) -> dict:
    """The message's options from transcribe.delay()'s keywords, through the one door as the
    API checks them; `owner` and its sealed `owner_token` from `api_key`."""
    from models.pipeline import door

    given = dict(given)
    audio, job_id = given.pop("_audio", None), given.pop("_job_id", None)
    key = given.pop("api_key", None)
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise TypeError(
            f"transcribe got unknown option(s) {', '.join(unknown)}; the options are "
            f"{', '.join(OPTIONS)} and api_key (whose key owns the job)"
        )
    rt = runtime()
    try:
        who = door.identify(rt, token=key, how="pass it as transcribe.delay(..., api_key='wq_...')")
        admitted = door.admit(
            rt,
            door.Submission(
                who, "delay", fields={k: v for k, v in given.items() if v is not None}, path=audio, job_id=job_id
            ),
            local=False,
        )
    except (InvalidRequest, ModelNotServed):
        raise
    except WhisperqError as exc:  # a bad key, a priority or a path not the key's, a spent quota, a full queue
        raise PermissionError(str(exc)) from None
    checked = {k: v for k, v in admitted.options.fields().items() if k in OPTIONS}
    checked.update({k: given[k] for k in AS_GIVEN if given.get(k) is not None})
    if who.owner is not None:
        checked["owner"], checked["owner_token"] = who.owner, door.owner_token(job_id, who.owner)
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
        move_to_dead_letters(rt, job_id, task.name, reason, traceback.format_exc())
        # Celery records the rejection as the task's failure, so r.get() raises it; on
        # RabbitMQ the rejected message goes on to the dead-letter exchange, on SQS to the
        # dead-letter queue (models.compat's channel).
        raise JobDeadLettered(f"{reason} (the job is in the dead-letter queue)", requeue=False)
    if rt.broker is None:  # tasks.app.runtime() always gives its runtime one
        raise RuntimeError("this worker's runtime has no broker to publish the job's retry with")
    rt.broker.publish_job(get_job(rt, job_id), countdown=delay, reply_to=task.request.reply_to)
    raise Ignore()


def _answer(rt, job_id: str, result: dict | None) -> dict | None:
    """What a task returns to the result backend: a transcribe.delay() job's transcript (its
    caller reads it with r.get()); for every other job nothing, whatever its message asked:
    the job row is the truth, and a message naming someone else's job gets nothing back."""
    try:
        return result if keeps_result(get_job(rt, job_id)) else None
    except JobNotFound:
        return None


# resultrepr_maxsize=0: the task-succeeded event (which Flower shows) carries no transcript.
@shared_task(
    name="whisperq.transcribe",
    bind=True,
    base=TranscribeTask,
    acks_late=True,
    reject_on_worker_lost=True,
    resultrepr_maxsize=0,
)
def transcribe(self, audio: str, *positional: object, **given: object) -> dict | None:
    """The preparation pool's task. Its keyword arguments are the job's options
    (models.pipeline.request) and who owns it (`api_key`, or `owner` with `owner_token`); a
    message naming a job this service made carries none, the job's row has them. A raw
    producer's message is checked by the one door like any other way in: an unknown or bad
    option fails its job, saying why."""
    trusted = check(self)  # signed by this deployment; else a producer's, which may only create a job
    job_id = self.request.id
    worker = self.request.hostname or socket.gethostname()
    options: dict[str, object] = dict(zip(POSITIONAL, positional, strict=False))
    options.update(given)
    if len(positional) > len(POSITIONAL):
        options["_positional"] = positional[len(POSITIONAL) :]  # refused by the door, saying what to send
    rt = runtime()
    try:
        prepared = prepare_job(rt, job_id, audio, options, worker=worker, worker_id=worker_id(), trusted=trusted)
    except Exception as exc:
        return _after_failure(self, job_id, exc)
    if isinstance(prepared, Finished):  # a duplicate delivery: nothing runs, nothing is answered
        raise Ignore()
    if prepared.shadow:
        _send_shadow(self, prepared)
    keep = keeps_result(get_job(rt, job_id))
    return self.replace(
        CeleryBroker(self.app).inference(
            prepared.to_message(), prepared.model, prepared.priority, keep, self.request.reply_to
        )
    )


# max_retries=None: Celery's retries here are only deferrals while another worker holds the job's
# claim (as long as that worker lives); the job row counts the attempts.
@shared_task(
    name="whisperq.infer", bind=True, acks_late=True, reject_on_worker_lost=True, resultrepr_maxsize=0, max_retries=None
)
def infer(self, message: dict) -> dict | None:
    """The inference pool's task: `message` is a Prepared (models.pipeline.messages) as JSON.

    A job another worker is transcribing (its claim's lease live) is not run here: the message
    is published again, due when that lease could have lapsed (so a holder that was killed is
    taken over then), and this one acknowledged. A run whose claim was taken over stored
    nothing; its message is acknowledged and the claim's new holder answers. Only the
    preparation pool's own hand-off, signed, is run (tasks.broker.signing)."""
    check(self)
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
    if prepared.samples_ref != prepared_ref(prepared.job_id):  # only the preparation pool's own samples are read
        raise Reject(
            f"job {prepared.job_id}: an inference message naming samples not its own was dropped", requeue=False
        )
    try:
        result = infer_job(rt, prepared, rt.batcher_for(prepared.model), worker=worker, worker_id=worker_id())
    except ClaimHeld as exc:
        log.info("job %s: %s; this delivery comes back in %.0f s", prepared.job_id, exc, exc.retry_in)
        raise self.retry(countdown=exc.retry_in) from exc
    except ClaimLost as exc:
        raise Ignore() from exc
    except Exception as exc:
        return _after_failure(self, prepared.job_id, exc)
    if result is not None and result.get("stage") == Stage.ANALYSIS.value:
        _send_analyses(self, prepared)
        if _answer(rt, prepared.job_id, result) is not None:
            # A transcribe.delay() caller's r.get() waits for the merged result, which the
            # analysis that finishes the job stores under this id (tasks.analysis).
            raise Ignore()
    return _answer(rt, prepared.job_id, result)


def _send_analyses(task: Task, prepared: Prepared) -> None:
    """The job's transcript is stored and its analyses wait: one message each to the analysis
    pool. One not sent (the broker down) is sent again by the sweeper."""
    job = get_job(runtime(), prepared.job_id)
    names = [run.name for run in job.analysis_runs if not run.finished]
    try:
        CeleryBroker(task.app).publish_analyses(prepared.job_id, names, prepared.priority, prepared.duration)
    except Exception:
        log.warning("job %s: its analyses were not sent; the sweeper sends them", prepared.job_id, exc_info=True)


def _send_shadow(task: Task, prepared: Prepared) -> None:
    """The candidate's copy goes to its own queue at low priority; a failure to send it costs
    the job nothing (the copy is deleted)."""
    message = shadow_message(prepared)
    try:
        CeleryBroker(task.app).publish_shadow(message.to_message(), message.model)
    except Exception:
        log.warning("job %s: the shadow message for %s was not sent", prepared.job_id, message.model, exc_info=True)
        runtime().storage.delete(message.samples_ref)


@shared_task(name="whisperq.shadow", bind=True, acks_late=True, ignore_result=True)
def shadow(self, message: dict) -> None:
    """The inference pool decodes a job again with a candidate model, apart (models.pipeline.shadowing)."""
    check(self)
    rt = runtime()
    try:
        prepared = Prepared.from_message(message)
    except Exception as exc:
        raise Reject(f"a malformed shadow message was dropped: {exc}", requeue=False) from None
    if prepared.samples_ref != prepared_ref(f"{prepared.job_id}.shadow"):
        raise Reject(f"job {prepared.job_id}: a shadow message naming samples not its own was dropped", requeue=False)
    try:
        check_model(rt.settings, prepared.model)
        shadow_job(rt, prepared)
    except Exception:  # a shadow measures; it is never retried and never touches the job
        log.warning("job %s: shadow decoding by %s failed; dropped", prepared.job_id, prepared.model, exc_info=True)
