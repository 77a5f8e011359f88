from datetime import UTC

import pytest

from models.jobs.record import InvalidTransition, Job, JobStatus, new_job_id


def make_job(database, **kw) -> Job:
    job = Job(id=new_job_id(), audio_ref="audio/x.flac", priority="normal", **kw)
    with database.session() as s:
        s.add(job)
    return job


def load(database, job_id) -> Job:
    with database.session() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def test_a_job_moves_pending_processing_completed(database):
    job = make_job(database)
    assert load(database, job.id).state is JobStatus.PENDING
    with database.session() as s:
        j = s.get(Job, job.id)
        j.start("w1")
    with database.session() as s:
        j = s.get(Job, job.id)
        assert j.state is JobStatus.PROCESSING and j.attempts == 1 and j.worker == "w1"
        j.complete("hi", "en", [{"start": 0.0, "end": 1.0, "text": "hi"}], 1.0)
    done = load(database, job.id)
    assert done.state is JobStatus.COMPLETED
    assert done.result() == {
        "job_id": job.id,
        "text": "hi",
        "language": "en",
        "duration": 1.0,
        "segments": [{"start": 0.0, "end": 1.0, "text": "hi"}],
    }
    for stamp in (done.created_at, done.started_at, done.finished_at):
        assert stamp.tzinfo is not None and stamp.utcoffset() == UTC.utcoffset(None)
    assert done.created_at <= done.started_at <= done.finished_at
    assert done.to_dict()["finished_at"].endswith("Z")


def test_redelivery_restarts_a_processing_job_and_counts_the_attempt(database):
    job = make_job(database)
    with database.session() as s:
        s.get(Job, job.id).start("w1")
    with database.session() as s:
        s.get(Job, job.id).start("w2")  # the first worker died; the message came back
    assert load(database, job.id).attempts == 2


@pytest.mark.parametrize("finished", ["complete", "fail"])
def test_a_finished_job_cannot_move_again(database, finished):
    job = make_job(database)
    with database.session() as s:
        j = s.get(Job, job.id)
        j.start()
        j.complete("x", "en", [], 1.0) if finished == "complete" else j.fail("bad audio")
    with database.session() as s:
        j = s.get(Job, job.id)
        with pytest.raises(InvalidTransition, match="cannot go from"):
            j.start()
        with pytest.raises(InvalidTransition):
            j.fail("again")


def test_result_is_none_until_completed(database):
    job = make_job(database)
    assert load(database, job.id).result() is None
    assert load(database, job.id).to_dict()["result"] is None
