"""Queue position and estimates from the per-process queue snapshot: the same places as
counting in the database, and no query per status read of a job that has waited; and, with
a real worker, estimates that come near when a burst's jobs really finish."""

from __future__ import annotations

import dataclasses
import random
import statistics
from datetime import datetime, timedelta

import pytest
from api import submit
from helpers import wait_until
from sqlalchemy import event, select


def test_places_from_the_snapshot_match_the_database_and_cost_no_query(settings, tmp_path):
    from models.jobs import eta
    from models.jobs.record import Job, new_job_id, utcnow
    from models.runtime import Runtime

    rt = Runtime(dataclasses.replace(settings, database_url=f"sqlite:///{tmp_path / 'eta.db'}"))
    rt.db.upgrade()
    rng, now = random.Random(7), utcnow()
    with rt.db.session() as s:
        for n in range(60):
            s.add(
                Job(
                    id=new_job_id(),
                    audio_ref="",
                    status="PENDING",
                    priority=rng.choice(["high", "normal", "low"]),
                    created_at=now - timedelta(seconds=120 - n),
                    audio_duration=rng.choice([None, 4.0, 9.5]),
                )
            )
        running = Job(
            id=new_job_id(),
            audio_ref="",
            status="PENDING",
            priority="normal",
            created_at=now - timedelta(minutes=5),
            audio_duration=30.0,
            progress_seconds=10.0,
        )
        s.add(running)
        running.start("w")
        running.stage = "infer"
    with rt.db.session() as s:
        jobs = list(s.scalars(select(Job).where(Job.status == "PENDING")))
        for job in jobs:
            s.expunge(job)
    order = sorted(jobs, key=lambda j: ({"high": 0, "normal": 1}.get(j.priority, 2), j.created_at, j.id))
    expected = {job.id: n for n, job in enumerate(order)}
    eta._queues.clear()
    assert {job.id: eta._ahead(rt, job).jobs for job in jobs} == expected
    last = order[-1]
    ahead = eta._ahead(rt, last)
    assert ahead.audio == sum(j.audio_duration or 0.0 for j in order[:-1])
    assert ahead.unknown == sum(j.audio_duration is None for j in order[:-1])
    assert (ahead.in_progress, ahead.running) == (20.0, 1)

    statements = []
    listen = lambda *args, **kwargs: statements.append(args[2])  # noqa: E731
    event.listen(rt.db.engine, "before_cursor_execute", listen)
    try:
        eta.estimate(rt, last)  # fills the worker-count and speed caches
        statements.clear()
        for job in jobs:
            eta.estimate(rt, job)
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", listen)
    assert statements == [], statements

    # A job newer than the snapshot is counted exactly: a client's first answer is right.
    with rt.db.session() as s:
        fresh = Job(
            id=new_job_id(), audio_ref="", status="PENDING", priority="high", created_at=utcnow(), audio_duration=4.0
        )
        s.add(fresh)
        s.flush()
        s.expunge(fresh)
    assert eta._ahead(rt, fresh).jobs == sum(1 for j in jobs if j.priority == "high")


def test_many_long_polls_share_one_reader(settings, tmp_path):
    """Fifty clients waiting on jobs cost one query per look (web.waits), and all wake when
    their job changes."""
    import threading

    from models.jobs.record import Job, new_job_id, utcnow
    from models.runtime import Runtime
    from web.api import job_state
    from web.statuscache import StatusCache
    from web.waits import JobWatch

    rt = Runtime(dataclasses.replace(settings, database_url=f"sqlite:///{tmp_path / 'watch.db'}"))
    rt.db.upgrade()
    ids = [new_job_id() for _ in range(5)]
    with rt.db.session() as s:
        for n, job_id in enumerate(ids):
            s.add(
                Job(
                    id=job_id,
                    audio_ref="",
                    status="PENDING",
                    priority="normal",
                    created_at=utcnow() - timedelta(minutes=10 - n),
                    audio_duration=4.0,
                )
            )
    with rt.db.session() as s:
        tags = {job_id: job_state(rt, s.get(Job, job_id)) for job_id in ids}
    watch, woke, lock = JobWatch(job_state, StatusCache(), step=0.2), [], threading.Lock()
    started = threading.Barrier(51)

    def client(job_id: str) -> None:
        started.wait(10)
        watch.wait(rt, job_id, tags[job_id], 8)
        with lock:
            woke.append(job_id)

    threads = [threading.Thread(target=client, args=(ids[n % 5],)) for n in range(50)]
    statements = []
    listen = lambda *args, **kwargs: statements.append(args[2])  # noqa: E731

    def looks() -> list[str]:
        return [q for q in list(statements) if q.lstrip().upper().startswith("SELECT") and "FROM jobs" in q]

    event.listen(rt.db.engine, "before_cursor_execute", listen)
    try:
        for t in threads:
            t.start()
        started.wait(10)
        wait_until(lambda: len(looks()) >= 5, 10, "five looks at the waited-on jobs")
        seen = len(looks())
        # Each look is one query for all fifty clients: 50 waits would be 50 queries a look.
        assert woke == [] and seen <= 8, seen
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", listen)
    with rt.db.session() as s:
        s.get(Job, ids[-1]).start("w")  # the last in the queue starts: only its waiters have news
    wait_until(lambda: len(woke) >= 10, 5, "the ten clients of the job that started woke")
    # The other forty had the same looks to wake in: one more look proves they stayed asleep.
    after = len(looks())
    event.listen(rt.db.engine, "before_cursor_execute", listen)
    try:
        wait_until(lambda: len(looks()) > after, 5, "one more look after the wake-up")
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", listen)
    assert woke == [ids[-1]] * 10, woke
    for t in threads:
        t.join(15)
    assert len(woke) == 50  # the others at their time-out


