"""Celery configuration: queues, routes, priorities and delivery settings, from Settings.

Priority numbers mean opposite things on the two brokers: on Redis 0 is the highest and an
unset priority counts as 0, on RabbitMQ the highest number wins. Callers speak in tiers
(`high`, `normal`, `low`) and :func:`broker_priority` turns a tier into the broker's number.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from .priorities import AMQP_MAX_PRIORITY, REDIS_PRIORITY_STEPS, Priority
from .settings import Settings

EXCHANGE = "whisperq"
# One queue per pool, so each pool scales on its own: preparation is CPU-bound (decode,
# resample, split), inference wants the accelerator, notification is I/O.
PREPARE_QUEUE = "whisperq.prepare"
INFERENCE_QUEUE = "whisperq.inference"
NOTIFY_QUEUE = "whisperq.notify"
QUEUES = {PREPARE_QUEUE: "prepare", INFERENCE_QUEUE: "inference", NOTIFY_QUEUE: "notify"}
# RabbitMQ: a message rejected for good (a job out of attempts) goes to this exchange and
# waits in this queue for an operator, beside the job's row in the dead-letter store.
DEAD_LETTER_EXCHANGE = "whisperq.dead"
DEAD_LETTER_QUEUE = "whisperq.dead"
# Publishing while the broker blinks: a few quick tries, then BrokerUnavailable (503) for the
# caller. Retrying a failed job is another matter: models.retry.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 1.0}


def inference_queue(settings: Settings, model: str | None = None) -> str:
    """The inference queue of a model: the default model's is whisperq.inference, another's
    whisperq.inference.NAME (an inference pool consumes the queues of the models it serves)."""
    name = model or settings.default_model
    return INFERENCE_QUEUE if name == settings.default_model else f"{INFERENCE_QUEUE}.{name}"


def queues_for(settings: Settings) -> dict[str, str]:
    """Every queue of the service, name -> routing key: the pools' and one per extra model."""
    out = dict(QUEUES)
    for spec in settings.models:
        if spec.name != settings.default_model:
            out[inference_queue(settings, spec.name)] = f"{QUEUES[INFERENCE_QUEUE]}.{spec.name}"
    return out


def pool_of(queue: str) -> str:
    """The pool a queue feeds: prepare, inference (a model's queue too) or notify."""
    return QUEUES.get(queue) or (QUEUES[INFERENCE_QUEUE] if queue.startswith(INFERENCE_QUEUE + ".") else queue)


def models_of(settings: Settings, queues: Iterable[str]) -> list[str]:
    """The models a worker consuming `queues` serves."""
    return sorted(
        settings.default_model if q == INFERENCE_QUEUE else q[len(INFERENCE_QUEUE) + 1 :]
        for q in queues
        if pool_of(q) == QUEUES[INFERENCE_QUEUE]
    )


def is_redis(broker_url: str) -> bool:
    return broker_url.split("://", 1)[0].lower() in ("redis", "rediss", "redis+socket")


def broker_priority(tier: str, broker_url: str) -> int:
    """The broker's message priority for a tier (`high`, `normal` or `low`)."""
    return Priority.parse(tier).broker_number(redis=is_redis(broker_url))


