"""The front door: refuse work early, with a time to come back, before the system falls over.

Three checks run before a submission's body is read:

- **Queue budget.** The work waiting (audio seconds, and jobs) is compared with
  WHISPERQ_QUEUE_BUDGET_SECONDS and WHISPERQ_QUEUE_BUDGET_JOBS. `normal` and `low` jobs
  may use the budget less its `high` reserve (WHISPERQ_HIGH_RESERVE); `high` jobs may use
  all of it. One API key may hold at most WHISPERQ_QUEUE_KEY_SHARE of it, so that a key
  sending a flood cannot fill the queue while others wait. A job submitted by URL counts
  at WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS (a typical recording, 10 minutes by default)
  until it is fetched; from then on at its real length, so a key whose URLs were longer
  than that finds its share used up sooner. Past it: 429, with Retry-After from the
  current drain rate.
- **Disk floor.** Less than WHISPERQ_DISK_FLOOR_MB free in the data dir: 503.
- **Per-client rate.** WHISPERQ_RATE_LIMIT submissions per window per client (API key,
  else address), counted in Redis so every web process shares the count; 429 with the
  RateLimit headers.
"""

from __future__ import annotations

import logging
import math
import shutil
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from sqlalchemy import case, func, select

from config.env import parse_rate
from models.errors import WhisperqError
from models.jobs.record import Job, JobStatus, Stage

if TYPE_CHECKING:
    import os

    import redis

    from config import Settings
    from models.runtime import Runtime

log = logging.getLogger(__name__)

_CACHE_SECONDS = 1.0
_cache: dict[tuple[str, object], tuple[float, Backlog]] = {}
_lock = threading.Lock()


class QueueFull(WhisperqError):
    code = "queue_full"
    http_status = 429

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class DiskFull(WhisperqError):
    code = "disk_full"
    http_status = 503

    def __init__(self, message: str, retry_after: int = 60):
        super().__init__(message)
        self.retry_after = retry_after


class RateLimited(WhisperqError):
    code = "rate_limited"
    http_status = 429

    def __init__(self, message: str, retry_after: int, headers: dict[str, str]):
        super().__init__(message)
        self.retry_after = retry_after
        self.headers = headers


@dataclass(frozen=True)
class Backlog:
    jobs: int
    audio_seconds: float


_EVERYONE = object()


def backlog(rt: Runtime, owner: object = _EVERYONE) -> Backlog:
    """Jobs not finished and not yet being transcribed, and their audio (cached ~1 s); of
    one API key's when `owner` is given. A URL job not yet fetched counts at
    WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS: its length is not known yet."""
    key = (rt.settings.database_url, owner)
    with _lock:
        hit = _cache.get(key)
        if hit and hit[0] > time.monotonic():
            return hit[1]
    waiting = Job.status.in_([JobStatus.PENDING.value, JobStatus.PROCESSING.value]) & (
        Job.stage.is_(None) | (Job.stage != Stage.INFER.value)
    )
    if owner is not _EVERYONE:
        waiting &= Job.owner == owner
    seconds = case(
        (Job.audio_duration.is_(None) & Job.audio_url_token.is_not(None), rt.settings.unfetched_audio_seconds),
        else_=func.coalesce(Job.audio_duration, 0.0),
    )
    with rt.db.session() as session:
        jobs, audio = session.execute(select(func.count(), func.coalesce(func.sum(seconds), 0.0)).where(waiting)).one()
    value = Backlog(int(jobs), float(audio))
    with _lock:
        _cache[key] = (time.monotonic() + _CACHE_SECONDS, value)
    return value


def drain_rate(rt: Runtime) -> float:
    """Audio seconds the inference pool finishes per second now (0 with no live worker)."""
    from models.jobs.eta import measured_speed
    from models.jobs.workers import alive

    speed, _ = measured_speed(rt)
    return speed * len(alive(rt, "inference"))


NOTHING = Backlog(0, 0.0)


def check_queue(rt: Runtime, priority: str, owner: str | None = None, ahead: Backlog = NOTHING) -> None:
    """Refuse (QueueFull) when the waiting work is past the budget for `priority`, or the
    API key `owner` already holds its share of it. `ahead`: the other jobs of a batch sent
    with this one, counted as waiting already, so a batch gets in only where its jobs sent
    one after another would all have got in."""
    s = rt.settings
    share = 1.0 if priority == "high" else 1.0 - s.high_reserve
    limit_seconds, limit_jobs = s.queue_budget_seconds * share, max(1, math.floor(s.queue_budget_jobs * share))
    now = _plus(backlog(rt), ahead)
    if now.audio_seconds >= limit_seconds or now.jobs >= limit_jobs:
        retry_after = _retry_after(rt, now, limit_seconds)
        reserve = "" if priority == "high" else f" ({s.high_reserve:.0%} of it is kept for priority high)"
        raise QueueFull(
            f"the queue is full: {now.jobs} jobs with {now.audio_seconds:.0f} s of audio are waiting, over the "
            f"budget for priority {priority}{reserve}; try again in {retry_after} s",
            retry_after,
        )
    if owner is None or s.queue_key_share >= 1.0:
        return
    own_seconds = s.queue_budget_seconds * s.queue_key_share
    own_jobs = max(1, math.floor(s.queue_budget_jobs * s.queue_key_share))
    mine = _plus(backlog(rt, owner), ahead)
    if mine.audio_seconds >= own_seconds or mine.jobs >= own_jobs:
        retry_after = _retry_after(rt, mine, own_seconds)
        raise QueueFull(
            f"this API key has {mine.jobs} jobs with {mine.audio_seconds:.0f} s of audio waiting, its share "
            f"({s.queue_key_share:.0%}, WHISPERQ_QUEUE_KEY_SHARE) of the queue budget; other clients' jobs go first. "
            f"Try again in {retry_after} s, once some of yours have started",
            retry_after,
        )