def test_a_job_waits_only_behind_jobs_of_its_model(settings, tmp_path):
    """Each model has its own queue and workers: base's jobs are not ahead of a tiny.en job,
    and a job's estimate counts only the workers that serve its model."""
    from models.jobs import eta
    from models.jobs.record import Job, new_job_id, utcnow
    from models.jobs.workers import beat
    from models.runtime import Runtime

    rt = Runtime(dataclasses.replace(settings, database_url=f"sqlite:///{tmp_path / 'models.db'}"))
    rt.db.upgrade()
    now = utcnow()
    with rt.db.session() as s:
        jobs = [
            Job(
                id=new_job_id(),
                audio_ref="",
                status="PENDING",
                priority="normal",
                model=model,
                created_at=now - timedelta(seconds=60 - n),
                audio_duration=10.0,
            )
            for n, model in enumerate(["base", None, "tiny.en", "base", "base", "tiny.en"])
        ]
        s.add_all(jobs)
        s.flush()
        for job in jobs:
            s.expunge(job)
    eta._queues.clear()
    eta._cache.clear()
    places = [(ahead.jobs, ahead.audio) for ahead in (eta._ahead(rt, job) for job in jobs)]
    assert places == [(0, 0.0), (0, 0.0), (1, 10.0), (1, 10.0), (2, 20.0), (2, 20.0)]
    assert eta.estimate(rt, jobs[0])["estimated_start_at"] is None  # no worker serves base yet
    beat(rt, "w-tiny", "host", "inference", 8, now, ("tiny.en",))
    eta._cache.clear()
    assert eta.estimate(rt, jobs[0])["estimated_start_at"] is None
    assert eta.estimate(rt, jobs[5])["estimated_start_at"] is not None
    beat(rt, "w-base", "host", "inference", 8, now, ("base",))
    eta._cache.clear()
    assert eta.estimate(rt, jobs[4])["queue_position"] == 2 and eta.estimate(rt, jobs[4])["estimated_start_at"]
    # a job newer than the snapshot is counted exactly, among its model's jobs
    with rt.db.session() as s:
        fresh = Job(
            id=new_job_id(),
            audio_ref="",
            status="PENDING",
            priority="high",
            model="base",
            created_at=utcnow(),
            audio_duration=4.0,
        )
        s.add(fresh)
        s.flush()
        s.expunge(fresh)
    assert eta._ahead(rt, fresh).jobs == 0


def _finished(rt, job_id: str):
    """The job's row once it is finished (read from the database: polling the API this often
    would be answered 429, web.pollrate)."""
    from models.jobs.operations import get_job

    job = get_job(rt, job_id)
    return job if job.state.finished else None


