"""Worker entry point: `celery -A tasks.worker worker` (and `beat`, `flower`)."""

import logging
import os
import uuid

from celery.signals import task_prerun, task_received, worker_init, worker_process_init, worker_ready, worker_shutdown
from celery.worker import state as worker_state
from celery.worker.control import control_command, inspect_command

from config.logs import connect_celery
from config.tracing import init_worker
from models import compat
from models.pipeline.inference import batcher_stats
from models.runtime import reset_runtime
from tasks import metrics as worker_metrics
from tasks.app import get_celery, runtime
from tasks.broker.transport import transport_for

app = get_celery()  # Celery finds `app`: the one built from the environment
# Keyword arguments a message may carry that no event, log line or result may show.
SECRET_ARGUMENTS = ("api_key", "owner_token")

connect_celery(app.conf.whisperq_settings.log_format)


@worker_init.connect
def _identify(sender=None, **_kwargs) -> None:
    # A fresh id per worker start, inherited by prefork children: the sweeper tells a
    # job held by a live worker from one whose worker was killed and restarted.
    os.environ["WHISPERQ_WORKER_ID"] = f"{getattr(sender, 'hostname', 'worker')}/{uuid.uuid4().hex[:12]}"
    transport_for(app).patch()  # kombu's fixes for this broker (Redis: a consumer survives a restart)
    compat.check_versions()


@worker_init.connect
def _queues(sender=None, **_kwargs) -> None:
    # What the worker was told to consume (--queues whisperq.prepare), as its broker asks it:
    # on SQS, which has no priorities, each queue's tiers, highest first.
    queues = app.amqp.queues
    given = list(queues.consume_from or {})
    consumed = transport_for(app).consumed(given)
    if consumed != given:
        queues.select(consumed)
    # What the broker needs before messages are rejected for good or redriven: RabbitMQ's
    # dead-letter exchange, SQS's queues with their visibility timeout and redrive policy.
    try:
        transport_for(app).declare()
    except Exception:
        logging.getLogger(__name__).exception(
            "the broker's queues could not be declared (RabbitMQ: the dead-letter exchange; SQS: the queues' "
            "visibility timeout and redrive policy): check the credentials' permissions (docs/deployment/) "
            "and the broker"
        )


@worker_init.connect
def _tracing(sender=None, **_kwargs) -> None:
    # OpenTelemetry (only with OTEL_EXPORTER_OTLP_ENDPOINT) starts in the process that
    # runs the tasks: here for the threads pool, in each child for prefork (below).
    pool = getattr(sender, "pool_cls", None)
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    if "prefork" not in name and name != "processes":
        init_worker(_pool_name())


def _pool_name() -> str:
    return os.environ.get("WHISPERQ_WORKER_ID", "worker").split("@", 1)[0] or "worker"


@worker_ready.connect
def _ready(sender=None, **_kwargs) -> None:
    from config.celeryconfig import models_of
    from models.jobs.workers import start_heartbeat

    consumed = sorted(app.amqp.queues.consume_from or {})
    pool = worker_metrics.pool_name(app)
    slots = int(getattr(getattr(sender, "controller", None), "concurrency", 1) or 1)
    models = tuple(models_of(app.conf.whisperq_settings, consumed))
    worker_id = os.environ.get("WHISPERQ_WORKER_ID", sender.hostname)
    _heartbeat.update(id=worker_id, stop=start_heartbeat(runtime, worker_id, sender.hostname, pool, slots, models))
    if pool == "inference":
        from models.speech.engines import batch_size, parallel_batches, slots_needed

        settings = runtime().settings
        if slots < slots_needed(settings):  # the batches running, and the next one filling
            logging.getLogger(__name__).warning(
                "this inference worker holds %d jobs (its concurrency) for %d batches of %d windows at once: the model "
                "will wait for work while the next batch fills; give it %d slots (WHISPERQ_INFERENCE_SLOTS=%d)",
                slots,
                parallel_batches(settings),
                batch_size(settings),
                slots_needed(settings),
                slots_needed(settings),
            )


@worker_process_init.connect
def _fresh_connections(**_kwargs) -> None:
    # A forked child must not share the parent's database connections.
    reset_runtime()
    init_worker(_pool_name())


