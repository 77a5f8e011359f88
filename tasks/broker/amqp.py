"""RabbitMQ: each queue with `x-max-priority` and a dead-letter exchange (config.celeryconfig);
a message rejected for good goes to `whisperq.dead`, declared here as a worker starts. A closed
channel's messages go back to their queue at once, and a queue cannot be listed without
consuming: the sweeper leaves redelivery to the broker (`waiting` is None)."""

from __future__ import annotations

import contextlib

from kombu import Exchange, Queue

from config.celeryconfig import DEAD_LETTER_EXCHANGE, DEAD_LETTER_QUEUE, queues_for

from .transport import Transport


class AmqpTransport(Transport):
    name = "amqp"

    def depths(self) -> dict[tuple[str, str], int]:
        """Each queue's count as RabbitMQ gives it (its priorities are one queue's): tier `all`."""
        depths: dict[tuple[str, str], int] = {}
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
            for queue in queues_for(self.settings):
                channel = conn.channel()  # a passive declare of a missing queue closes its channel
                try:
                    depths[(queue, "all")] = int(channel.queue_declare(queue=queue, passive=True).message_count)
                except Exception as exc:
                    if "NOT_FOUND" not in str(exc) and "404" not in str(exc):
                        raise
                    depths[(queue, "all")] = 0
                finally:
                    with contextlib.suppress(Exception):
                        channel.close()
        return depths

    def declare(self) -> None:
        """The dead-letter exchange and its queue, where rejected messages wait for an operator."""
        exchange = Exchange(DEAD_LETTER_EXCHANGE, type="fanout", durable=True)
        queue = Queue(DEAD_LETTER_QUEUE, exchange, durable=True)
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=10, interval_start=0.5, interval_step=0.5, interval_max=2)
            queue(conn.default_channel).declare()
