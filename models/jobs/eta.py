"""Where a job is: its place in the queue and when it should start and finish.

Work ahead of a job is the audio of every waiting job that will be taken before it (a
higher priority, or the same priority and older) plus what is left of the jobs being
transcribed. It drains at the inference pool's measured speed: audio seconds per wall
second while busy, from the last jobs' inference intervals (their union, so jobs batched
together are not counted twice), per worker that ran them, times the inference workers
alive now. Audio not fetched yet counts as long as the recent jobs' average. Estimates
are None while no inference worker is alive.

Each model has its own queue and its own workers (config.registry): a job waits only behind
jobs of its model, and drains at its model's measured speed times the live workers that
serve that model.

Reading a job's status costs no scan of the queue: each process keeps a snapshot of the
waiting jobs (at most a second old) with running sums of their audio, and finds a job's
place in it by bisection; only a job newer than the snapshot is counted by a query.
"""
from __future__ import annotations

import bisect
import functools
import threading
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, func, select

from config.priorities import Priority

from models.jobs.record import Job, JobStatus, Stage, utcnow
from models.jobs.workers import alive

if TYPE_CHECKING:
    from models.runtime import Runtime

# Used until jobs have been measured: tiny.en on one CPU core does about this much.
DEFAULT_SPEED = 5.0
HISTORY = 100
_CACHE_SECONDS = 5.0
_cache: dict[str, Any] = {}
_cache_lock = threading.Lock()


def _rank(priority):
    """A tier's rank in SQL (an unknown name ranks last, as in _Queue)."""
    return case(*((priority == p.value, p.rank) for p in Priority if p is not Priority.LOW), else_=Priority.LOW.rank)


DEFAULT_DURATION = 60.0


def _model(rt: Runtime, name: str | None) -> str:
    """A job's model: a row made before models had names ran on the default one."""
    return name or rt.settings.default_model


def _of_model(rt: Runtime, model: str):
    """SQL: the job runs on `model` (the default's rows may say None)."""
    return func.coalesce(Job.model, rt.settings.default_model) == model


