"""What differs from one broker to another, in one class per broker: `transport_for(app)` gives
the Celery app's (tasks.broker.redis, .amqp, .sqs). Everything else in the product asks it:
the web's /metrics and /readyz, `whisperq status`, the sweeper, the worker as it starts.

A transport answers:
- `ping()`: the broker answers (readiness);
- `depths()`: messages waiting per queue and tier, as the broker counts them;
- `waiting()`: the job ids whose messages wait in a queue, where the broker can list them
  without taking them (Redis); None where it cannot (RabbitMQ, SQS);
- `holdings()`: each live worker's held job ids, by the broker's broadcast; {} where there is
  none (SQS);
- `declare()`: what the broker needs before a worker consumes (RabbitMQ's dead-letter
  exchange, SQS's queues with their attributes and redrive policy);
- `consumed(queues)`: the queues a worker told `--queues` asks, in order (SQS: each tier);
- `reconcile(rt)`: the broker's own dead letters kept in step with the database's (SQS);
- `celery_transport()`: kombu's transport class to use (SQS: models.compat's channel), and
  `patch()`: kombu's fixes this broker needs in a worker (Redis: acks on a closed channel).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery import Celery

    from models.runtime import Runtime

log = logging.getLogger(__name__)


class Transport:
    """A broker as the product uses it; the base is what holds for every broker."""

    name = "broker"

    def __init__(self, app: Celery):
        self.app = app

    @property
    def settings(self) -> Any:
        return self.app.conf.whisperq_settings

    def ping(self, timeout: float = 3.0) -> None:
        """Raise unless the broker answers within about `timeout` seconds."""
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)

    def depths(self) -> dict[tuple[str, str], int]:
        raise NotImplementedError

    def waiting(self) -> set[str] | None:
        return None

    def holdings(self, timeout: float = 2.0) -> dict[str, set[str]]:
        """Worker id -> the job ids it holds, for every worker that answers now."""
        # A fresh connection each time: a pooled one may be stale after a broker restart.
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3, interval_start=0.5, interval_step=0.5)
            replies = self.app.control.broadcast("whisperq_holdings", reply=True, timeout=timeout, connection=conn)
        out: dict[str, set[str]] = {}
        for reply in replies or []:
            for value in reply.values():
                if isinstance(value, dict) and value.get("worker_id"):
                    out[value["worker_id"]] = set(value.get("held") or ())
        return out

    def declare(self) -> None:
        """Nothing to declare: kombu declares the queues as it uses them."""

    def consumed(self, queues: list[str]) -> list[str]:
        return queues

    def reconcile(self, rt: Runtime) -> list[str]:
        """Jobs the broker dead-lettered by itself, now dead letters in the database too."""
        return []

    @classmethod
    def celery_transport(cls) -> type | None:
        """kombu's transport class for Celery's `broker_transport`, where it is not kombu's own."""
        return None

    def patch(self) -> None:
        """kombu's fixes this broker needs in a worker process (models.compat)."""


def transport_class(broker_url: str) -> type[Transport]:
    from config.celeryconfig import is_redis, is_sqs

    if is_sqs(broker_url):
        from .sqs import SqsTransport

        return SqsTransport
    if is_redis(broker_url):
        from .redis import RedisTransport

        return RedisTransport
    from .amqp import AmqpTransport

    return AmqpTransport


def transport_for(app: Celery) -> Transport:
    """The transport of a Celery app's broker."""
    return transport_class(app.conf.broker_url)(app)
