"""Polls that come faster than the job's Retry-After: 429, saying how often to poll.

Each (client, job) has a small bucket: GRACE reads at once (a page reload, a read after a
cancel), refilled by one read per the job's Retry-After. A client that honours Retry-After
never meets it; one that polls in a tight loop (every 0.5 s while the job waits minutes)
is told to slow down, as hosted APIs tell their pollers, and spends no database query on
the way. A long-poll that waits is never counted: the server paces it. Counted in each
web process (a client whose polls land on several processes gets that many buckets): a
guard against loops, not a quota (WHISPERQ_POLL_LIMIT=false turns it off).

Only reads that tell the client nothing new count: one answered with a state of the job
other than the one this client was last answered with is news, and never paced (a job that
is prepared, queued and transcribed window by window can change faster than its
Retry-After); a loop that sends the same old ETag with `?wait=` is answered at once each
time, with nothing new, and is paced like any poll.

Under the gevent web worker the 429 is held until the client's next read would have been
allowed (at most HOLD seconds), or until the job changes, which answers the read with the
change: a greenlet waiting costs nothing, and a client that ignores Retry-After and polls
again right after each answer is paced all the same, told of each change as it comes,
instead of costing the web, and so the model on the same cores, a request every half
second. Under a threaded worker a held 429 would hold a thread: it is answered at once there.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from models.errors import WhisperqError

GRACE = 3  # reads allowed at once beyond the pace
IDLE = 120.0  # seconds after which a bucket nobody used is forgotten
_SWEEP_AT = 10_000  # buckets held before the idle ones are swept
HOLD = 10.0  # the longest a too-early poll's 429 is held (well inside clients' and gateways' time-outs)


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


def cooperative() -> bool:
    """Whether this process runs under gevent (its time.sleep a greenlet's, not a thread's)."""
    monkey = sys.modules.get("gevent.monkey")
    return monkey is not None and bool(monkey.is_module_patched("time"))


class PollRate:
    def __init__(self, grace: int = GRACE, hold: Callable[[float], bool | None] | None = None):
        """`hold(seconds)` holds a too-early poll before its 429, True if it ended because the
        job changed: by default the `until_changed` given to take() under gevent, nothing
        elsewhere."""
        self.grace = grace
        self.hold = hold
        self._lock = threading.Lock()
        # (client, job) -> (tokens, at, the job's state as last answered to this client)
        self._buckets: dict[tuple[str, str], tuple[float, float, str | None]] = {}

    def take(
        self,
        client: str,
        job_id: str,
        state: str,
        interval: int,
        until_changed: Callable[[float], bool] | None = None,
    ) -> bool:
        """Count one read of `job_id` by `client` that would be answered with the job's `state`,
        at one read per `interval` seconds. A read that brings this client news (a state other
        than the one it was last answered with) is never counted: a job that moves faster than
        its Retry-After is told as it moves. A read of the same state, with the client's grace
        spent, is held (see the module's docstring), then refused: PollTooFast (429, Retry-After:
        the interval). True when the job changed while it was held: answer it with the change."""
        now = time.monotonic()
        key = (client, job_id)
        pace = max(1, interval)
        with self._lock:
            tokens, at, last = self._buckets.get(key, (float(self.grace), now, None))
            if last is not None and last != state:
                return False
            tokens = min(float(self.grace), tokens + (now - at) / pace)
            self._buckets[key] = (tokens - 1.0 if tokens >= 1.0 else tokens, now, last)
            if len(self._buckets) > _SWEEP_AT:
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < IDLE}
        if tokens >= 1.0:
            return False
        hold = self.hold or ((until_changed or time.sleep) if cooperative() else None)
        if hold is not None and hold(min(HOLD, (1.0 - tokens) * pace)):
            return True
        raise PollTooFast(interval)

    def answered(self, client: str, job_id: str, state: str) -> None:
        """The job's state as this client was just answered with it."""
        with self._lock:
            tokens, at, _ = self._buckets.get((client, job_id), (float(self.grace), time.monotonic(), None))
            self._buckets[(client, job_id)] = (tokens, at, state)
