"""Queue position and estimates from the per-process queue snapshot: the same places as
counting in the database, and no query per status read of a job that has waited."""
from __future__ import annotations

import dataclasses
import random
from datetime import timedelta

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
            s.add(Job(id=new_job_id(), audio_ref="", status="PENDING", priority=rng.choice(["high", "normal", "low"]),
                      created_at=now - timedelta(seconds=120 - n), audio_duration=rng.choice([None, 4.0, 9.5])))
        running = Job(id=new_job_id(), audio_ref="", status="PENDING", priority="normal", created_at=now - timedelta(minutes=5),
                      audio_duration=30.0, progress_seconds=10.0)
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
    assert {job.id: eta._ahead(rt, job)[0] for job in jobs} == expected
    last = order[-1]
    count, audio, unknown, in_progress = eta._ahead(rt, last)
    assert audio == sum(j.audio_duration or 0.0 for j in order[:-1])
    assert unknown == sum(j.audio_duration is None for j in order[:-1]) and in_progress == 20.0

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
        fresh = Job(id=new_job_id(), audio_ref="", status="PENDING", priority="high", created_at=utcnow(), audio_duration=4.0)
        s.add(fresh)
        s.flush()
        s.expunge(fresh)
    assert eta._ahead(rt, fresh)[0] == sum(1 for j in jobs if j.priority == "high")


def test_many_long_polls_share_one_reader(settings, tmp_path):
    """Fifty clients waiting on jobs cost one query per look (web.waits), and all wake when
    their job changes."""
    import threading
    import time

    from models.jobs.record import Job, new_job_id, utcnow
    from models.runtime import Runtime
    from web.api import job_state
    from web.waits import JobWatch

    rt = Runtime(dataclasses.replace(settings, database_url=f"sqlite:///{tmp_path / 'watch.db'}"))
    rt.db.upgrade()
    ids = [new_job_id() for _ in range(5)]
    with rt.db.session() as s:
        for n, job_id in enumerate(ids):
            s.add(Job(id=job_id, audio_ref="", status="PENDING", priority="normal",
                      created_at=utcnow() - timedelta(minutes=10 - n), audio_duration=4.0))
    with rt.db.session() as s:
        tags = {job_id: job_state(rt, s.get(Job, job_id)) for job_id in ids}
    watch, woke = JobWatch(job_state, step=0.2), []
    threads = [threading.Thread(target=lambda j=ids[n % 5]: (watch.wait(rt, j, tags[j], 4), woke.append(j)))
               for n in range(50)]
    statements = []
    listen = lambda *args, **kwargs: statements.append(args[2])  # noqa: E731
    event.listen(rt.db.engine, "before_cursor_execute", listen)
    try:
        for t in threads:
            t.start()
        time.sleep(1.1)  # about five looks
        looks = [q for q in statements if q.lstrip().upper().startswith("SELECT") and "FROM jobs" in q]
        assert woke == [] and 1 <= len(looks) <= 8, len(looks)  # one query per look (about five), none per client
    finally:
        event.remove(rt.db.engine, "before_cursor_execute", listen)
    with rt.db.session() as s:
        s.get(Job, ids[-1]).start("w")  # the last in the queue starts: only its waiters have news
    time.sleep(0.8)
    assert woke == [ids[-1]] * 10, woke
    for t in threads:
        t.join(10)
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
        jobs = [Job(id=new_job_id(), audio_ref="", status="PENDING", priority="normal", model=model,
                    created_at=now - timedelta(seconds=60 - n), audio_duration=10.0)
                for n, model in enumerate(["base", None, "tiny.en", "base", "base", "tiny.en"])]
        s.add_all(jobs)
        s.flush()
        for job in jobs:
            s.expunge(job)
    eta._queues.clear()
    eta._cache.clear()
    assert [eta._ahead(rt, job)[:2] for job in jobs] == [(0, 0.0), (0, 0.0), (1, 10.0), (1, 10.0), (2, 20.0),
                                                          (2, 20.0)]
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
        fresh = Job(id=new_job_id(), audio_ref="", status="PENDING", priority="high", model="base",
                    created_at=utcnow(), audio_duration=4.0)
        s.add(fresh)
        s.flush()
        s.expunge(fresh)
    assert eta._ahead(rt, fresh)[0] == 0
