"""Queue position and estimates from the per-process queue snapshot: the same places as
counting in the database, and no query per status read of a job that has waited."""
from __future__ import annotations

import dataclasses
import random
from datetime import timedelta

from sqlalchemy import event, select


def test_places_from_the_snapshot_match_the_database_and_cost_no_query(settings, tmp_path):
    from models import eta
    from models.job import Job, new_job_id, utcnow
    from models.runtime import Runtime

    rt = Runtime(dataclasses.replace(settings, database_url=f"sqlite:///{tmp_path / 'eta.db'}"))
    rt.db.create_all()
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
