"""The sweeper's decisions and the time-to-live, on the real database."""
from datetime import timedelta

import pytest

from models.deadletter import DeadLetter
from models.errors import JobExpired
from models.job import Job, JobStatus, new_job_id, utcnow
from models.jobs import prepare_job
from models.sweeper import sweep


@pytest.fixture()
def rt(settings, tmp_path):
    """A database of its own: the sweeper looks at every job, and others' are in flight."""
    import dataclasses

    from models.runtime import Runtime

    runtime = Runtime(dataclasses.replace(settings, database_url=f"sqlite:///{tmp_path / 'sweep.db'}"))
    runtime.db.create_all()
    return runtime


def make(rt, **fields) -> str:
    job_id = new_job_id()
    with rt.db.session() as s:
        s.add(Job(id=job_id, audio_ref="audio/none.flac", priority="normal", **{"attempts": 0, **fields}))
    return job_id


def status(rt, job_id) -> Job:
    with rt.db.session() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def test_a_job_not_started_within_its_ttl_expires_and_never_runs(rt):
    old = utcnow() - timedelta(seconds=rt.settings.job_ttl_seconds + 60)
    job_id = make(rt, created_at=old)
    with pytest.raises(JobExpired):
        prepare_job(rt, job_id, "audio/none.flac")
    job = status(rt, job_id)
    assert job.state is JobStatus.EXPIRED and job.attempts == 0 and job.started_at is None
    assert "WHISPERQ_JOB_TTL" in job.error


def test_sweeper_expires_put_back_and_buries(rt):
    now = utcnow()
    long_ago = now - timedelta(minutes=2)  # past the grace period, within the time limit
    stale = make(rt, created_at=now - timedelta(seconds=rt.settings.job_ttl_seconds + 60))
    fresh = make(rt)
    orphan = make(rt, status="PROCESSING", attempts=1, started_at=long_ago, created_at=long_ago, worker_id="w-dead", audio_duration=5.0)
    held_by_dead = make(rt, worker_id="w-dead", held_at=long_ago, created_at=long_ago)
    alive = make(rt, status="PROCESSING", attempts=1, started_at=long_ago, created_at=long_ago, worker_id="w-live", audio_duration=5.0)
    overdue = make(rt, status="PROCESSING", attempts=1, started_at=now - timedelta(hours=3), worker_id="w-live",
                   audio_duration=5.0)
    exhausted = make(rt, status="PROCESSING", attempts=rt.settings.max_attempts, started_at=long_ago, created_at=long_ago,
                     worker_id="w-dead", audio_duration=5.0)
    published = []
    lost = make(rt, status="PROCESSING", attempts=1, started_at=long_ago, created_at=long_ago, worker_id="w-live",
                audio_duration=5.0)
    report = sweep(rt, {"w-live": {alive, overdue}}, lambda job: published.append(job.id))

    assert stale in report.expired and status(rt, stale).state is JobStatus.EXPIRED
    assert status(rt, fresh).state is JobStatus.PENDING and fresh not in published
    assert {orphan, held_by_dead, overdue, lost} <= set(report.requeued) <= set(published)
    assert "no longer holds it" in status(rt, lost).error
    assert status(rt, orphan).state is JobStatus.PENDING and "is gone" in status(rt, orphan).error
    assert "time limit" in status(rt, overdue).error
    assert alive not in published and status(rt, alive).state is JobStatus.PROCESSING
    assert exhausted in report.dead and exhausted not in published
    assert status(rt, exhausted).state is JobStatus.FAILED
    with rt.db.session() as s:
        assert s.get(DeadLetter, exhausted).attempts == rt.settings.max_attempts


def test_a_worker_that_just_claimed_a_job_gets_a_grace_period(rt):
    job_id = make(rt, status="PROCESSING", attempts=1, started_at=utcnow(), worker_id="w-starting", audio_duration=5.0)
    published = []
    sweep(rt, {}, lambda job: published.append(job.id))
    assert job_id not in published