def visibility_timeout(settings: Settings) -> int:
    """Seconds Redis waits before handing an unacked message out again.

    It must exceed the longest job's hard time limit plus its wait in a worker's prefetch
    buffer, or a long job is delivered twice while it still runs.
    """
    return int(settings.time_limit(settings.max_audio_seconds) + 3600)


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery's settings (app.config_from_object): values of every kind, by setting name."""
    broker = settings.celery_broker_url()
    redis = is_redis(broker)
    # kombu ships py.typed but leaves Exchange, Queue and their methods unannotated.
    exchange = Exchange(EXCHANGE, type="direct", durable=True)  # type: ignore[no-untyped-call]
    queues = tuple(
        Queue(  # type: ignore[no-untyped-call]
            name,
            exchange,
            routing_key=key,
            durable=True,
            queue_arguments={"x-max-priority": AMQP_MAX_PRIORITY, "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE},
        )
        for name, key in queues_for(settings).items()
    )
    transport_options: dict[str, Any] = {}
    if redis:
        transport_options.update(
            visibility_timeout=visibility_timeout(settings),
            queue_order_strategy="priority",
            priority_steps=REDIS_PRIORITY_STEPS,
            sep=":",
        )
    else:
        transport_options.update(confirm_publish=True)
    return dict(
        broker_url=broker,
        result_backend=settings.celery_result_backend(),
        broker_transport_options=transport_options,
        result_backend_transport_options=dict(transport_options) if redis else {},
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=10,
        broker_connection_timeout=5,
        # JSON only: messages carry ids and references, never audio or pickled objects.
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        # At-least-once: ack after the work is stored; a killed worker's job is redelivered.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # After a broker restart Celery lowers the prefetch count by the tasks still
        # running and raises it as they ack; a threads-pool worker's tasks cannot ack on
        # the new connection, and it was seen to stop consuming for good. Keep the count.
        worker_enable_prefetch_count_reduction=False,
        task_queues=queues,
        task_default_queue=PREPARE_QUEUE,
        task_default_exchange=EXCHANGE,
        task_default_routing_key=QUEUES[PREPARE_QUEUE],
        task_routes={
            "whisperq.transcribe": {"queue": PREPARE_QUEUE, "routing_key": QUEUES[PREPARE_QUEUE]},
            "whisperq.infer": {"queue": INFERENCE_QUEUE, "routing_key": QUEUES[INFERENCE_QUEUE]},
            "whisperq.shadow": {"queue": INFERENCE_QUEUE, "routing_key": QUEUES[INFERENCE_QUEUE]},
            "whisperq.sweep": {"queue": PREPARE_QUEUE, "routing_key": QUEUES[PREPARE_QUEUE]},
            "whisperq.retention": {"queue": PREPARE_QUEUE, "routing_key": QUEUES[PREPARE_QUEUE]},
            "whisperq.notify": {"queue": NOTIFY_QUEUE, "routing_key": QUEUES[NOTIFY_QUEUE]},
        },
        beat_schedule={
            "whisperq-sweep": {
                "task": "whisperq.sweep",
                "schedule": settings.sweep_interval_seconds,
                "options": {"expires": settings.sweep_interval_seconds, "priority": broker_priority("high", broker)},
            },
            # Audio and transcripts past WHISPERQ_AUDIO_RETENTION / WHISPERQ_RESULT_RETENTION.
            "whisperq-retention": {
                "task": "whisperq.retention",
                "schedule": settings.retention_interval_seconds,
                "options": {
                    "expires": settings.retention_interval_seconds,
                    "priority": broker_priority("high", broker),
                },
            },
        },
        task_default_priority=broker_priority("normal", broker),
        task_queue_max_priority=AMQP_MAX_PRIORITY,
        task_track_started=True,
        task_send_sent_event=True,
        worker_send_task_events=True,
        result_extended=True,
        # transcribe.delay() results: no longer than transcripts are kept (WHISPERQ_RESULT_RETENTION).
        result_expires=int(min(settings.result_retention_seconds or 7 * 24 * 3600, 7 * 24 * 3600)),
        worker_max_memory_per_child=None,
        timezone="UTC",
        enable_utc=True,
    )


def declare_dead_letter_queue(app: Celery) -> None:
    """On RabbitMQ, make sure the dead-letter exchange and its queue exist."""
    if is_redis(app.conf.broker_url):
        return
    # kombu leaves Exchange, Queue and Queue.declare unannotated.
    exchange = Exchange(DEAD_LETTER_EXCHANGE, type="fanout", durable=True)  # type: ignore[no-untyped-call]
    queue = Queue(DEAD_LETTER_QUEUE, exchange, durable=True)  # type: ignore[no-untyped-call]
    with app.connection_for_write() as conn:
        queue(conn.default_channel).declare()  # type: ignore[no-untyped-call]
