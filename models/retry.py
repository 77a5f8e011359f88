"""The retry policy, in one place: classify a failure as permanent or transient, back off
with full jitter, and give up (to the dead letters, or a failed delivery) when the attempts
or the time allowed are used up.

Full jitter (AWS's "Exponential Backoff and Jitter"): the n-th wait is uniform in
[0, min(cap, base * 2^(n-1))], so that many jobs failing together (a broker restart, a
receiver down) do not come back together. Two policies are built from the settings:

- jobs (the transcribe and infer tasks, the sweeper, preparation's redelivery check): at most
  WHISPERQ_MAX_ATTEMPTS attempts, waits from WHISPERQ_RETRY_BASE_SECONDS up to
  WHISPERQ_RETRY_MAX_SECONDS, then the dead-letter store;
- webhooks (the notification pool): for WHISPERQ_WEBHOOK_RETRY_WINDOW after the first
  attempt, waits from WHISPERQ_WEBHOOK_RETRY_BASE_SECONDS up to an hour, then the delivery
  is marked failed.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from models.errors import AttemptsExhausted, JobCancelled, JobExpired, PermanentJobError

if TYPE_CHECKING:
    from config import Settings

WEBHOOK_BACKOFF_CAP_SECONDS = 3600.0


class Verdict(enum.Enum):
    PERMANENT = "permanent"  # retrying cannot help: fail now
    TRANSIENT = "transient"  # may succeed later: retry after a wait, while attempts last
    EXHAUSTED = "exhausted"  # no attempts left: the dead letters


def classify(exc: BaseException) -> Verdict:
    """A job's failure. What the service cannot tell apart (an engine's error, a lost
    connection) is transient: the attempts bound how often it is tried."""
    if isinstance(exc, (PermanentJobError, JobExpired, JobCancelled)):
        return Verdict.PERMANENT
    if isinstance(exc, AttemptsExhausted):
        return Verdict.EXHAUSTED
    return Verdict.TRANSIENT


def classify_status(status: int) -> Verdict:
    """An HTTP answer that is not a success: 429 and 5xx may pass, any other will not."""
    return Verdict.TRANSIENT if status == 429 or status >= 500 else Verdict.PERMANENT


@dataclass(frozen=True)
class RetryPolicy:
    base_seconds: float
    cap_seconds: float
    max_attempts: int | None = None  # None: bounded by window_seconds alone
    window_seconds: float | None = None  # since the first attempt

    @classmethod
    def for_jobs(cls, settings: Settings) -> RetryPolicy:
        return cls(settings.retry_base_seconds, settings.retry_max_seconds, max_attempts=settings.max_attempts)

    @classmethod
    def for_webhooks(cls, settings: Settings) -> RetryPolicy:
        return cls(
            settings.webhook_retry_base_seconds,
            WEBHOOK_BACKOFF_CAP_SECONDS,
            window_seconds=settings.webhook_retry_window_seconds,
        )

    def backoff(self, attempts: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after `attempts` tries: full jitter under the capped exponential."""
        ceiling = min(self.cap_seconds, self.base_seconds * 2 ** min(max(0, attempts - 1), 40))
        return (rng or random).uniform(0, ceiling)

    def exhausted(self, attempts: int, first_at: datetime | None = None, now: datetime | None = None) -> bool:
        """Whether to give up after `attempts` tries (begun at `first_at`, when windowed)."""
        if self.max_attempts is not None and attempts >= self.max_attempts:
            return True
        if self.window_seconds is not None and first_at is not None and now is not None:
            return (now - first_at).total_seconds() > self.window_seconds
        return False

    def next_delay(self, attempts: int, first_at: datetime | None = None, now: datetime | None = None) -> float | None:
        """The wait before the next try, or None to give up."""
        return None if self.exhausted(attempts, first_at, now) else self.backoff(attempts)
