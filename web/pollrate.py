"""Polls that come faster than the job's Retry-After: 429, saying how often to poll.

Each (client, job) has a small bucket: GRACE reads at once (a page reload, a read after a
cancel), refilled by one read per the job's Retry-After. A client that honours Retry-After
never meets it; one that polls in a tight loop (every 0.5 s while the job waits minutes)
is told to slow down, as hosted APIs tell their pollers, and spends no database query on
the way. A long-poll that waits is never counted: the server paces it. Counted in each
web process (a client whose polls land on several processes gets that many buckets): a
guard against loops, not a quota (WHISPERQ_POLL_LIMIT=false turns it off).
"""

from __future__ import annotations

import threading
import time

from models.errors import WhisperqError

GRACE = 3  # reads allowed at once beyond the pace
IDLE = 120.0  # seconds after which a bucket nobody used is forgotten
_SWEEP_AT = 10_000  # buckets held before the idle ones are swept


class PollTooFast(WhisperqError):
    code = "rate_limited"
    http_status = 429

    def __init__(self, interval: int):
        super().__init__(
            f"this job is polled faster than its Retry-After; poll it at most every {interval} s (the Retry-After "
            "header of each answer), or wait for a change in one request: GET with ?wait=30 and the job's ETag in "
            "If-None-Match"
        )
        self.retry_after = interval


class PollRate:
    def __init__(self, grace: int = GRACE):
        self.grace = grace
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}  # (client, job) -> (tokens, at)

    def take(self, client: str, job_id: str, interval: int) -> None:
        """Count one read of `job_id` by `client` at one read per `interval` seconds; PollTooFast
        (429, Retry-After: the interval) when the client's grace is spent."""
        now = time.monotonic()
        key = (client, job_id)
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.grace), now))
            tokens = min(float(self.grace), tokens + (now - at) / max(1, interval))
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                raise PollTooFast(interval)
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > _SWEEP_AT:
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < IDLE}