BURST = 30


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_a_burst_finishes_near_its_estimates(app, client, worker):
    """Jobs run one by one, then a burst of 30 at once, as `make bench-estimates` sends it:
    every 202 carries an estimated finish, and their median distance from the real finish is
    within 40 % of the jobs' time in the service (bench/estimates.py holds the stack to 25 %)."""
    from models.jobs import eta
    from models.jobs.workers import alive

    rt = app.extensions["whisperq"]
    model = rt.settings.default_model
    # Jobs earlier tests recorded without publishing them (the session's database is shared) would
    # stand in this burst's queue for ever: the estimate rightly counts them, the worker never sees them.
    from sqlalchemy import update

    from models.jobs.record import Job as JobRow

    with rt.db.session() as session:
        session.execute(
            update(JobRow)
            .where(JobRow.status.in_(("PENDING", "PROCESSING")))
            .values(status="FAILED", error="left unpublished by an earlier test")
        )
    for _ in range(3):  # the pool measures its speed on them (the first batch of a process loads the model)
        job_id = submit(client, "report.opus")["job_id"]
        wait_until(lambda job_id=job_id: _finished(rt, job_id), 120, f"job {job_id} finished")
    # ... and on full batches: a pool in service has run batches of every size, the session's
    # worker may have run only single windows so far (the fit needs both to tell a window's cost
    # from a batch's)
    warm = [submit(client, "report.opus")["job_id"] for _ in range(8)]
    for job_id in warm:
        wait_until(lambda job_id=job_id: _finished(rt, job_id), 120, f"job {job_id} finished")
    wait_until(
        lambda: any((w["throughput"].get(model) or {}).get("slowdown") for w in alive(rt, "inference")),
        30,
        "the inference worker published its speed in its heartbeat",
    )
    # The door reads the heartbeats at most once a second (eta.QUEUE_SNAPSHOT_SECONDS): a burst sent
    # within that second of the last single job's status read would be estimated from the older beat.
    wait_until(
        lambda: any(w.slowdown for w in eta._inference_workers(rt, model)), 30, "the door reads the measured speed"
    )
    # ... and the recent jobs (their lead from upload to inference, their typical length), also
    # cached briefly: read before these jobs finished (an earlier test's empty queue), it holds defaults.
    wait_until(lambda: eta._history(rt, model)[1] != eta.DEFAULT_DURATION, 60, "the door reads the recent jobs")

    sent = [submit(client, "report.opus") for _ in range(BURST)]
    assert all(job["estimated_finish_at"] for job in sent), sent
    done = {
        job["job_id"]: wait_until(lambda j=job["job_id"]: _finished(rt, j), 300, f"job {job['job_id']} finished")
        for job in sent
    }

    def at(text: str) -> float:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()

    errors = []
    for job in sent:
        finished = done[job["job_id"]].finished_at.timestamp()
        took = finished - at(job["created_at"])
        errors.append(abs(at(job["estimated_finish_at"]) - finished) / took)
    assert all(job.status == "COMPLETED" for job in done.values()), {j: job.error for j, job in done.items()}
    # The session's pools are not the stack `whisperq run` starts (one prepare process, the batches
    # of earlier tests in its meter): here the median ranged 17 to 32 %. The 25 % target is held by
    # bench/estimates.py on the stack as users run it, in CI (bench/ci.py), where a miss fails.
    assert statistics.median(errors) <= 0.4, sorted(round(e, 2) for e in errors)


def test_the_speed_is_measured_by_windows_speech_and_batches_running_at_once():
    """A batch's cost is fitted as per window plus per speech second; two batches side by side
    measure how much slower each runs then. The estimate spreads work over the lanes it fills
    and never counts on a lane count not measured yet going faster than one below it."""
    from pytest import approx

    from models.jobs.eta import _Served
    from models.jobs.throughput import Meter

    meter = Meter(lanes=2, batch=2)
    meter.record(0.0, 9.0, 1, 30.0)  # the first batch of a process loads the model: left out
    meter.record(10.0, 10.5, 1, 10.0)  # alone: 0.3 s a window + 0.02 s a speech second
    meter.record(11.0, 11.9, 1, 30.0)
    meter.record(12.0, 14.6, 2, 40.0)  # two side by side, each twice as slow as alone
    meter.record(12.0, 14.6, 2, 40.0)
    figures = meter.figures()
    assert figures["lanes"] == 2 and figures["batch"] == 2
    assert figures["slowdown"]["2"] / figures["slowdown"]["1"] == approx(2.0, rel=0.1)

    served = _Served(lanes=2, batch=2, slots=8, window=0.3, speech=0.02, slowdown={1: 1.0, 2: 2.0})
    assert served.seconds(windows=1, audio=10.0) == approx(0.5)  # one lane
    assert served.seconds(windows=8, audio=80.0) == approx(2.0 * 4.0 / 2)  # both lanes, each twice as slow
    assert _Served(lanes=2, batch=2, slots=8, window=0.3, speech=0.02, slowdown={1: 1.0}).seconds(
        windows=8, audio=80.0
    ) == approx(4.0)  # two lanes not measured: no faster than one
    assert _Served(lanes=2, batch=2, slots=2, window=0.3, speech=0.02, slowdown={1: 1.0, 2: 2.0}).seconds(
        windows=8, audio=80.0
    ) == approx(4.0)  # two slots fill one lane only
    assert _Served.of({"slots": 8, "throughput": {"tiny.en": figures}}, "tiny.en").seconds(1, 10.0) > 0
    assert _Served.of({"slots": 8, "throughput": {}}, "tiny.en").seconds(windows=4, audio=40.0) is None
