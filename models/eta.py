"""Where a job is: its place in the queue and when it should start and finish.

Work ahead of a job is the audio of every waiting job that will be taken before it (a
higher priority, or the same priority and older) plus what is left of the jobs being
transcribed. It drains at the inference pool's measured speed: audio seconds per wall
second while busy, from the last jobs' inference intervals (their union, so jobs batched
together are not counted twice), per worker that ran them, times the inference workers
alive now. Audio not fetched yet counts as long as the recent jobs' average. Estimates
are None while no inference worker is alive.
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, func, select

from .job import Job, JobStatus, utcnow
from .runtime import Runtime
from .workers import alive

# Used until jobs have been measured: tiny.en on one CPU core does about this much.
DEFAULT_SPEED = 5.0
HISTORY = 100
_CACHE_SECONDS = 5.0
_cache: dict[str, Any] = {}
_cache_lock = threading.Lock()


def _rank(priority):
    return case((priority == "high", 0), (priority == "normal", 1), else_=2)


DEFAULT_DURATION = 60.0


def measured_speed(rt: Runtime) -> tuple[float, float]:
    """(audio seconds per wall second per inference worker, the recent jobs' mean audio
    duration), cached briefly."""
    with _cache_lock:
        hit = _cache.get("speed")
        if hit and hit[0] > time.monotonic():
            return hit[1]
    with rt.db.session() as session:
        rows = session.execute(
            select(Job.infer_started_at, Job.finished_at, Job.audio_duration, Job.worker)
            .where(Job.status == JobStatus.COMPLETED.value, Job.infer_started_at.is_not(None),
                   Job.audio_duration.is_not(None))
            .order_by(Job.finished_at.desc()).limit(HISTORY)
        ).all()
    value = (DEFAULT_SPEED, DEFAULT_DURATION)
    if rows:
        intervals = sorted((r[0], r[1]) for r in rows if r[1] is not None and r[1] >= r[0])
        busy, end = 0.0, None
        for start, finish in intervals:
            if end is None or start > end:
                busy += (finish - start).total_seconds()
                end = finish
            elif finish > end:
                busy += (finish - end).total_seconds()
                end = finish
        audio = sum(r[2] for r in rows)
        workers = max(1, len({r[3] for r in rows}))
        if busy > 0:
            value = (audio / busy / workers, audio / len(rows))
    with _cache_lock:
        _cache["speed"] = (time.monotonic() + _CACHE_SECONDS, value)
    return value


def estimate(rt: Runtime, job: Job, now: datetime | None = None) -> dict[str, Any]:
    """queue_position, estimated_start_at and estimated_finish_at for one job."""
    now = now or utcnow()
    out: dict[str, Any] = {"queue_position": None, "estimated_start_at": None, "estimated_finish_at": None}
    if job.state.finished:
        return out
    workers = len(alive(rt, "inference", now))
    speed, typical = measured_speed(rt)
    capacity = speed * workers
    running = (Job.status == JobStatus.PROCESSING.value) & (Job.stage == "infer")
    if job.state is JobStatus.PROCESSING and job.stage == "infer":
        out["queue_position"] = 0
        out["estimated_start_at"] = _iso(job.infer_started_at)
        if speed and job.audio_duration:
            left = max(0.0, job.audio_duration - (job.progress_seconds or 0.0))
            out["estimated_finish_at"] = _iso(now + timedelta(seconds=left / speed))
        return out
    waiting = Job.status.in_([JobStatus.PENDING.value, JobStatus.PROCESSING.value]) & ~running
    mine = _rank(job.priority)
    ahead = waiting & (Job.id != job.id) & (
        (_rank(Job.priority) < mine) | ((_rank(Job.priority) == mine) & (Job.created_at < job.created_at)))
    with rt.db.session() as session:
        count, audio_ahead, unknown = session.execute(
            select(func.count(), func.coalesce(func.sum(Job.audio_duration), 0.0),
                   func.count().filter(Job.audio_duration.is_(None))).where(ahead)
        ).one()
        in_progress = session.execute(
            select(func.coalesce(func.sum(Job.audio_duration - func.coalesce(Job.progress_seconds, 0.0)), 0.0))
            .where(running)
        ).scalar_one()
    out["queue_position"] = int(count)
    if capacity <= 0:
        return out
    work = float(audio_ahead) + unknown * typical + float(in_progress)
    start = now + timedelta(seconds=work / capacity)
    out["estimated_start_at"] = _iso(start)
    out["estimated_finish_at"] = _iso(start + timedelta(seconds=(job.audio_duration or typical) / speed))
    return out


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None
