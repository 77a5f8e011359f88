"""SQS (CELERY_BROKER_URL=sqs://), through boto3: the service's queues declared with their
attributes, their depths read, and the dead-letter queue kept in step with the database's
(`SqsTransport`). SQS has no priorities (one queue per tier, asked highest first), no broadcast
(`holdings` is empty: workers cannot be asked), and hands a message out again by itself once
its visibility timeout passes (a live worker extends it: models.compat's channel).

kombu makes a queue the first time it publishes to or consumes from it, with the transport's
one visibility timeout and nothing else. A worker declares every queue of the service as it
starts (`declare`): the dead-letter queue `whisperq-dead` (messages kept 14 days, SQS's
longest), then each queue with the visibility timeout (config.celeryconfig.sqs_visibility_timeout,
which a live worker extends for what it holds) and a redrive policy to the dead-letter queue
after `sqs_max_receives` receives. Declaring again sets the attributes again, so a changed
setting reaches queues that already exist.

A message reaches the dead-letter queue two ways. A worker rejects a job out of attempts: the
database has the dead letter first, with its error and traceback, and models.compat's channel
moves the message, marked with the attribute `whisperq-rejected`. Or SQS moves a message
received maxReceiveCount times without being deleted: its workers died each time before they
could count an attempt, and the database knows nothing of it. Each sweeper pass (`reconcile`,
from tasks.broker.run_sweep) reads the queue: a job SQS moved that the database still has
waiting or running is dead-lettered there as well, and its message marked; a marked message
whose job is no longer among the database's dead letters (replayed, purged) is deleted.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from config.celeryconfig import (
    DEAD_LETTER_QUEUE,
    base_queue,
    sqs_max_receives,
    sqs_name,
    sqs_queues,
    sqs_visibility_timeout,
)
from config.priorities import Priority
from models.compat import SQS_REJECTED

from .transport import Transport

if TYPE_CHECKING:
    from celery import Celery

    from models.runtime import Runtime

log = logging.getLogger(__name__)

DEAD_RETENTION_SECONDS = 1_209_600  # 14 days: SQS's longest
# A scan of the dead-letter queue hides what it read for this long, so that it reads each
# message once; then they are visible again.
SCAN_VISIBILITY = 30
SCAN_LIMIT = 1000
JOB_TASKS = ("whisperq.transcribe", "whisperq.infer")  # their task id is the job id
_urls: dict[str, str] = {}
_lock = threading.Lock()


def client() -> Any:
    """An SQS client from AWS's own variables, as kombu makes its own (region us-east-1
    where none is configured, as kombu's)."""
    import boto3

    session = boto3.session.Session()
    return session.client("sqs", region_name=session.region_name or "us-east-1")


def _missing(exc: Exception) -> bool:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return code in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


def queue_url(sqs: Any, name: str) -> str | None:
    """A queue's URL by its SQS name, or None where there is no such queue."""
    from botocore.exceptions import ClientError

    with _lock:
        if name in _urls:
            return _urls[name]
    try:
        url: str = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    except ClientError as exc:
        if _missing(exc):
            return None
        raise
    with _lock:
        _urls[name] = url
    return url


def _ensure(sqs: Any, name: str, attributes: dict[str, str]) -> str:
    """The queue `name`, made where it is missing, with these attributes set."""
    from botocore.exceptions import ClientError

    url = queue_url(sqs, name)
    if url is None:
        try:
            url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        except ClientError as exc:  # another process made it meanwhile
            if exc.response.get("Error", {}).get("Code") not in ("QueueAlreadyExists", "QueueNameExists"):
                raise
            url = queue_url(sqs, name)
        assert url is not None
    sqs.set_queue_attributes(QueueUrl=url, Attributes=attributes)
    with _lock:
        _urls[name] = url
    return url


def declare(app: Celery) -> dict[str, str]:
    """Every queue of the service, with its attributes: queue name -> URL."""
    settings = app.conf.whisperq_settings
    sqs = client()
    dead = _ensure(sqs, sqs_name(settings, DEAD_LETTER_QUEUE), {"MessageRetentionPeriod": str(DEAD_RETENTION_SECONDS)})
    arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": str(sqs_max_receives(settings))})
    urls = {DEAD_LETTER_QUEUE: dead}
    visibility = sqs_visibility_timeout(settings)
    for queue in sqs_queues(settings):
        urls[queue] = _ensure(
            sqs, sqs_name(settings, queue), {"VisibilityTimeout": str(visibility), "RedrivePolicy": redrive}
        )
    log.info("SQS queues declared: %s", ", ".join(sqs_name(settings, q) for q in urls))
    return urls


def depths(app: Celery) -> dict[tuple[str, str], int]:
    """(queue, tier) -> messages waiting, as SQS estimates them (ApproximateNumberOfMessages:
    eventually consistent, and without the messages workers hold or that wait for a delay)."""
    settings = app.conf.whisperq_settings
    sqs = client()
    out: dict[tuple[str, str], int] = {}
    for queue in sqs_queues(settings):
        base = base_queue(queue)
        tier = queue[len(base) + 1 :] or Priority.NORMAL.value
        url = queue_url(sqs, sqs_name(settings, queue))
        count = 0
        if url is not None:
            attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
            count = int(attributes["Attributes"]["ApproximateNumberOfMessages"])
        out[(base, tier)] = out.get((base, tier), 0) + count
    return out


