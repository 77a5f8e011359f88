"""Redis (and the embedded broker): a queue is one list per priority step (``whisperq.prepare``,
``whisperq.prepare:3``, ...), and a message handed to a consumer moves to the ``unacked`` hash
until it is acked. When the broker restarts, a consumer's connection goes and so do the
messages it had reserved; they stay in ``unacked`` until `visibility_timeout` (hours) has
passed. So the sweeper reads the lists themselves (`waiting`): a job whose message is in no
list and held by no live worker is stranded, whatever ``unacked`` says."""

from __future__ import annotations

import json
import logging

from config.celeryconfig import queues_for
from config.priorities import REDIS_PRIORITY_STEPS, Priority

from .transport import Transport

log = logging.getLogger(__name__)

SCAN_CHUNK = 500
# Redis priority step -> tier: the tier with the largest step at or below it (step 9, which
# no tier uses, counts as low).
STEP_TIERS = {
    step: max((p for p in Priority if p.redis_step <= step), key=lambda p: p.redis_step).value
    for step in REDIS_PRIORITY_STEPS
}


def redis_queue_keys(app, queue: str) -> list[str]:
    """The Redis lists that make up one queue, highest priority first."""
    sep = app.conf.broker_transport_options.get("sep", "\x06\x16")
    return [queue if step == 0 else f"{queue}{sep}{step}" for step in REDIS_PRIORITY_STEPS]


class RedisTransport(Transport):
    name = "redis"

    def depths(self) -> dict[tuple[str, str], int]:
        depths: dict[tuple[str, str], int] = {}
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
            pipe = conn.default_channel.client.pipeline(transaction=False)
            keys = [
                (queue, STEP_TIERS[step], key)
                for queue in queues_for(self.settings)
                for step, key in zip(REDIS_PRIORITY_STEPS, redis_queue_keys(self.app, queue), strict=True)
            ]
            for _queue, _tier, key in keys:
                pipe.llen(key)
            for (queue, tier, _key), count in zip(keys, pipe.execute(), strict=True):
                depths[(queue, tier)] = depths.get((queue, tier), 0) + int(count)
        return depths

    def waiting(self) -> set[str]:
        """Task ids of the messages waiting in the service's queues."""
        ids: set[str] = set()
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=3, interval_start=0.5, interval_step=0.5)
            client = conn.default_channel.client
            for queue in queues_for(self.settings):
                for key in redis_queue_keys(self.app, queue):
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

    def patch(self) -> None:
        from models import compat

        compat.guard_redis_acks()  # kombu: a consumer survives a Redis restart
