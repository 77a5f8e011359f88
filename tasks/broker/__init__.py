"""The broker package: every way the product reaches its broker, and nothing else does.

- the seam (`CeleryBroker`, models.runtime.Broker): every message the service sends, a job's
  transcribe message, its hand-off to inference, a shadow copy, its analyses, a webhook
  delivery, and a result's removal, published through the process's Celery app;
- the transports (tasks.broker.transport: `transport_for(app)`, one class per broker in
  .redis, .amqp and .sqs): depths, waiting messages, ping, the workers' holdings, what a
  worker declares as it starts, kombu's fixes; the web's metrics and health, the command line
  and the sweeper ask them;
- `run_sweep`: the sweeper's pass against the live broker and workers.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from celery import Celery

from config import NOTIFY_QUEUE, PREPARE_QUEUE, Settings, broker_priority
from config.celeryconfig import ANALYSIS_QUEUE, PUBLISH_RETRY, inference_queue, route

from . import signing as _signing  # noqa: F401 - signs what this process publishes
from .transport import Transport, transport_for

log = logging.getLogger(__name__)


def publish_transcribe(app: Celery, job, countdown: float | None = None, reply_to: str | None = None) -> None:
    """Send a job's transcribe message: its id and audio reference only, never audio.

    Only a transcribe.delay() caller's job keeps its transcript in the result backend (for
    r.get()); every other job keeps it in its row, encrypted, and whichever path publishes it
    (first publish, retry, sweeper, dead-letter replay) asks the backend to keep nothing.
    Preparation runs in the prefork pool, where Celery enforces time limits; they grow with
    the audio's length (unknown for transcribe.delay(path): the longest allowed)."""
    from models.pipeline.door import keeps_result

    settings: Settings = app.conf.whisperq_settings
    hard = settings.prepare_time_limit(job.audio_duration)
    app.send_task(
        "whisperq.transcribe",
        args=[job.audio_ref],
        kwargs={"language": job.language, "priority": job.priority, "task": job.task},
        task_id=job.id,
        queue=route(app.conf.broker_url, PREPARE_QUEUE, job.priority),
        priority=broker_priority(job.priority, app.conf.broker_url),
        countdown=countdown,
        reply_to=reply_to,
        ignore_result=not keeps_result(job),
        time_limit=hard,
        soft_time_limit=hard * 0.8,
        retry=True,
        retry_policy=PUBLISH_RETRY,
    )


def publish_notify(app: Celery, delivery_ids: list[str]) -> None:
    """Send webhook deliveries (rows of models.delivery.notify) to the notification pool."""
    for delivery_id in delivery_ids:
        app.send_task(
            "whisperq.notify",
            args=[delivery_id],
            queue=NOTIFY_QUEUE,
            ignore_result=True,
            priority=broker_priority("normal", app.conf.broker_url),
            retry=True,
            retry_policy=PUBLISH_RETRY,
        )


class CeleryBroker:
    """models.runtime.Broker through a Celery app (the process's, or one given)."""

    def __init__(self, app: Celery | None = None):
        self._app = app

    @property
    def app(self) -> Celery:
        if self._app is None:
            from tasks.app import get_celery

            return get_celery()
        return self._app

    @property
    def transport(self) -> Transport:
        return transport_for(self.app)

    def publish_job(self, job, countdown: float | None = None, reply_to: str | None = None) -> None:
        publish_transcribe(self.app, job, countdown=countdown, reply_to=reply_to)

    def publish_notify(self, delivery_ids: list[str]) -> None:
        publish_notify(self.app, delivery_ids)

    def publish_analyses(
        self, job_id: str, names: list[str], priority: str, audio_seconds: float | None = None
    ) -> None:
        publish_analyses(self.app, job_id, names, priority, audio_seconds)

    def forget_result(self, job_id: str) -> None:
        self.app.AsyncResult(job_id).forget()

    def inference(self, message: dict, model: str | None, tier: str, keep: bool, reply_to: str | None):
        """The hand-off of a prepared job to its model's inference queue, at its tier: the
        signature the preparation task replaces itself with (so a transcribe.delay() caller's
        r.get() waits for the transcript)."""
        settings: Settings = self.app.conf.whisperq_settings
        return self.app.signature(
            "whisperq.infer",
            args=(message,),
            queue=route(self.app.conf.broker_url, inference_queue(settings, model), tier),
            priority=broker_priority(tier, self.app.conf.broker_url),
            reply_to=reply_to,
            ignore_result=not keep,
        )

    def publish_shadow(self, message: dict, model: str | None) -> None:
        """A job's copy for a candidate model, to that model's queue at low priority."""
        settings: Settings = self.app.conf.whisperq_settings
        self.app.send_task(
            "whisperq.shadow",
            args=[message],
            queue=route(self.app.conf.broker_url, inference_queue(settings, model), "low"),
            priority=broker_priority("low", self.app.conf.broker_url),
            ignore_result=True,
            retry=True,
            retry_policy=PUBLISH_RETRY,
        )


def still_lost(transport: Transport, ids: set[str], pause: float = 2.0) -> set[str]:
    """A second look at jobs whose messages were neither waiting nor held: one that was
    on its way between a queue and a worker the first time is one place or the other now."""
    time.sleep(pause)
    waiting = transport.waiting() or set()
    held = set().union(*transport.holdings().values())
    return {job_id for job_id in ids if job_id not in waiting and job_id not in held}


def run_sweep(app, grace: timedelta | None = None, rt=None):
    """One sweeper pass against the live broker and workers (see models.jobs.sweeper), on
    this process's runtime unless given another (one deployment's, among several)."""
    from models.delivery.notify import overdue
    from models.jobs.sweeper import sweep
    from tasks.app import runtime

    rt = rt or runtime()
    broker = CeleryBroker(app)
    transport = broker.transport
    waiting = transport.waiting()  # read before holdings: messages move from queues to workers
    report = sweep(
        rt,
        transport.holdings(),
        broker,
        grace=grace,
        waiting=waiting,
        confirm=lambda ids: still_lost(transport, ids),
    )
    # Webhook deliveries whose message was lost (or never sent): send them now.
    late = overdue(rt)
    broker.publish_notify(late)
    report.notifications_resent = len(late)
    report.dead.extend(transport.reconcile(rt))
    return report


def publish_analyses(
    app: Celery, job_id: str, names: list[str], priority: str, audio_seconds: float | None = None
) -> None:
    """Send a job's analyses (models.jobs.analyses) to the analysis pool, one message each, at
    the job's priority; the message id is the job's and the analysis's, so it is told apart.
    The analysis pool runs prefork, where Celery enforces time limits: they grow with the
    audio's length, as every pool's do (an analysis past its soft limit fails and is retried
    as any failure; past its hard limit its process is killed and the message redelivered)."""
    hard = app.conf.whisperq_settings.analysis_time_limit(audio_seconds)
    for name in names:
        app.send_task(
            "whisperq.analyze",
            args=[job_id, name],
            task_id=f"{job_id}.{name}",
            queue=route(app.conf.broker_url, ANALYSIS_QUEUE, priority),
            ignore_result=True,
            time_limit=hard,
            soft_time_limit=hard * 0.8,
            priority=broker_priority(priority, app.conf.broker_url),
            retry=True,
            retry_policy=PUBLISH_RETRY,
        )
