"""Celery configuration: queues, routes, priorities and delivery settings, from Settings.

Priority numbers mean opposite things on the two brokers: on Redis 0 is the highest and an
unset priority counts as 0, on RabbitMQ the highest number wins. Callers speak in tiers
(`high`, `normal`, `low`) and :func:`broker_priority` turns a tier into the broker's number.

SQS has no message priorities: there each job queue is three queues, one per tier
(:func:`tier_queue`: `whisperq.prepare:high`, `whisperq.prepare`, `whisperq.prepare:low`),
a message goes to its tier's (:func:`route`), and a worker asks them highest first
(models.compat's SQS channel). A received message is hidden for a short visibility timeout
(WHISPERQ_SQS_VISIBILITY_TIMEOUT) that its worker extends while it lives (models.compat's
heartbeat); tasks.broker.sqs declares the queues, with the dead-letter queue.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable
from typing import Any

from kombu import Exchange, Queue

from .env import ConfigError
from .priorities import AMQP_MAX_PRIORITY, PRIORITIES, REDIS_PRIORITY_STEPS, Priority
from .settings import Settings

EXCHANGE = "whisperq"
# One queue per pool, so each pool scales on its own: preparation is CPU-bound (decode,
# resample, split), inference wants the accelerator, notification is I/O.
PREPARE_QUEUE = "whisperq.prepare"
INFERENCE_QUEUE = "whisperq.inference"
NOTIFY_QUEUE = "whisperq.notify"
# After the transcript: speakers, redaction (models.analysis), each its own task, on its own pool.
ANALYSIS_QUEUE = "whisperq.analysis"
QUEUES = {PREPARE_QUEUE: "prepare", INFERENCE_QUEUE: "inference", NOTIFY_QUEUE: "notify", ANALYSIS_QUEUE: "analysis"}
# RabbitMQ: a message rejected for good (a job out of attempts) goes to this exchange and
# waits in this queue for an operator, beside the job's row in the dead-letter store.
DEAD_LETTER_EXCHANGE = "whisperq.dead"
DEAD_LETTER_QUEUE = "whisperq.dead"
# SQS: a tier's queue is the pool's queue and this separator and the tier (normal's is the pool's
# queue itself, so a producer that knows no tiers lands in normal). No model name has a colon.
TIER_SEP = ":"
# SQS's own limits: a message hidden at most 12 hours from its receipt (however often its
# visibility is extended), a queue name of at most 80 characters.
SQS_MAX_VISIBILITY = 43200
SQS_NAME_MAX = 80
# A webhook's next attempt waits up to an hour in the notify worker (models.retry's
# WEBHOOK_BACKOFF_CAP_SECONDS; config imports nothing of models, a test keeps them equal).
WEBHOOK_BACKOFF_CAP = 3600.0
# kombu's SQS names: a dot becomes a hyphen, other punctuation but - and _ an underscore
# (kombu.transport.SQS's CHARS_REPLACE_TABLE; tests/test_sqs.py checks they agree).
_SQS_CHARS = {ord(c): "_" for c in string.punctuation if c not in "-_."} | {ord("."): "-"}
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
    """The pool a queue feeds: prepare, inference (a model's queue too) or notify; a tier's
    queue on SQS feeds its queue's pool."""
    queue = base_queue(queue)
    return QUEUES.get(queue) or (QUEUES[INFERENCE_QUEUE] if queue.startswith(INFERENCE_QUEUE + ".") else queue)


def models_of(settings: Settings, queues: Iterable[str]) -> list[str]:
    """The models a worker consuming `queues` serves."""
    return sorted(
        {
            settings.default_model if q == INFERENCE_QUEUE else q[len(INFERENCE_QUEUE) + 1 :]
            for q in map(base_queue, queues)
            if pool_of(q) == QUEUES[INFERENCE_QUEUE]
        }
    )


def is_redis(broker_url: str) -> bool:
    return broker_url.split("://", 1)[0].lower() in ("redis", "rediss", "redis+socket")


def is_sqs(broker_url: str) -> bool:
    return broker_url.split("://", 1)[0].lower() == "sqs"


def tiered(queue: str) -> bool:
    """Whether a queue is split by tier on SQS: the job queues (prepare, inference); the notify
    queue's deliveries have no priority."""
    return pool_of(queue) != QUEUES[NOTIFY_QUEUE]


def tier_queue(queue: str, tier: str) -> str:
    """On SQS, the queue of `queue`'s messages of this tier: QUEUE:high, QUEUE (normal) or QUEUE:low."""
    priority = Priority.parse(tier)
    return queue if priority is Priority.NORMAL or not tiered(queue) else f"{queue}{TIER_SEP}{priority.value}"


def tier_queues(queue: str) -> list[str]:
    """The queues a worker consuming `queue` asks on SQS, highest tier first."""
    return list(dict.fromkeys(tier_queue(queue, tier) for tier in PRIORITIES))


def base_queue(queue: str) -> str:
    """The pool's queue of a tier's queue (itself for any other)."""
    name, sep, tier = queue.rpartition(TIER_SEP)
    return name if sep and tier in PRIORITIES else queue


def consumed_in_order(queues: Iterable[str]) -> list[str]:
    """On SQS, what a worker told to consume `queues` asks, in order: every queue's high tier,
    then every normal, then every low (a tier's queue named outright stays where it is)."""
    given = list(dict.fromkeys(queues))
    out: list[str] = []
    for rank in range(len(PRIORITIES)):
        for queue in given:
            tiers = tier_queues(queue) if base_queue(queue) == queue else [queue]
            if rank < len(tiers):
                out.append(tiers[rank])
    return list(dict.fromkeys(out))


def route(broker_url: str, queue: str, tier: str) -> str:
    """The queue a message of this tier is published to: `queue`, or on SQS its tier's queue."""
    return tier_queue(queue, tier) if is_sqs(broker_url) else queue


def tier_of_number(number: int | None) -> str:
    """The tier of a message priority that broker_priority gave on RabbitMQ or SQS (9, 5, 1)."""
    if number is None:
        return Priority.NORMAL.value
    return min(Priority, key=lambda p: abs(p.amqp_number - number)).value


def sqs_name(settings: Settings, queue: str) -> str:
    """A queue's name in SQS, as kombu's SQS transport makes it: the deployment's
    WHISPERQ_SQS_QUEUE_PREFIX and the queue, a dot as a hyphen, a colon as an underscore."""
    return (settings.sqs_queue_prefix + queue).translate(_SQS_CHARS)


def sqs_queues(settings: Settings) -> dict[str, str]:
    """Every queue of the service on SQS, name -> routing key: each job queue's three tiers and
    the notify queue (the dead-letter queue, DEAD_LETTER_QUEUE, is tasks.broker.sqs's)."""
    out: dict[str, str] = {}
    for queue, key in queues_for(settings).items():
        for name in tier_queues(queue):
            out[name] = key + name[len(queue) :]
    return out


def sqs_hard_limit(settings: Settings, pool: str) -> float:
    """The longest one message of a pool can be held by its worker before it is acknowledged."""
    if pool == QUEUES[PREPARE_QUEUE]:
        return settings.prepare_time_limit(None)
    if pool == QUEUES[INFERENCE_QUEUE]:
        return settings.time_limit(None)
    if pool == QUEUES[ANALYSIS_QUEUE]:
        return settings.analysis_time_limit(None)
    return settings.webhook_timeout_seconds + WEBHOOK_BACKOFF_CAP


def sqs_visibility_timeout(settings: Settings) -> int:
    """Seconds a received message stays hidden before SQS hands it to another worker, unless
    its worker extends it (WHISPERQ_SQS_VISIBILITY_TIMEOUT): a live worker extends what it
    holds every third of it (models.compat's SQS channel), so a job runs as long as it needs,
    and a killed worker's job is handed out again within this many seconds."""
    return settings.sqs_visibility_timeout


def sqs_heartbeat(settings: Settings) -> float:
    """How often a worker extends the visibility of the messages it holds: a third of the
    timeout, so two heartbeats may be late before a message shows again."""
    return settings.sqs_visibility_timeout / 3


def sqs_max_receives(settings: Settings) -> int:
    """The redrive policy's maxReceiveCount: one receive more than a job's attempts, so that a
    job whose workers keep dying is dead-lettered by its worker (the database's dead letters,
    with its error) before SQS would move its message on its own."""
    return settings.max_attempts + 1


def check_sqs(settings: Settings) -> None:
    """What SQS cannot hold, said at start: a message held longer than 12 hours from its
    receipt (a pool's hard time limit, the longest wait for a countdown, and one visibility
    timeout), a name longer than 80 characters."""
    wait = max(settings.retry_max_seconds, settings.claim_lease_seconds) + settings.sqs_visibility_timeout
    for pool in (QUEUES[INFERENCE_QUEUE], QUEUES[ANALYSIS_QUEUE], QUEUES[PREPARE_QUEUE], QUEUES[NOTIFY_QUEUE]):
        seconds = math.ceil(sqs_hard_limit(settings, pool) + wait)
        if seconds > SQS_MAX_VISIBILITY:
            longest = (SQS_MAX_VISIBILITY - wait - settings.time_limit(0)) / 2
            raise ConfigError(
                f"on SQS a received message can be held for at most {SQS_MAX_VISIBILITY} s, and the {pool} pool "
                f"may hold one {seconds} s (its hard time limit for WHISPERQ_MAX_AUDIO_SECONDS="
                f"{settings.max_audio_seconds:g} and the waits before it runs): lower WHISPERQ_MAX_AUDIO_SECONDS to "
                f"at most {max(1, int(longest))}"
            )
    for queue in [*sqs_queues(settings), DEAD_LETTER_QUEUE]:
        name = sqs_name(settings, queue)
        if len(name) > SQS_NAME_MAX:
            raise ConfigError(
                f"the SQS queue {name} is {len(name)} characters, and SQS allows {SQS_NAME_MAX}: shorten "
                "WHISPERQ_SQS_QUEUE_PREFIX or the model's name in WHISPERQ_MODELS"
            )


def sqs_router(name: str, args: Any, kwargs: Any, options: dict[str, Any], task: Any = None, **_kw: Any) -> Any:
    """Celery router on SQS: a task sent without a queue (transcribe.delay(), beat's) goes to
    its route's queue for its priority's tier. An explicit queue is the caller's (route())."""
    queue = ROUTES.get(name)
    if queue is None:
        return None
    return {"queue": tier_queue(queue, tier_of_number(options.get("priority")))}


def broker_priority(tier: str, broker_url: str) -> int:
    """The broker's message priority for a tier (`high`, `normal` or `low`)."""
    return Priority.parse(tier).broker_number(redis=is_redis(broker_url))


def visibility_timeout(settings: Settings) -> int:
    """Seconds Redis waits before handing an unacked message out again.

    It must exceed the longest job's hard time limit plus its wait in a worker's prefetch
    buffer, or a long job is delivered twice while it still runs.
    """
    return int(settings.time_limit(settings.max_audio_seconds) + 3600)


# Each task's queue where its caller names none (tier_queue splits it by tier on SQS).
ROUTES = {
    "whisperq.transcribe": PREPARE_QUEUE,
    "whisperq.infer": INFERENCE_QUEUE,
    "whisperq.shadow": INFERENCE_QUEUE,
    "whisperq.sweep": PREPARE_QUEUE,
    "whisperq.retention": PREPARE_QUEUE,
    "whisperq.notify": NOTIFY_QUEUE,
    "whisperq.analyze": ANALYSIS_QUEUE,
}


def sqs_transport_options(settings: Settings) -> dict[str, Any]:
    """kombu's SQS transport options. No region or endpoint: boto3 reads AWS_DEFAULT_REGION
    and AWS_ENDPOINT_URL_SQS / AWS_ENDPOINT_URL itself (for both of kombu's clients)."""
    return {
        "queue_name_prefix": settings.sqs_queue_prefix,
        "wait_time_seconds": settings.sqs_wait_seconds,
        # what a queue kombu makes before tasks.broker.sqs declares it gets, and what kombu's
        # receives ask for; models.compat's channel extends what a worker holds every third of it
        "visibility_timeout": sqs_visibility_timeout(settings),
        "whisperq_heartbeat": sqs_heartbeat(settings),
        # how often a worker with no free slot looks again (no request to SQS)
        "polling_interval": 0.2,
        # models.compat's channel moves a message rejected for good here
        "whisperq_dead_letter_queue": DEAD_LETTER_QUEUE,
    }


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery's settings (app.config_from_object): values of every kind, by setting name."""
    broker = settings.celery_broker_url()
    redis = is_redis(broker)
    sqs = is_sqs(broker)
    if sqs:
        check_sqs(settings)
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
        for name, key in (sqs_queues(settings) if sqs else queues_for(settings)).items()
    )
    transport_options: dict[str, Any] = {}
    if sqs:
        transport_options.update(sqs_transport_options(settings))
    elif redis:
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
        task_routes=(sqs_router,)
        if sqs
        else {name: {"queue": queue, "routing_key": QUEUES[queue]} for name, queue in ROUTES.items()},
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
        # Events feed Flower; SQS carries no broadcast (no topic or fanout exchange), so there
        # they would go nowhere (docs/deployment/sqs.md).
        task_send_sent_event=not sqs,
        worker_send_task_events=not sqs,
        # No task's arguments in the result backend (nor its STARTED state): a producer's message
        # may carry its API key, which must be stored nowhere (tasks.worker hides it from events).
        result_extended=False,
        # transcribe.delay() results: no longer than transcripts are kept (WHISPERQ_RESULT_RETENTION).
        result_expires=int(min(settings.result_retention_seconds or 7 * 24 * 3600, 7 * 24 * 3600)),
        worker_max_memory_per_child=None,
        timezone="UTC",
        enable_utc=True,
    )