def measured_speed(rt: Runtime, model: str | None = None) -> tuple[float, float]:
    """(audio seconds per wall second per inference worker, the recent jobs' mean audio
    duration) of a model (the default for None), cached briefly."""
    model = _model(rt, model)
    with _cache_lock:
        hit = _cache.get(("speed", model))
        if hit and hit[0] > time.monotonic():
            return hit[1]
    with rt.db.session() as session:
        rows = session.execute(
            select(Job.infer_started_at, Job.finished_at, Job.audio_duration, Job.worker)
            .where(Job.status == JobStatus.COMPLETED.value, Job.infer_started_at.is_not(None),
                   Job.audio_duration.is_not(None), _of_model(rt, model))
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
        _cache[("speed", model)] = (time.monotonic() + _CACHE_SECONDS, value)
    return value


def estimate(rt: Runtime, job: Job, now: datetime | None = None) -> dict[str, Any]:
    """queue_position, estimated_start_at and estimated_finish_at for one job."""
    now = now or utcnow()
    out: dict[str, Any] = {"queue_position": None, "estimated_start_at": None, "estimated_finish_at": None}
    if job.state.finished:
        return out
    model = _model(rt, job.model)
    workers = _inference_workers(rt, model)
    speed, typical = measured_speed(rt, model)
    capacity = speed * workers
    if job.state is JobStatus.PROCESSING and job.stage == Stage.INFER:
        out["queue_position"] = 0
        out["estimated_start_at"] = _iso(job.infer_started_at)
        if speed and job.audio_duration:
            left = max(0.0, job.audio_duration - (job.progress_seconds or 0.0))
            out["estimated_finish_at"] = _iso(now + timedelta(seconds=left / speed))
        return out
    count, audio_ahead, unknown, in_progress = _ahead(rt, job)
    out["queue_position"] = int(count)
    if capacity <= 0:
        return out
    work = float(audio_ahead) + unknown * typical + float(in_progress)
    start = now + timedelta(seconds=work / capacity)
    out["estimated_start_at"] = _iso(start)
    out["estimated_finish_at"] = _iso(start + timedelta(seconds=(job.audio_duration or typical) / speed))
    return out


def queue_position(rt: Runtime, job: Job) -> int | None:
    """The job's place in the queue as estimate() gives it, without the estimates."""
    if job.state.finished:
        return None
    if job.state is JobStatus.PROCESSING and job.stage == Stage.INFER:
        return 0
    return int(_ahead(rt, job)[0])


def _inference_workers(rt: Runtime, model: str) -> int:
    """Inference workers alive now that serve the model (their heartbeats), read at most once
    a second. A worker that names no models (started before models had names) serves the default."""
    key = ("workers", rt.settings.database_url)
    with _cache_lock:
        hit = _cache.get(key)
        if hit and hit[0] > time.monotonic():
            served = hit[1]
        else:
            hit = None
    if hit is None:
        served = [w["models"] or [rt.settings.default_model] for w in alive(rt, "inference")]
        with _cache_lock:
            _cache[key] = (time.monotonic() + QUEUE_SNAPSHOT_SECONDS, served)
    return sum(model in models for models in served)


class _Queue:
    """A model's waiting jobs in the order they will be taken, with running sums of their
    audio: a job's place and the work ahead of it by bisection, not a query per status read."""

    def __init__(self, rows, in_progress: float, taken_at: datetime):
        self.keys = sorted((Priority.rank_of(p, Priority.LOW), created, job_id, duration)
                           for job_id, p, created, duration in rows)
        self.audio, self.unknown = [0.0], [0]
        for *_key, duration in self.keys:
            self.audio.append(self.audio[-1] + (duration or 0.0))
            self.unknown.append(self.unknown[-1] + (duration is None))
        self.in_progress, self.taken_at = in_progress, taken_at
        self.expires = time.monotonic() + QUEUE_SNAPSHOT_SECONDS

    def ahead(self, job: Job) -> tuple[int, float, int]:
        rank = Priority.rank_of(job.priority, Priority.LOW)
        n = bisect.bisect_left(self.keys, (rank, job.created_at, job.id))
        return n, self.audio[n], self.unknown[n]


QUEUE_SNAPSHOT_SECONDS = 1.0
_queues: dict[str, dict[str, _Queue]] = {}  # database -> model -> its queue
_queues_lock = threading.Lock()


@functools.cache
def _waiting():
    """(waiting, running) as SQL conditions, built once: building them per status read was a
    tenth of the web's CPU in a burst."""
    running = (Job.status == JobStatus.PROCESSING.value) & (Job.stage == Stage.INFER.value)
    return Job.status.in_([JobStatus.PENDING.value, JobStatus.PROCESSING.value]) & ~running, running


def _ahead(rt: Runtime, job: Job) -> tuple[int, float, int, float]:
    """(jobs ahead, their known audio, how many of them are of unknown length, audio left of
    the jobs being transcribed). From a snapshot of the queue at most a second old (one
    query a second per process, however many clients poll); a job newer than the
    snapshot is counted exactly, so a client's first answer is right."""
    waiting, running = _waiting()
    model = _model(rt, job.model)
    with _queues_lock:
        queues = _queues.get(rt.settings.database_url)
    if queues is None or next(iter(queues.values())).expires < time.monotonic():
        with rt.db.session() as session:
            taken_at = utcnow()
            rows = session.execute(select(Job.id, Job.priority, Job.created_at, Job.audio_duration, Job.model)
                                   .where(waiting)).all()
            in_progress = dict(session.execute(
                select(Job.model, func.coalesce(func.sum(Job.audio_duration - func.coalesce(Job.progress_seconds, 0.0)),
                                                0.0)).where(running).group_by(Job.model)).all())
        by_model: dict[str, list] = {}
        for row in rows:
            by_model.setdefault(_model(rt, row.model), []).append(row[:4])
        left: dict[str, float] = {}
        for name, seconds in in_progress.items():
            left[_model(rt, name)] = left.get(_model(rt, name), 0.0) + float(seconds)
        queues = {name: _Queue(by_model.get(name, []), left.get(name, 0.0), taken_at)
                  for name in {*by_model, *left, rt.settings.default_model}}
        with _queues_lock:
            _queues[rt.settings.database_url] = queues
    queue = queues.get(model) or _Queue([], 0.0, next(iter(queues.values())).taken_at)
    if job.created_at < queue.taken_at - timedelta(milliseconds=50):
        return (*queue.ahead(job), queue.in_progress)
    mine = _rank(job.priority)
    ahead = waiting & _of_model(rt, model) & (Job.id != job.id) & (
        (_rank(Job.priority) < mine) | ((_rank(Job.priority) == mine) & (Job.created_at < job.created_at)))
    with rt.db.session() as session:
        count, audio, unknown = session.execute(
            select(func.count(), func.coalesce(func.sum(Job.audio_duration), 0.0),
                   func.count().filter(Job.audio_duration.is_(None))).where(ahead)).one()
    return int(count), float(audio), int(unknown), queue.in_progress


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None
