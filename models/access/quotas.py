"""Monthly audio quotas per tier (WHISPERQ_QUOTA_HOURS_PREMIUM, _STANDARD, _BATCH; off by
default), checked at the front door before an upload is stored.

A key's calendar month (UTC) holds what it was billed (models.access.usage) and what it has
in flight (PENDING or PROCESSING, at its whole audio; a URL job not yet fetched at
WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS). A submission whose audio does not fit in what is left is
refused: 429 `quota_exceeded`, saying the quota, what is used and in flight, and when it
resets (the first of next month, 00:00 UTC; Retry-After counts down to it). A job that
fails, expires or is cancelled before it ran gives its seconds back.

Concurrency. The door checks twice: before the audio is stored (the common refusal, with
nothing written), and again once the job's row is in, counting that row as well, before the
job is published (`confirm_or_withdraw`). Of submissions racing for a key's last seconds,
the one whose row went in last counts all the others when it checks again, so together they
never pass the quota. The cost is on the safe side: two racing submissions may both be
refused where one alone would have fitted (each counted the other); they are told to try
again in a second. What the door cannot know: it measures an upload by its header, and a
file is billed as it decodes, so a header that understates its file's length can take a key
past its quota by that one file (at most WHISPERQ_MAX_AUDIO_SECONDS); then nothing more gets in.
A job by URL is let in at the estimate and measured when the preparation pool fetches it
(`check_measured`): one longer than what is left FAILS then, saying so, and is billed nothing.

No quota applies to jobs without a key (anonymous use has its rate limit and priority cap;
WHISPERQ_ADMIN_TOKEN and transcribe.delay() are operators'), nor to dead-letter replays. A
transcribe.delay(api_key=...) job is billed to its key (models.access.usage) but is made by the
preparation pool, past this door: tasks.transcription checks it before it is queued, and the
preparation pool again once it is decoded (`check_measured`), so racing calls cannot pass
the quota together by more than the ones being decoded at that moment.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import select

from models.access.apikeys import TIERS, ApiKey
from models.access.usage import month_figures, next_month
from models.errors import WhisperqError
from models.jobs.record import Job, utcnow

if TYPE_CHECKING:
    from models.runtime import Runtime

_SLACK = 1e-6  # sums of seconds kept to the millisecond: equal is within the quota


class QuotaExceeded(WhisperqError):
    code = "quota_exceeded"
    http_status = 429

    def __init__(self, message: str, retry_after: int, details: dict[str, Any]):
        super().__init__(message)
        self.retry_after = retry_after
        self.details = details  # shown in the error object, beside code and message


@dataclass(frozen=True)
class Quota:
    tier: str
    hours: float

    @property
    def seconds(self) -> float:
        return self.hours * 3600.0

    @property
    def setting(self) -> str:
        return f"WHISPERQ_QUOTA_HOURS_{self.tier.upper()}"


def quota_of(rt: Runtime, owner: str | None, tier: str | None = None) -> Quota | None:
    """The monthly quota of the key `owner` (its tier's), or None: no key, or no quota for
    its tier. `tier` saves looking the key up; with every quota off nothing is read."""
    settings = rt.settings
    if owner is None or all(getattr(settings, f"quota_hours_{t}", None) is None for t in TIERS):
        return None
    if tier is None:
        with rt.db.session() as session:
            tier = session.scalar(select(ApiKey.tier).where(ApiKey.id == owner))
    hours = getattr(settings, f"quota_hours_{tier}", None) if tier in TIERS else None
    return Quota(cast(str, tier), hours) if hours is not None else None  # hours: tier is one of TIERS


@dataclass(frozen=True)
class Standing:
    """A key's quota in one month: billed, in flight, and when it resets."""

    quota: Quota
    month: str
    used: float
    in_flight: float
    resets_at: datetime

    @property
    def remaining(self) -> float:
        return max(0.0, self.quota.seconds - self.used - self.in_flight)

    def fits(self, seconds: float) -> bool:
        return self.used + self.in_flight + seconds <= self.quota.seconds + _SLACK

    def to_dict(self) -> dict[str, Any]:
        return {
            "tier": self.quota.tier,
            "audio_hours": self.quota.hours,
            "audio_seconds": round(self.quota.seconds, 3),
            "month": self.month,
            "used_audio_seconds": round(self.used, 3),
            "in_flight_audio_seconds": round(self.in_flight, 3),
            "remaining_audio_seconds": round(self.remaining, 3),
            "resets_at": self.resets_at.isoformat().replace("+00:00", "Z"),
        }


def standing(rt: Runtime, owner: str | None, quota: Quota, now: datetime) -> Standing:
    """`owner`'s standing in `now`'s month."""
    found = month_figures(rt, owner, now)
    return Standing(quota, now.strftime("%Y-%m"), found.audio_seconds, found.in_flight_audio_seconds, next_month(now))


def check(
    rt: Runtime, owner: str | None, seconds: float | None = None, tier: str | None = None, now: datetime | None = None
) -> None:
    """Refuse (QuotaExceeded) `seconds` of new audio for the key `owner` where its month has
    no room for them; with `seconds` None (before the upload is read, its length unknown),
    only where nothing at all is left."""
    quota = quota_of(rt, owner, tier)
    if quota is None:
        return
    now = now or utcnow()
    found = standing(rt, owner, quota, now)
    if found.remaining > _SLACK if seconds is None else found.fits(seconds):
        return
    raise _refusal(found, seconds, now)


def held_by(rt: Runtime, job: Job) -> float:
    """What an unfinished job holds against its key's quota (as models.access.usage counts it)."""
    if job.audio_duration is None:
        return rt.settings.unfetched_audio_seconds if job.audio_url else 0.0
    return float(job.audio_duration)


def check_measured(rt: Runtime, job: Job, seconds: float) -> None:
    """Once the preparation pool has measured a job the door could not (`seconds` long: a
    job by URL, fetched; a transcribe.delay() job, decoded): refuse it (QuotaExceeded)
    where its key's month has no room for that length. Until now the job held what
    `held_by` says (the URL estimate, or nothing); from now on it holds its length.
    Measured last, it counts every other job of the key in flight."""
    quota = quota_of(rt, job.owner)
    if quota is None:
        return
    found = standing(rt, job.owner, quota, job.created_at)
    others = max(0.0, found.in_flight - held_by(rt, job))
    if found.used + others + seconds <= quota.seconds + _SLACK:
        return
    left = max(0.0, quota.seconds - found.used - others)
    resets = found.resets_at.isoformat().replace("+00:00", "Z")
    raise QuotaExceeded(
        f"the audio{' at audio_url' if job.audio_url else ''} is {seconds:.1f} s long, and this API key's monthly "
        f"audio quota ({quota.hours:g} h, {quota.setting} for tier {quota.tier}) has {left:.1f} s left in "
        f"{found.month}; nothing was billed. It resets at {resets}: send shorter audio, or ask an operator for "
        "another tier",
        max(1, math.ceil((found.resets_at - utcnow()).total_seconds())),
        {"quota": dict(found.to_dict(), requested_audio_seconds=round(seconds, 3))},
    )


def confirm_or_withdraw(
    rt: Runtime, job: Job, now: datetime | None = None, withdraw: Callable[[], None] | None = None
) -> None:
    """Once `job`'s row is in, before it is published: count its key's month again, the job
    included. Past the quota, the job is withdrawn (its row and audio removed) and
    QuotaExceeded raised, saying to try again in a second: the check before storing found
    room, so a submission racing this one was counted meanwhile; the next try finds either
    room again or the month's answer."""
    from models.jobs.operations import discard_job

    quota = quota_of(rt, job.owner)
    if quota is None:
        return
    found = standing(rt, job.owner, quota, job.created_at)  # the month the job is billed to
    if found.fits(0.0):
        return
    if withdraw is not None:  # a batch: all of its jobs go
        withdraw()
    else:
        discard_job(rt, job.id)
    left = standing(rt, job.owner, quota, job.created_at)
    raise _refusal(left, held_by(rt, job), now or utcnow(), raced=True)


def _refusal(found: Standing, seconds: float | None, now: datetime, raced: bool = False) -> QuotaExceeded:
    quota = found.quota
    until = max(1, math.ceil((found.resets_at - now).total_seconds()))
    resets = found.resets_at.isoformat().replace("+00:00", "Z")
    ask = "" if seconds is None else f", and this submission needs {seconds:.1f} s"
    message = (
        f"this API key's monthly audio quota is used up: {quota.hours:g} h ({quota.seconds:.0f} s, "
        f"{quota.setting} for tier {quota.tier}) in {found.month}, of which {found.used:.1f} s are used and "
        f"{found.in_flight:.1f} s are held by jobs in flight, {found.remaining:.1f} s left{ask}. It resets at "
        f"{resets}; until then send shorter audio once jobs in flight end, or ask an operator for another tier"
    )
    if raced:
        message = (
            "another submission of this API key was counted against its monthly audio quota at the same "
            f"moment, and together they do not fit; try again in a second ({found.remaining:.1f} s of "
            f"{quota.seconds:.0f} s are left in {found.month}, resetting at {resets})"
        )
        until = 1
    details = dict(found.to_dict(), requested_audio_seconds=None if seconds is None else round(seconds, 3))
    return QuotaExceeded(message, until, {"quota": details})
