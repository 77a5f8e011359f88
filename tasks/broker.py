"""The broker seam (models.runtime.Broker) over Celery: the one place where a job's message,
a webhook delivery's message and a result's removal are sent; and what the broker itself
holds, read directly: the sweeper needs to know whether a job's message still waits in a queue.

On Redis a queue is one list per priority step (``whisperq.prepare``, ``whisperq.prepare:3``,
...), and a message handed to a consumer moves to the ``unacked`` hash until it is acked.
When the broker restarts, a consumer's connection goes and so do the messages it had
reserved; they stay in ``unacked`` until `visibility_timeout` (hours) has passed. A job
whose message is in no queue list and held by no live worker is therefore stranded,
whatever ``unacked`` says. RabbitMQ returns a closed channel's messages to their queue
at once, and cannot be listed without consuming: there the answer is "unknown".

SQS is RabbitMQ's case for the sweeper: its queues cannot be listed without receiving, and
it hands a message out again by itself, once the message's visibility timeout has passed. It
carries no broadcast either, so workers cannot say what they hold (`holdings` is empty); its
dead-letter queue is kept in step with the database's dead letters (tasks.sqs.reconcile).
"""

from __future__ import annotations

import json
import logging
import time
from datetime import timedelta

from celery import Celery

from config import NOTIFY_QUEUE, PREPARE_QUEUE, Settings, broker_priority
from config.celeryconfig import ANALYSIS_QUEUE, PUBLISH_RETRY, is_redis, is_sqs, queues_for, route
from config.priorities import REDIS_PRIORITY_STEPS

log = logging.getLogger(__name__)

SCAN_CHUNK = 500


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

    def publish_job(self, job, countdown: float | None = None, reply_to: str | None = None) -> None:
        publish_transcribe(self.app, job, countdown=countdown, reply_to=reply_to)

    def publish_notify(self, delivery_ids: list[str]) -> None:
        publish_notify(self.app, delivery_ids)

    def publish_analyses(self, job_id: str, names: list[str], priority: str) -> None:
        publish_analyses(self.app, job_id, names, priority)

    def forget_result(self, job_id: str) -> None:
        self.app.AsyncResult(job_id).forget()


def redis_queue_keys(app, queue: str) -> list[str]:
    """The Redis lists that make up one queue, highest priority first."""
    sep = app.conf.broker_transport_options.get("sep", "\x06\x16")
    return [queue if step == 0 else f"{queue}{sep}{step}" for step in REDIS_PRIORITY_STEPS]


def waiting_in_broker(app) -> set[str] | None:
    """Task ids of the messages waiting in the service's queues, or None where the broker
    cannot say (RabbitMQ)."""
    if not is_redis(app.conf.broker_url):
        return None
    ids: set[str] = set()
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=3, interval_start=0.5, interval_step=0.5)
        client = conn.default_channel.client
        for queue in queues_for(app.conf.whisperq_settings):
            for key in redis_queue_keys(app, queue):
                start = 0
                while True:
                    chunk = client.lrange(key, start, start + SCAN_CHUNK - 1)
                    for raw in chunk:
                        try:
                            ids.add(json.loads(raw)["headers"]["id"])
                        except (ValueError, KeyError, TypeError):
                            log.warning("unreadable message in %s skipped by the sweeper", key)
                    if len(chunk) < SCAN_CHUNK:
                        break
                    start += SCAN_CHUNK
    return ids


def holdings(app, timeout: float = 2.0) -> dict[str, set[str]]:
    """Worker id -> the job ids it holds, for every worker that answers now (none on SQS,
    which carries no broadcast: workers cannot be asked)."""
    if is_sqs(app.conf.broker_url):
        return {}
    # A fresh connection each time: a pooled one may be stale after a broker restart.
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=3, interval_start=0.5, interval_step=0.5)
        replies = app.control.broadcast("whisperq_holdings", reply=True, timeout=timeout, connection=conn) or []
    out: dict[str, set[str]] = {}
    for reply in replies:
        for value in reply.values():
            if isinstance(value, dict) and value.get("worker_id"):
                out[value["worker_id"]] = set(value.get("held") or ())
    return out


def still_lost(app, ids: set[str], pause: float = 2.0) -> set[str]:
    """A second look at jobs whose messages were neither waiting nor held: one that was
    on its way between a queue and a worker the first time is one place or the other now."""
    time.sleep(pause)
    waiting = waiting_in_broker(app) or set()
    held = set().union(*holdings(app).values())
    return {job_id for job_id in ids if job_id not in waiting and job_id not in held}


def run_sweep(app, grace: timedelta | None = None, rt=None):
    """One sweeper pass against the live broker and workers (see models.jobs.sweeper), on
    this process's runtime unless given another (one deployment's, among several)."""
    from models.delivery.notify import overdue
    from models.jobs.sweeper import sweep
    from tasks.app import runtime

    rt = rt or runtime()
    waiting = waiting_in_broker(app)  # read before holdings: messages move from queues to workers
    broker = CeleryBroker(app)
    report = sweep(
        rt,
        holdings(app),
        broker,
        grace=grace,
        waiting=waiting,
        confirm=lambda ids: still_lost(app, ids),
    )
    # Webhook deliveries whose message was lost (or never sent): send them now.
    late = overdue(rt)
    broker.publish_notify(late)
    report.notifications_resent = len(late)
    if is_sqs(app.conf.broker_url):
        from tasks.sqs import reconcile

        report.dead.extend(reconcile(app, rt).recorded)
    return report


def publish_analyses(app: Celery, job_id: str, names: list[str], priority: str) -> None:
    """Send a job's analyses (models.jobs.analyses) to the analysis pool, one message each, at
    the job's priority; the message id is the job's and the analysis's, so it is told apart."""
    for name in names:
        app.send_task(
            "whisperq.analyze",
            args=[job_id, name],
            task_id=f"{job_id}.{name}",
            queue=route(app.conf.broker_url, ANALYSIS_QUEUE, priority),
            ignore_result=True,
            priority=broker_priority(priority, app.conf.broker_url),
            retry=True,
            retry_policy=PUBLISH_RETRY,
        )
