"""Worker entry point: `celery -A tasks.worker worker` (and `beat`, `flower`)."""
import logging
import os
import uuid

from celery.signals import task_received, worker_init, worker_process_init, worker_ready
from celery.worker import state as worker_state
from celery.worker.control import _iter_schedule_requests, control_command, inspect_command

from models.inference import batcher_stats
from models.runtime import reset_runtime
from tasks import celery_app as app  # noqa: F401 - Celery finds `app`


def _guard_closed_redis_channels() -> None:
    """Keep a worker consuming after the Redis broker restarts.

    A task that finishes after the connection was lost acks through kombu's Redis QoS,
    whose channel has lost its connection by then: the AttributeError escapes kombu's
    error handling and stops the consumer for good (a threads-pool worker stays up and
    never takes another message). Such an ack is skipped here: the job's row is already
    final, and the broker still holds the message as unacknowledged; when it is handed
    out again the job is found done.
    """
    from kombu.transport import redis as kombu_redis

    def closed(qos) -> bool:
        transport = getattr(qos.channel, "connection", None)
        return transport is None or getattr(transport, "client", None) is None

    ack, restore = kombu_redis.QoS.ack, kombu_redis.QoS.restore_unacked

    def guarded_ack(self, delivery_tag):
        if closed(self):
            logging.getLogger(__name__).warning("ack of %s skipped: its broker connection is gone", delivery_tag)
            return None
        return ack(self, delivery_tag)

    def guarded_restore(self, client=None):
        if client is None and closed(self):
            return None
        return restore(self, client)

    kombu_redis.QoS.ack = guarded_ack
    kombu_redis.QoS.restore_unacked = guarded_restore


@worker_init.connect
def _identify(sender=None, **_kwargs) -> None:
    # A fresh id per worker start, inherited by prefork children: the sweeper tells a
    # job held by a live worker from one whose worker was killed and restarted.
    os.environ["WHISPERQ_WORKER_ID"] = f"{getattr(sender, 'hostname', 'worker')}/{uuid.uuid4().hex[:12]}"
    _guard_closed_redis_channels()


@worker_ready.connect
def _ready(sender=None, **_kwargs) -> None:
    from config.celeryconfig import QUEUES, declare_dead_letter_queue
    from models.runtime import get_runtime
    from models.workers import start_heartbeat

    declare_dead_letter_queue(app)
    consumed = sorted(app.amqp.queues.consume_from or {})
    pool = ",".join(QUEUES.get(name, name) for name in consumed) or "default"
    slots = int(getattr(getattr(sender, "controller", None), "concurrency", 1) or 1)
    start_heartbeat(get_runtime, os.environ.get("WHISPERQ_WORKER_ID", sender.hostname), sender.hostname, pool, slots)


@worker_process_init.connect
def _fresh_connections(**_kwargs) -> None:
    # A forked child must not share the parent's database connections.
    reset_runtime()


@task_received.connect
def _held(request=None, **_kwargs) -> None:
    # Runs in the consumer as a message is reserved, before the task starts.
    if request is None or request.name not in ("whisperq.transcribe", "whisperq.infer"):
        return
    from models.jobs import mark_held
    from models.runtime import get_runtime

    try:
        mark_held(get_runtime(), request.id, os.environ.get("WHISPERQ_WORKER_ID"))
    except Exception:  # bookkeeping must never stop the consumer
        logging.getLogger(__name__).exception("could not record that job %s is held", request.id)


@inspect_command(name="batcher_stats")
def _batcher_stats(state, **_kwargs) -> dict:
    """`celery inspect batcher_stats`: batch sizes and waits of an inference worker."""
    return batcher_stats()


@control_command(name="whisperq_holdings")
def _holdings(state, **_kwargs) -> dict:
    """This worker's id and the task ids it holds: running, reserved, or waiting for
    their countdown. The sweeper puts back a job its worker claims but no longer holds."""
    held = {r.id for r in worker_state.reserved_requests} | {r.id for r in worker_state.active_requests}
    held |= {entry["request"]["id"] for entry in _iter_schedule_requests(state.consumer.timer)}
    return {"worker_id": os.environ.get("WHISPERQ_WORKER_ID"), "held": sorted(held)}
