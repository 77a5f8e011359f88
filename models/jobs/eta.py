"""Where a job is: its place in the queue and when it should start and finish.

Work ahead of a job is the audio of every waiting job that will be taken before it (a
higher priority, or the same priority and older) plus what is left of the jobs being
transcribed, and the windows it fills (one per job at least, one per 30 s at most). It
drains as the inference pool really goes: each inference worker measures on its last
batches what a window costs, what a second of speech costs, and how much slower a batch
runs with k batches side by side (models.jobs.throughput), and publishes it in its
heartbeat; the work is spread over as many lanes as it fills. A speed measured on jobs run
one by one would be the wrong one for a burst: the lanes of a busy pool share the machine,
and a burst of short clips pays for many windows. A lane count not measured yet goes no
faster than the largest one measured below it. Before any batch was measured, the speed is
that of the last jobs' inference intervals (their union, so jobs batched together are not
counted twice). Start and finish both add the lead: the time from upload to the start of
inference of the fastest quarter of the recent jobs (preparation: fetch, decode, split, with
no queue to wait in). Audio not fetched yet counts as long as the recent jobs' average.
Estimates are None while no inference worker is alive.

Each model has its own queue and its own workers (config.registry): a job waits only behind
jobs of its model, and drains at the speed of the live workers that serve that model.

Reading a job's status costs no scan of the queue: each process keeps a snapshot of the
waiting jobs (at most a second old) with running sums of their audio, and finds a job's
place in it by bisection; only a job newer than the snapshot is counted by a query. The
workers' speeds come with the heartbeats that are read anyway, once a second.
"""

from __future__ import annotations

import bisect
import functools
import math
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import ColumnElement, case, func, select

from config.priorities import Priority
from models.jobs.record import Job, JobStatus, Stage, utcnow
from models.jobs.workers import alive

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from models.runtime import Runtime

# Used until jobs have been measured: tiny.en on one CPU core does about this much.
DEFAULT_SPEED = 5.0
HISTORY = 100
_CACHE_SECONDS = 5.0
_cache: dict[tuple[str, ...], Any] = {}
_cache_lock = threading.Lock()


def _rank(priority: Any) -> ColumnElement[Any]:
    """A tier's rank in SQL (an unknown name ranks last, as in _Queue)."""
    return case(*((priority == p.value, p.rank) for p in Priority if p is not Priority.LOW), else_=Priority.LOW.rank)


DEFAULT_DURATION = 60.0


def _model(rt: Runtime, name: str | None) -> str:
    """A job's model: a row made before models had names ran on the default one."""
    return name or rt.settings.default_model


def _of_model(rt: Runtime, model: str) -> ColumnElement[bool]:
    """SQL: the job runs on `model` (the default's rows may say None)."""
    return func.coalesce(Job.model, rt.settings.default_model) == model


def measured_speed(rt: Runtime, model: str | None = None) -> tuple[float, float]:
    """(audio seconds per wall second per inference worker, the recent jobs' mean audio
    duration) of a model (the default for None), from its last jobs, cached briefly."""
    return _history(rt, model)[:2]