@dataclass(frozen=True)
class DeadMessage:
    """A message in the dead-letter queue, as far as whisperq reads it."""

    body: str
    receipt: str
    task: str | None
    job_id: str | None  # the task id of a job's task (JOB_TASKS), else None
    rejected_from: str | None  # the queue a worker rejected it from; None: SQS moved it (redrive)


def _payload(body: str) -> dict[str, Any]:
    """kombu's message from an SQS body (base64 of its JSON, or the JSON itself); {} if neither."""
    for text in (body, None):
        try:
            if text is None:
                text = base64.b64decode(body, validate=True).decode()
            data = json.loads(text)
        except (ValueError, binascii.Error, UnicodeDecodeError):
            continue
        if isinstance(data, dict):
            return data
    return {}


def dead_messages(app: Celery, sqs: Any = None) -> list[DeadMessage]:
    """The messages in the dead-letter queue (up to SCAN_LIMIT), each read once: a scan hides
    them for SCAN_VISIBILITY seconds."""
    settings = app.conf.whisperq_settings
    sqs = sqs or client()
    url = queue_url(sqs, sqs_name(settings, DEAD_LETTER_QUEUE))
    out: list[DeadMessage] = []
    seen: set[str] = set()
    while url is not None and len(out) < SCAN_LIMIT:
        # a long poll (of a second) asks every SQS server; a short one may miss a few messages
        batch = sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            VisibilityTimeout=SCAN_VISIBILITY,
            MessageAttributeNames=[SQS_REJECTED],
        ).get("Messages", [])
        fresh = [m for m in batch if m["MessageId"] not in seen]
        if not fresh:  # empty, or what this scan read is visible again
            break
        for message in fresh:
            seen.add(message["MessageId"])
            headers = _payload(message["Body"]).get("headers") or {}
            task = headers.get("task") if isinstance(headers, dict) else None
            job_id = headers.get("id") if task in JOB_TASKS else None
            rejected = (message.get("MessageAttributes") or {}).get(SQS_REJECTED, {}).get("StringValue")
            out.append(DeadMessage(message["Body"], message["ReceiptHandle"], task, job_id, rejected))
    return out


@dataclass
class Reconciled:
    recorded: list[str]  # jobs SQS dead-lettered, now dead letters in the database too
    deleted: list[str]  # messages of jobs no longer dead letters in the database (replayed, purged)


def reconcile(app: Celery, rt: Runtime) -> Reconciled:
    """One pass over the dead-letter queue, against the database's dead letters (see above)."""
    from models.jobs.deadletter import DeadLetter, move_to_dead_letters
    from models.jobs.record import Job

    settings = app.conf.whisperq_settings
    sqs = client()
    url = queue_url(sqs, sqs_name(settings, DEAD_LETTER_QUEUE))
    report = Reconciled([], [])
    for message in dead_messages(app, sqs):
        if message.job_id is None:
            continue  # a webhook's delivery: the outbox sends what is owed again (run_sweep)
        with rt.db.session() as session:
            job = session.get(Job, message.job_id)
            finished = job is None or job.state.finished
            dead = session.get(DeadLetter, message.job_id) is not None
        if message.rejected_from is None and not finished:
            move_to_dead_letters(
                rt,
                message.job_id,
                message.task or JOB_TASKS[0],
                f"its message was received {sqs_max_receives(settings)} times without a worker finishing it (the "
                "workers that took it were lost each time); SQS moved it to the dead-letter queue",
                None,
            )
            report.recorded.append(message.job_id)
            dead = True
        if message.rejected_from is None and dead:  # marked, so that a replay is not undone
            sqs.send_message(
                QueueUrl=url,
                MessageBody=message.body,
                MessageAttributes={SQS_REJECTED: {"DataType": "String", "StringValue": "redrive"}},
            )
        elif dead:
            continue  # a dead letter in both
        else:
            report.deleted.append(message.job_id)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message.receipt)
    if report.recorded or report.deleted:
        log.info(
            "SQS dead-letter queue: %d job(s) recorded as dead letters, %d message(s) of replayed or purged jobs "
            "deleted",
            len(report.recorded),
            len(report.deleted),
        )
    return report


class SqsTransport(Transport):
    name = "sqs"

    def depths(self) -> dict[tuple[str, str], int]:
        return depths(self.app)

    def holdings(self, timeout: float = 2.0) -> dict[str, set[str]]:
        return {}  # no broadcast: workers cannot be asked

    def declare(self) -> None:
        declare(self.app)

    def consumed(self, queues: list[str]) -> list[str]:
        from config.celeryconfig import consumed_in_order

        return consumed_in_order(queues)

    def reconcile(self, rt: Runtime) -> list[str]:
        return reconcile(self.app, rt).recorded

    @classmethod
    def celery_transport(cls) -> type | None:
        from models.compat import sqs_transport

        # kombu's SQS transport with the queues asked in order, held messages extended and
        # rejected messages kept (models.compat); the URL stays sqs://, so Celery and kombu
        # treat it as SQS
        return sqs_transport()
