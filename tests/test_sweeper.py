"""The sweeper's decisions and the time-to-live, on the real database."""

from datetime import timedelta

import pytest

from models.errors import JobExpired
from models.jobs.deadletter import DeadLetter
from models.jobs.record import Job, JobStatus, new_job_id, utcnow
from models.jobs.sweeper import sweep
from models.pipeline.preparation import prepare_job


@pytest.fixture()
def own_db_rt(settings, tmp_path):
    """A database of its own: the sweeper looks at every job, and others' are in flight."""
    import dataclasses

    from models.runtime import Runtime

    runtime = Runtime(dataclasses.replace(settings, database_url=f"sqlite:///{tmp_path / 'sweep.db'}"))
    runtime.db.upgrade()
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


def test_a_job_not_started_within_its_ttl_expires_and_never_runs(own_db_rt):
    old = utcnow() - timedelta(seconds=own_db_rt.settings.job_ttl_seconds + 60)
    job_id = make(own_db_rt, created_at=old)
    with pytest.raises(JobExpired):
        prepare_job(own_db_rt, job_id, "audio/none.flac")
    job = status(own_db_rt, job_id)
    assert job.state is JobStatus.EXPIRED and job.attempts == 0 and job.started_at is None
    assert "WHISPERQ_JOB_TTL" in job.error


def test_sweeper_expires_puts_back_and_dead_letters(own_db_rt):
    now = utcnow()
    long_ago = now - timedelta(minutes=2)  # past the grace period, within the time limit
    running = dict(status="PROCESSING", attempts=1, stage="infer", audio_duration=5.0)
    stale = make(own_db_rt, created_at=now - timedelta(seconds=own_db_rt.settings.job_ttl_seconds + 60))
    fresh = make(own_db_rt)
    orphan = make(own_db_rt, **running, started_at=long_ago, created_at=long_ago, worker_id="w-dead")
    held_by_dead = make(own_db_rt, worker_id="w-dead", held_at=long_ago, created_at=long_ago)
    alive = make(own_db_rt, **running, started_at=long_ago, created_at=long_ago, worker_id="w-live")
    overdue = make(own_db_rt, **running, started_at=now - timedelta(hours=3), worker_id="w-live")
    exhausted = make(
        own_db_rt,
        **dict(running, attempts=own_db_rt.settings.max_attempts),
        started_at=long_ago,
        created_at=long_ago,
        worker_id="w-dead",
    )
    dropped = make(own_db_rt, **running, started_at=long_ago, created_at=long_ago, worker_id="w-live")
    published = []
    # Redis: nothing of these waits in a queue.
    report = sweep(own_db_rt, {"w-live": {alive, overdue}}, Publisher(published), waiting=set())

    assert stale in report.expired and status(own_db_rt, stale).state is JobStatus.EXPIRED
    assert status(own_db_rt, fresh).state is JobStatus.PENDING and fresh not in published
    assert {orphan, held_by_dead, overdue, dropped} == set(report.requeued) == set(published)
    assert "no longer holds it" in status(own_db_rt, dropped).error and status(own_db_rt, dropped).attempts == 1
    assert status(own_db_rt, orphan).state is JobStatus.PENDING and "is gone" in status(own_db_rt, orphan).error
    assert report.lost == [held_by_dead] and status(own_db_rt, held_by_dead).attempts == 0
    assert "time limit" in status(own_db_rt, overdue).error
    assert alive not in published and status(own_db_rt, alive).state is JobStatus.PROCESSING
    assert exhausted in report.dead and exhausted not in published
    assert status(own_db_rt, exhausted).state is JobStatus.FAILED
    with own_db_rt.db.session() as s:
        assert s.get(DeadLetter, exhausted).attempts == own_db_rt.settings.max_attempts


def test_on_a_broker_that_redelivers_only_jobs_past_their_time_limit_are_put_back(own_db_rt):
    now, long_ago = utcnow(), utcnow() - timedelta(minutes=2)
    running = dict(status="PROCESSING", attempts=1, stage="infer", audio_duration=5.0)
    orphan = make(own_db_rt, **running, started_at=long_ago, created_at=long_ago, worker_id="w-dead")
    overdue = make(own_db_rt, **running, started_at=now - timedelta(hours=3), worker_id="w-dead")
    published = []
    sweep(own_db_rt, {}, Publisher(published), waiting=None)  # RabbitMQ requeues orphan itself
    assert published == [overdue] and status(own_db_rt, orphan).state is JobStatus.PROCESSING


def test_a_worker_that_just_claimed_a_job_gets_a_grace_period(own_db_rt):
    job_id = make(
        own_db_rt,
        status="PROCESSING",
        attempts=1,
        stage="prepare",
        started_at=utcnow(),
        worker_id="w-starting",
        audio_duration=5.0,
    )
    published = []
    sweep(own_db_rt, {}, Publisher(published), waiting=set())
    assert job_id not in published


def test_a_message_in_no_queue_and_held_by_no_worker_is_published_again_at_no_cost(own_db_rt):
    long_ago = utcnow() - timedelta(minutes=2)
    queued = make(own_db_rt, created_at=long_ago)  # its message waits in the queue
    vanished = make(own_db_rt, created_at=long_ago)  # its message went with a broker restart
    handed_over = make(
        own_db_rt,
        status="PROCESSING",
        attempts=1,
        stage="queued",
        started_at=long_ago,
        created_at=long_ago,
        audio_duration=5.0,
    )  # prepared; its inference message was lost
    running = make(
        own_db_rt,
        status="PROCESSING",
        attempts=1,
        stage="infer",
        started_at=long_ago,
        created_at=long_ago,
        worker_id="w-live",
        audio_duration=5.0,
    )
    just_made = make(own_db_rt)  # its message may be on its way to the broker
    published = []
    report = sweep(own_db_rt, {"w-live": {running}}, Publisher(published), waiting={queued})

    assert sorted(published) == sorted([vanished, handed_over])
    assert sorted(report.lost) == sorted([vanished, handed_over])
    job = status(own_db_rt, handed_over)
    assert job.state is JobStatus.PENDING and job.attempts == 0 and "lost by the broker" in job.error
    assert status(own_db_rt, vanished).attempts == 0 and status(own_db_rt, queued).state is JobStatus.PENDING
    assert status(own_db_rt, running).state is JobStatus.PROCESSING and just_made not in published
    # Where the broker cannot list its queues (RabbitMQ), nothing is taken for lost.
    published.clear()
    sweep(own_db_rt, {"w-live": {running}}, Publisher(published), waiting=None)
    assert published == []


def test_a_job_seen_in_transit_on_the_second_look_is_left_alone(own_db_rt):
    long_ago = utcnow() - timedelta(minutes=2)
    in_transit, vanished = make(own_db_rt, created_at=long_ago), make(own_db_rt, created_at=long_ago)
    published, asked = [], []

    def second_look(ids):
        asked.append(set(ids))
        return ids - {in_transit}

    report = sweep(own_db_rt, {}, Publisher(published), waiting=set(), confirm=second_look)
    assert asked == [{in_transit, vanished}]
    assert published == [vanished] and report.lost == [vanished]


class Publisher:
    """The broker seam, recording the jobs sweep() sends again."""

    def __init__(self, sent: list):
        self.sent = sent

    def publish_job(self, job, countdown=None, reply_to=None) -> None:
        self.sent.append(job.id)