def _history(rt: Runtime, model: str | None = None) -> tuple[float, float, float]:
    """measured_speed, and the lead: seconds from upload to the start of inference of the
    fastest quarter of the recent jobs (preparation, with no queue to wait in: the jobs that
    waited behind others took longer)."""
    model = _model(rt, model)
    with _cache_lock:
        hit = _cache.get(("speed", rt.settings.database_url, model))
        if hit and hit[0] > time.monotonic():
            return cast("tuple[float, float, float]", hit[1])  # what this function put there
    with rt.db.session() as session:
        # Any: the query takes rows whose inference start and audio duration are set
        rows: Sequence[Any] = session.execute(
            select(Job.infer_started_at, Job.finished_at, Job.audio_duration, Job.worker, Job.created_at)
            .where(
                Job.status == JobStatus.COMPLETED.value,
                Job.infer_started_at.is_not(None),
                Job.audio_duration.is_not(None),
                _of_model(rt, model),
            )
            .order_by(Job.finished_at.desc())
            .limit(HISTORY)
        ).all()
    value = (DEFAULT_SPEED, DEFAULT_DURATION, 0.0)
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
        leads = sorted(max(0.0, (r[0] - r[4]).total_seconds()) for r in rows if r[4] is not None)
        lead = leads[len(leads) // 4] if leads else 0.0
        if busy > 0:
            value = (audio / busy / workers, audio / len(rows), lead)
    with _cache_lock:
        _cache[("speed", rt.settings.database_url, model)] = (time.monotonic() + _CACHE_SECONDS, value)
    return value


def estimate(rt: Runtime, job: Job, now: datetime | None = None) -> dict[str, Any]:
    """queue_position, estimated_start_at and estimated_finish_at for one job."""
    now = now or utcnow()
    out: dict[str, Any] = {"queue_position": None, "estimated_start_at": None, "estimated_finish_at": None}
    if job.state.finished:
        return out
    model = _model(rt, job.model)
    workers = _inference_workers(rt, model)
    speed, typical, lead = _history(rt, model)
    if job.state is JobStatus.PROCESSING and job.stage == Stage.INFER:
        out["queue_position"] = 0
        out["estimated_start_at"] = _iso(job.infer_started_at)
        if workers and job.audio_duration:
            # The jobs being transcribed share the pool's lanes: taken as each with this one's left.
            running = max(1, _ahead(rt, job).running)
            left = max(0.0, job.audio_duration - (job.progress_seconds or 0.0))
            took = _drain_seconds(workers, running - 1 + _windows(left), left * running, speed)
            out["estimated_finish_at"] = _iso(now + timedelta(seconds=took))
        return out
    ahead = _ahead(rt, job)
    out["queue_position"] = ahead.jobs
    if not workers:
        return out
    own = job.audio_duration or typical
    work = ahead.audio + ahead.unknown * typical + ahead.in_progress
    # Each job fills one window at least; a long one, one per 30 s at most.
    windows = max(ahead.jobs + ahead.running, _windows(work) if work else 0) + _windows(own)
    total = _drain_seconds(workers, windows, work + own, speed)
    out["estimated_start_at"] = _iso(now + timedelta(seconds=lead + total * work / (work + own)))
    out["estimated_finish_at"] = _iso(now + timedelta(seconds=lead + total))
    return out


def queue_position(rt: Runtime, job: Job) -> int | None:
    """The job's place in the queue as estimate() gives it, without the estimates."""
    if job.state.finished:
        return None
    if job.state is JobStatus.PROCESSING and job.stage == Stage.INFER:
        return 0
    return _ahead(rt, job).jobs


WINDOW_SECONDS = 30.0  # at most this much speech goes in one window (models.speech.windows)


def _windows(seconds: float) -> int:
    """Windows a job of this length fills at most (fewer where it has pauses)."""
    return max(1, math.ceil(seconds / WINDOW_SECONDS))


@dataclass(frozen=True)
class _Served:
    """An inference worker as its heartbeat describes it: batch lanes, windows per batch, the
    jobs it holds at once, and what its batches cost (models.jobs.throughput.Meter.figures):
    seconds per window, per speech second, and the slowdown with k batches side by side."""

    lanes: int
    batch: int
    slots: int
    window: float | None = None
    speech: float | None = None
    slowdown: dict[int, float] = field(default_factory=dict)

    @classmethod
    def of(cls, heartbeat: dict[str, Any], model: str) -> _Served:
        figures = (heartbeat.get("throughput") or {}).get(model) or {}
        return cls(
            int(figures.get("lanes") or 1),
            int(figures.get("batch") or 1),
            int(heartbeat["slots"] or 1),
            figures.get("window"),
            figures.get("speech"),
            {int(k): float(v) for k, v in (figures.get("slowdown") or {}).items() if float(v) > 0},
        )

    def seconds(self, windows: int, audio: float) -> float | None:
        """Seconds to transcribe `windows` windows holding `audio` seconds: spread over as many
        lanes as they fill (and its slots let it hold), each as slow as measured with that many
        running; a lane count not measured goes no faster than the largest one measured below
        it, or as slowly as the smallest one above it. None before anything was measured."""
        if self.window is None or self.speech is None or not self.slowdown:
            return None
        lanes = max(1, min(self.lanes, math.ceil(self.slots / self.batch), math.ceil(windows / self.batch)))
        alone = self.window * windows + self.speech * audio
        below = [k for k in self.slowdown if k <= lanes]
        if below:
            k = max(below)
            return self.slowdown[k] * alone / k
        return self.slowdown[min(self.slowdown)] * alone / lanes


def _drain_seconds(workers: list[_Served], windows: int, audio: float, measured: float) -> float:
    """Seconds the model's workers take to transcribe `windows` windows holding `audio` seconds,
    spread evenly over them; a worker not measured yet goes at `measured` (audio s per s, its
    last jobs' speed)."""
    windows, share = math.ceil(max(1, windows) / len(workers)), max(audio, 0.1) / len(workers)
    speed = 0.0
    for worker in workers:
        took = worker.seconds(windows, share)
        speed += share / took if took else measured
    return max(audio, 0.1) / speed


def _inference_workers(rt: Runtime, model: str) -> list[_Served]:
    """Inference workers alive now that serve the model (their heartbeats), read at most once
    a second. A worker that names no models (started before models had names) serves the default."""
    key = ("workers", rt.settings.database_url)
    with _cache_lock:
        hit = _cache.get(key)
        if hit and hit[0] > time.monotonic():
            beats = hit[1]
        else:
            hit = None
    if hit is None:
        beats = alive(rt, "inference")
        with _cache_lock:
            _cache[key] = (time.monotonic() + QUEUE_SNAPSHOT_SECONDS, beats)
    return [_Served.of(w, model) for w in beats if model in (w["models"] or [rt.settings.default_model])]


class _Queue:
    """A model's waiting jobs in the order they will be taken, with running sums of their
    audio: a job's place and the work ahead of it by bisection, not a query per status read."""

    def __init__(self, rows: Iterable[Any], in_progress: float, running: int, taken_at: datetime):
        self.keys = sorted(
            (Priority.rank_of(p, Priority.LOW), created, job_id, duration) for job_id, p, created, duration in rows
        )
        self.audio, self.unknown = [0.0], [0]
        for *_key, duration in self.keys:
            self.audio.append(self.audio[-1] + (duration or 0.0))
            self.unknown.append(self.unknown[-1] + (duration is None))
        self.in_progress, self.running, self.taken_at = in_progress, running, taken_at
        self.expires = time.monotonic() + QUEUE_SNAPSHOT_SECONDS

    def ahead(self, job: Job) -> Ahead:
        rank = Priority.rank_of(job.priority, Priority.LOW)
        n = bisect.bisect_left(self.keys, (rank, job.created_at, job.id))
        return Ahead(n, self.audio[n], self.unknown[n], self.in_progress, self.running)


@dataclass(frozen=True)
class Ahead:
    """What will be transcribed before a job: waiting jobs, their known audio and how many are
    of unknown length; and the jobs being transcribed, with the audio they have left."""

    jobs: int
    audio: float
    unknown: int
    in_progress: float
    running: int


QUEUE_SNAPSHOT_SECONDS = 1.0
_queues: dict[str, dict[str, _Queue]] = {}  # database -> model -> its queue
_queues_lock = threading.Lock()


@functools.cache
def _waiting() -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    """(waiting, running) as SQL conditions, built once: building them per status read was a
    tenth of the web's CPU in a burst."""
    running = (Job.status == JobStatus.PROCESSING.value) & (Job.stage == Stage.INFER.value)
    return Job.status.in_([JobStatus.PENDING.value, JobStatus.PROCESSING.value]) & ~running, running


def _ahead(rt: Runtime, job: Job) -> Ahead:
    """What is ahead of the job in its model's queue. From a snapshot of the queue at most a
    second old (one query a second per process, however many clients poll); a job newer
    than the snapshot is counted exactly, so a client's first answer is right."""
    waiting, running = _waiting()
    model = _model(rt, job.model)
    with _queues_lock:
        queues = _queues.get(rt.settings.database_url)
    if queues is None or next(iter(queues.values())).expires < time.monotonic():
        with rt.db.session() as session:
            taken_at = utcnow()
            rows = session.execute(
                select(Job.id, Job.priority, Job.created_at, Job.audio_duration, Job.model).where(waiting)
            ).all()
            in_progress: Sequence[Any] = session.execute(  # Any: the sums are coalesced, never NULL
                select(
                    Job.model,
                    func.coalesce(func.sum(Job.audio_duration - func.coalesce(Job.progress_seconds, 0.0)), 0.0),
                    func.count(),
                )
                .where(running)
                .group_by(Job.model)
            ).all()
        by_model: dict[str, list[Any]] = {}
        for row in rows:
            by_model.setdefault(_model(rt, row.model), []).append(row[:4])
        left: dict[str, tuple[float, int]] = {}
        for name, seconds, count in in_progress:
            was = left.get(_model(rt, name), (0.0, 0))
            left[_model(rt, name)] = (was[0] + float(seconds), was[1] + int(count))
        queues = {
            name: _Queue(by_model.get(name, []), *left.get(name, (0.0, 0)), taken_at)
            for name in {*by_model, *left, rt.settings.default_model}
        }
        with _queues_lock:
            _queues[rt.settings.database_url] = queues
    queue = queues.get(model) or _Queue([], 0.0, 0, next(iter(queues.values())).taken_at)
    if job.created_at < queue.taken_at - timedelta(milliseconds=50):
        return queue.ahead(job)
    mine = _rank(job.priority)
    ahead = (
        waiting
        & _of_model(rt, model)
        & (Job.id != job.id)
        & ((_rank(Job.priority) < mine) | ((_rank(Job.priority) == mine) & (Job.created_at < job.created_at)))
    )
    with rt.db.session() as session:
        found: Any = session.execute(  # Any: the sum is coalesced, never NULL
            select(
                func.count(),
                func.coalesce(func.sum(Job.audio_duration), 0.0),
                func.count().filter(Job.audio_duration.is_(None)),
            ).where(ahead)
        ).one()
        count, audio, unknown = found
    return Ahead(int(count), float(audio), int(unknown), queue.in_progress, queue.running)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None