@task_prerun.connect
def _job_in_logs(task=None, task_id=None, args=None, **_kwargs) -> None:
    # One primary-key read per task, so that its log lines name the job and the attempt
    # (config.logs reads these off the request). whisperq retries by publishing again,
    # so Celery's own retry count stays 0: the job row has the attempt.
    if task is None or task.name not in ("whisperq.transcribe", "whisperq.infer", "whisperq.notify"):
        return
    from models.delivery.notify import WebhookDelivery
    from models.jobs.record import Job

    try:
        with runtime().db.session() as session:
            if task.name == "whisperq.notify":
                delivery = session.get(WebhookDelivery, args[0]) if args else None
                task.request.whisperq_job_id = delivery.job_id if delivery is not None else None
            else:
                job = session.get(Job, task_id)
                # transcribe counts its attempt when it claims the job, a moment from now
                attempts = (job.attempts or 0) if job is not None else 0
                task.request.whisperq_attempt = attempts + (task.name == "whisperq.transcribe") or 1
    except Exception:  # logging context must never stop a task
        logging.getLogger(__name__).debug("no log context for task %s", task_id, exc_info=True)


@task_received.connect
def _hidden(request=None, **_kwargs) -> None:
    # Before the task-received event (Flower) is sent: a producer's API key, and an owner token,
    # are shown nowhere, whatever the message's own argsrepr and kwargsrepr say.
    if request is not None:
        try:
            compat.hide_arguments(request, SECRET_ARGUMENTS)
        except Exception:  # what an event shows must never stop the consumer
            logging.getLogger(__name__).exception("could not hide the arguments of %s", request.id)


@task_received.connect
def _held(request=None, **_kwargs) -> None:
    # Runs in the consumer as a message is reserved, before the task starts.
    if request is None or request.name not in ("whisperq.transcribe", "whisperq.infer"):
        return
    from models.jobs.operations import mark_held

    try:
        mark_held(runtime(), request.id, os.environ.get("WHISPERQ_WORKER_ID"))
    except Exception:  # bookkeeping must never stop the consumer
        logging.getLogger(__name__).exception("could not record that job %s is held", request.id)


@inspect_command(name="batcher_stats")
def _batcher_stats(state, **_kwargs) -> dict:
    """`celery inspect batcher_stats`: batch sizes and waits of an inference worker."""
    return batcher_stats(runtime())


@control_command(name="whisperq_holdings")
def _holdings(state, **_kwargs) -> dict:
    """This worker's id and the task ids it holds: running, reserved, or waiting for
    their countdown. The sweeper puts back a job its worker claims but no longer holds."""
    held = {r.id for r in worker_state.reserved_requests} | {r.id for r in worker_state.active_requests}
    held |= {entry["request"]["id"] for entry in compat.scheduled_requests(state.consumer.timer)}
    return {"worker_id": os.environ.get("WHISPERQ_WORKER_ID"), "held": sorted(held)}


@worker_init.connect
def _metrics_setup(sender=None, **_kwargs) -> None:
    # Before the pool forks, so that prefork children inherit the multiprocess mode.
    try:
        worker_metrics.setup(sender)
    except Exception:  # metrics must never keep a worker from starting
        logging.getLogger(__name__).exception("worker metrics not set up")


@worker_ready.connect
def _metrics_serve(sender=None, **_kwargs) -> None:
    try:
        worker_metrics.serve(sender)
    except Exception:
        logging.getLogger(__name__).exception("worker metrics not served")


_heartbeat: dict = {}


@worker_shutdown.connect
def _heartbeat_gone(**_kwargs) -> None:
    # A worker that stops says so at once: until its heartbeat aged out, the door would still
    # take jobs for a model nobody serves any more.
    from models.jobs.workers import forget

    stop = _heartbeat.pop("stop", None)
    if stop is not None:
        stop.set()
        try:
            forget(runtime(), _heartbeat["id"])
        except Exception:  # the database may be away; the heartbeat ages out
            logging.getLogger(__name__).warning("heartbeat not withdrawn at shutdown", exc_info=True)


@worker_shutdown.connect
def _metrics_shutdown(**_kwargs) -> None:
    worker_metrics.shutdown()