def _plus(one: Backlog, other: Backlog) -> Backlog:
    return Backlog(one.jobs + other.jobs, one.audio_seconds + other.audio_seconds)


def _retry_after(rt: Runtime, now: Backlog, limit_seconds: float) -> int:
    rate = drain_rate(rt)
    excess = max(now.audio_seconds - limit_seconds, 0.0)
    # Time to drain what is over the line, and at least one typical job's worth (a minute if nothing drains).
    wait = excess / rate + (now.audio_seconds / max(now.jobs, 1)) / rate if rate > 0 else 60.0
    return int(min(3600, max(1, math.ceil(wait))))


def free_bytes(path: str | os.PathLike[str]) -> int:
    """Free space on the file system that holds `path`, or will once it is made."""
    from pathlib import Path

    path = Path(path)
    while not path.exists() and path.parent != path:
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(rt: Runtime) -> None:
    floor = rt.settings.disk_floor_mb * 1024 * 1024
    free = free_bytes(rt.settings.data_dir)
    if free < floor:
        raise DiskFull(
            f"the server is low on disk space ({free // (1024 * 1024)} MB free, the floor is "
            f"{rt.settings.disk_floor_mb} MB); try again later"
        )


class RateLimiter:
    """A fixed-window counter per client in Redis: INCR and EXPIRE in one transaction."""

    def __init__(self, redis_client: redis.Redis, limit: int, window: int):
        self.redis, self.limit, self.window = redis_client, limit, window

    def hit(self, client: str) -> dict[str, str]:
        """Count one request; returns the RateLimit headers, or raises RateLimited."""
        now = time.time()
        slot = int(now // self.window)
        key = f"whisperq:ratelimit:{client}:{slot}"
        pipe = self.redis.pipeline(transaction=True)
        pipe.incr(key)
        pipe.expire(key, self.window + 1)
        count = int(pipe.execute()[0])
        reset = max(1, math.ceil((slot + 1) * self.window - now))
        headers = {
            "RateLimit-Policy": f"{self.limit};w={self.window}",
            "RateLimit-Limit": str(self.limit),
            "RateLimit-Remaining": str(max(0, self.limit - count)),
            "RateLimit-Reset": str(reset),
        }
        if count > self.limit:
            raise RateLimited(
                f"too many submissions from this client: the limit is {self.limit} per {self.window} s; "
                f"try again in {reset} s",
                reset,
                headers,
            )
        return headers


_UNSET = object()


def rate_limiter(settings: Settings, rate: str | object | None = _UNSET) -> RateLimiter | None:
    """The shared per-client limiter for `rate` (WHISPERQ_RATE_LIMIT by default): in
    WHISPERQ_REDIS_URL, else in the broker when it is Redis; None when rate limiting is
    off or there is no Redis to count in."""
    rate = settings.rate_limit if rate is _UNSET else cast("str | None", rate)
    if rate is None:
        return None
    url = settings.redis_url or (
        settings.broker_url if (settings.broker_url or "").startswith(("redis", "rediss")) else None
    )
    if url is None:
        log.warning(
            "a rate limit (%s) is set but there is no Redis to count in (set WHISPERQ_REDIS_URL); "
            "per-client rate limits are off",
            rate,
        )
        return None
    import redis

    limit, window = parse_rate(rate)
    return RateLimiter(redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2), limit, window)


_limiters: dict[tuple[str | None, str | None, str | None], RateLimiter | None] = {}


def check_rate(settings: Settings, tier: str | None, client: str) -> dict[str, str]:
    """Count one submission of `client` (a key's bucket, else an address's) at its tier's rate
    (WHISPERQ_RATE_LIMIT_<TIER>; anonymous use: WHISPERQ_RATE_LIMIT), every way in alike.
    Returns the RateLimit headers; RateLimited past the rate. With no Redis to count in, or
    Redis away, nothing is counted: serving beats refusing everyone."""
    rate = getattr(settings, f"rate_limit_{tier}") if tier is not None else settings.rate_limit
    key = (settings.redis_url, settings.broker_url, rate)
    if key not in _limiters:
        _limiters[key] = rate_limiter(settings, rate)
    limiter = _limiters[key]
    if limiter is None:
        return {}
    try:
        return limiter.hit(client)
    except RateLimited:
        raise
    except Exception as exc:
        log.warning("rate limit not checked: %s", exc)
        return {}
