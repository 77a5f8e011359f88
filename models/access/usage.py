"""Usage per API key and UTC day: audio seconds and jobs, counted from the jobs table.

The job rows are the ledger: a job's row is never removed once it reached the queue
(`DELETE /v1/jobs/<id>` and retention empty it but keep its owner, status, duration and
progress), so deleting a job does not erase what it cost. What counts:

- **Billed** (`jobs`, `audio_seconds`): a COMPLETED job, for its whole audio as the
  preparation pool decoded it; a CANCELLED job that had begun to be transcribed, for the
  audio transcribed before it stopped (its progress, at most its length): the client got
  that part (or deleted it, which is its choice, not a refund).
- **Not billed** (`unbilled_jobs`): FAILED (the client got nothing, whatever was tried),
  EXPIRED (never ran), and CANCELLED before any of its audio was transcribed.
- **In flight** (`in_flight_jobs`, `in_flight_audio_seconds`): PENDING and PROCESSING jobs,
  not billed yet; they hold their whole audio against the quota (models.access.quotas) until
  they end, a job by URL not yet fetched at WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS (its length
  is not known; the fetch checks the real one against the quota).

A job counts once, on the UTC day it was submitted (`created_at`), whatever its retries,
redeliveries or replays: where it is reserved is where it is billed. A re-run is a job of its
own (the model ran again), charged to the original job's key; shadow decoding (an operator's
comparison, WHISPERQ_SHADOW) and repeated Idempotency-Key requests (the same job) add
nothing. Jobs without a key (anonymous use, transcribe.delay(), WHISPERQ_ADMIN_TOKEN) are
counted under the key id None.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, case, func, select

from models.errors import InvalidRequest
from models.jobs.record import Job, JobStatus, utcnow

if TYPE_CHECKING:
    from models.runtime import Runtime

ALL = object()  # every owner: an admin's view
MAX_DAYS = 366
IN_FLIGHT = (JobStatus.PENDING.value, JobStatus.PROCESSING.value)


@dataclass
class Figures:
    """Usage of one key over some days (see the module's docstring for what counts)."""

    jobs: int = 0
    audio_seconds: float = 0.0
    in_flight_jobs: int = 0
    in_flight_audio_seconds: float = 0.0
    unbilled_jobs: int = 0

    def __iadd__(self, other: Figures) -> Figures:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: round(getattr(self, f.name), 3) if f.type == "float" else getattr(self, f.name)
            for f in fields(self)
        }


def month_start(now: datetime) -> datetime:
    return datetime(now.year, now.month, 1, tzinfo=UTC)


def next_month(now: datetime) -> datetime:
    """The first instant of the month after `now`'s (UTC): when a monthly quota resets."""
    return datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)


def day_range(first: date, last: date) -> tuple[datetime, datetime]:
    """UTC days `first` to `last`, both included, as [start, end) instants."""
    if last < first:
        raise InvalidRequest(f"the range ends ({last}) before it starts ({first}); give from before to")
    if (last - first).days >= MAX_DAYS:
        raise InvalidRequest(f"the range is {(last - first).days + 1} days; ask for at most {MAX_DAYS} at a time")
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    try:
        return start, datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=1)
    except OverflowError:
        raise InvalidRequest("the range ends after the last day this service can count") from None


def _billed_seconds() -> ColumnElement[Any]:
    """A job's billed audio: all of a COMPLETED one, what a CANCELLED one transcribed."""
    transcribed = case(
        (Job.audio_duration.is_(None) | (Job.progress_seconds < Job.audio_duration), Job.progress_seconds),
        else_=Job.audio_duration,
    )
    return case(
        (Job.status == JobStatus.COMPLETED.value, func.coalesce(Job.audio_duration, 0.0)),
        (_partly_done(), transcribed),
        else_=0.0,
    )


def _partly_done() -> ColumnElement[bool]:
    return (Job.status == JobStatus.CANCELLED.value) & (func.coalesce(Job.progress_seconds, 0.0) > 0)


def held_seconds(unfetched_seconds: float) -> ColumnElement[Any]:
    """What an unfinished job holds against a quota: its audio; a URL job not yet fetched,
    WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS (its fetch checks the real length)."""
    return case(
        (Job.audio_duration.is_(None) & Job.audio_url_token.is_not(None), unfetched_seconds),
        else_=func.coalesce(Job.audio_duration, 0.0),
    )


def _day(rt: Runtime) -> ColumnElement[Any]:
    """The UTC day of `created_at` as YYYY-MM-DD, on SQLite (naive UTC text) and PostgreSQL (timestamptz)."""
    if rt.db.url.startswith("sqlite"):
        return func.strftime("%Y-%m-%d", Job.created_at)
    return func.to_char(func.timezone("UTC", Job.created_at), "YYYY-MM-DD")


def figures(
    rt: Runtime, start: datetime, end: datetime, owner: object = ALL, by_day: bool = True
) -> dict[tuple[str | None, str | None], Figures]:
    """(key id, day) -> usage of the jobs submitted in [start, end); day None with by_day off.
    `owner`: one key id (None: the jobs without a key), or ALL."""
    billed = (Job.status == JobStatus.COMPLETED.value) | _partly_done()
    in_flight = Job.status.in_(IN_FLIGHT)
    day = _day(rt).label("day") if by_day else None
    columns: list[Any] = [Job.owner] + ([day] if by_day else [])
    query = select(
        *columns,
        func.sum(case((billed, 1), else_=0)),
        func.sum(_billed_seconds()),
        func.sum(case((in_flight, 1), else_=0)),
        func.sum(case((in_flight, held_seconds(rt.settings.unfetched_audio_seconds)), else_=0.0)),
        func.count(),
    ).where(Job.created_at >= start, Job.created_at < end)
    if owner is not ALL:
        query = query.where(Job.owner.is_(None) if owner is None else Job.owner == owner)
    query = query.group_by(*columns)
    out = {}
    with rt.db.session() as session:
        for row in session.execute(query).all():
            key, when = row[0], (row[1] if by_day else None)
            jobs, seconds, flying, held, total = (v or 0 for v in row[len(columns) :])
            out[(key, when)] = Figures(
                int(jobs), float(seconds), int(flying), float(held), int(total) - int(jobs) - int(flying)
            )
    return out


def month_figures(rt: Runtime, owner: str | None, now: datetime) -> Figures:
    """One key's usage in `now`'s month (UTC)."""
    found = figures(rt, month_start(now), next_month(now), owner=owner, by_day=False)
    return found.get((owner, None), Figures())


def by_key_this_month(rt: Runtime, now: datetime | None = None) -> dict[str | None, Figures]:
    """This month's usage of every key with jobs in it, for the metrics."""
    now = now or utcnow()
    return {key: f for (key, _), f in figures(rt, month_start(now), next_month(now), by_day=False).items()}
