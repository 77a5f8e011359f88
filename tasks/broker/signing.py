"""What the service publishes is signed, and what a worker takes is checked before it is read.

Every message a process of this deployment publishes (the web, the workers, beat, the command
line, a `transcribe.delay()` caller with the deployment's settings) carries a signature over its
task's name and arguments (models.security.signing), added as it is published (Celery's
`before_task_publish`, whatever the path: a first publish, a hand-off, a retry, the sweeper's).

Where a worker takes one (`check`), before it reads anything of a job:
- a message of the service's own kind (infer, shadow, analyze, notify, sweep, retention)
  without a valid signature is dropped, counted (whisperq_messages_dropped_total) and logged
  without its payload;
- a task that is not one of the queues this worker consumes (an infer sent to the prepare
  queue) is dropped the same way;
- `whisperq.transcribe` may come unsigned: from a producer outside the service (a raw message,
  docs/producers.md), which may only create a new job (models.pipeline.preparation).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.exceptions import Ignore
from celery.signals import before_task_publish

from config.celeryconfig import QUEUES, ROUTES, pool_of
from models.jobs.metrics import observe_dropped
from models.security.signing import HEADER, sign, verify

log = logging.getLogger(__name__)

# The one task a producer outside the service may send, unsigned.
OPEN_TO_PRODUCERS = ("whisperq.transcribe",)


@before_task_publish.connect(weak=False)
def _sign(sender: Any = None, body: Any = None, headers: dict | None = None, **_kwargs: Any) -> None:
    if headers is None or not isinstance(body, (list, tuple)) or len(body) < 2:
        return
    task = headers.get("task") or sender
    if isinstance(task, str) and task.startswith("whisperq."):
        headers[HEADER] = sign(task, body[0], body[1])


def signature_problem(task: Task) -> str | None:
    """Why this delivery's signature does not hold for its task and arguments (None: it holds)."""
    request = task.request
    token = getattr(request, HEADER, None) or (getattr(request, "headers", None) or {}).get(HEADER)
    return verify(token, task.name, list(request.args or ()), dict(request.kwargs or {}))


def queue_problem(task: Task) -> str | None:
    """Why this worker must not run this task: its queue is none of the queues it consumes."""
    consumed = task.app.amqp.queues.consume_from or {}
    pools = {pool_of(name) for name in consumed} & set(QUEUES.values())
    if not pools:  # not a worker's task (called in process), or a queue of an operator's own naming
        return None
    wanted = pool_of(ROUTES[task.name]) if task.name in ROUTES else None
    if wanted is None or wanted in pools:
        return None
    return f"a task of the {wanted} pool taken by a worker of {', '.join(sorted(pools))}"


def check(task: Task) -> bool:
    """Drop the delivery (ack it, run nothing: Celery's Ignore) unless this worker may act on it;
    True where it is signed by this deployment, False where it is an unsigned
    `whisperq.transcribe` (a producer's: it may only create a job)."""
    wrong = queue_problem(task)
    if wrong is not None:
        drop(task, "wrong queue", wrong)
    unsigned = signature_problem(task)
    if unsigned is None:
        return True
    if task.name in OPEN_TO_PRODUCERS and unsigned == "unsigned":
        return False
    drop(task, "unsigned" if unsigned == "unsigned" else "bad signature", unsigned)
    return False  # not reached: drop raises


def drop(task: Task, reason: str, detail: str) -> None:
    """Count, log (never the payload) and drop this delivery."""
    log.warning("a %s message (id %s) was dropped unread: %s", task.name, str(task.request.id)[:64], detail)
    observe_dropped(task.name, reason)
    raise Ignore()
