"""Encryption at rest through the whole service: a real job whose files and transcript are never on
disk in plaintext, a transcript under a missing key answered with what to fix, and no path that
publishes an API job asking the result backend to keep its transcript. The file format, the
keys and values, storage and rotation have their own tests (test_sealed, test_crypto,
test_sealed_storage, test_key_rotation)."""

from __future__ import annotations

import base64
import dataclasses
import os
from datetime import UTC, datetime

import pytest
from api import bearer, submit_id, upload, wait_for_job
from helpers import CLIPS, word_error_rate
from keyrings import FOX, PLAIN_MAGIC, assert_not_plain
from sqlalchemy import text

pytestmark = pytest.mark.usefixtures("keyring_restored")  # tests here switch the process's keys


@pytest.mark.integration
def test_a_real_job_leaves_nothing_in_plaintext(client, settings, database, worker, caplog, celery_app):
    caplog.set_level("DEBUG")
    name = "board-meeting-7f3a.flac"
    resp = upload(client, name, data=FOX, language="en")
    assert resp.status_code == 202, resp.get_json()
    job_id = resp.get_json()["job_id"]
    done = wait_for_job(client, job_id)
    assert done["status"] == "COMPLETED", done
    words = done["result"]["text"]
    assert word_error_rate(CLIPS["fox.flac"]["text"], words) < 0.25

    checked = 0
    for path in settings.data_dir.rglob("*"):
        if (
            not path.is_file()
            or path.name.startswith("whisperq.db")
            or path.name in ("encryption-key", "webhook-secret")
            or path.relative_to(settings.data_dir).parts[0] == "models"
        ):  # converted model weights
            continue
        data = path.read_bytes()
        assert not data.startswith(PLAIN_MAGIC), f"{path} is plaintext audio"
        assert FOX[1000:3000] not in data
        checked += 1
    assert checked >= 1
    with database.session() as s:
        ref, raw_text, raw_segments = s.execute(
            text("SELECT audio_ref, result_text, result_segments FROM jobs WHERE id = :id"), {"id": job_id}
        ).one()
    assert_not_plain(settings.data_dir / ref, FOX)
    for raw in (raw_text, str(raw_segments)):
        # (not a bare "fox": three letters turn up in base64 by chance about once in a thousand runs)
        assert "wqe2:" in raw and "brown fox" not in raw.lower() and words.strip()[:12] not in raw
    for logs in (worker.output(), caplog.text):  # the workers', and the web's (this process)
        assert name not in logs and words.strip() not in logs
    # Nor does the result backend (Redis, or the database on RabbitMQ) keep a copy: an API
    # job's messages ask it to keep nothing, through preparation, inference and retries.
    assert celery_app.backend.get_task_meta(job_id)["status"] == "PENDING"


def test_a_transcript_under_a_missing_key_is_a_clear_error(client, database):
    """A row sealed under a key the server no longer has: the API says what to fix."""
    import uuid

    from sqlalchemy import text as sql

    job_id = str(uuid.uuid4())
    with database.session() as s:
        s.execute(
            sql(
                "INSERT INTO jobs (id, status, task, priority, audio_ref, audio_owned, attempts, created_at, "
                "result_text) VALUES (:id, 'COMPLETED', 'transcribe', 'normal', '', true, 1, :now, :text)"
            ),
            {
                "id": job_id,
                "now": datetime.now(UTC).replace(tzinfo=None),
                "text": "wqe1:gone:" + base64.b64encode(bytes(40)).decode(),
            },
        )
    try:
        resp = client.get(f"/v1/jobs/{job_id}")
        assert resp.status_code == 500
        assert resp.get_json()["error"]["code"] == "decryption_failed"
        assert "WHISPERQ_ENCRYPTION_KEYS" in resp.get_json()["error"]["message"]
    finally:
        with database.session() as s:
            s.execute(sql("DELETE FROM jobs WHERE id = :id"), {"id": job_id})


@pytest.mark.parametrize("path", ["first publish", "retry", "sweeper", "dead-letter replay"])
def test_every_path_that_publishes_an_api_job_keeps_it_out_of_the_result_backend(
    client, celery_app, published, database, settings, monkeypatch, path
):
    """An API job's transcript lives in its row, encrypted: no message for it may ask the
    result backend to keep one. A transcribe.delay() job keeps its result for .get().
    Each path publishes as it does in service: the door; the task's own retry after a
    transient failure; a sweeper pass finding the job's message lost; an operator's replay."""
    from datetime import timedelta

    from sqlalchemy import select

    from models.jobs.deadletter import move_to_dead_letters
    from models.jobs.operations import get_job
    from models.jobs.record import Job, JobStatus
    from models.jobs.sweeper import sweep
    from models.security.signing import HEADER, sign
    from tasks import transcribe
    from tasks.broker import CeleryBroker, publish_transcribe

    rt = client.application.extensions["whisperq"]
    if path == "first publish":
        job_id = submit_id(client)
    else:
        with monkeypatch.context() as m:  # its first message is lost: no worker runs it meanwhile
            m.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: None)
            job_id = submit_id(client)
        published.clear()
    if path == "retry":
        job = get_job(rt, job_id)
        stored = rt.storage.path(job.audio_ref)
        away = stored.rename(stored.with_name(stored.name + ".away"))  # shared storage has not caught up yet
        try:
            kwargs = {"language": job.language, "priority": job.priority}
            transcribe.apply(
                args=[job.audio_ref],
                kwargs=kwargs,
                task_id=job_id,
                headers={HEADER: sign("whisperq.transcribe", [job.audio_ref], kwargs)},  # as the service sent it
            )  # the task as a worker runs it, here
        finally:
            away.rename(stored)
        assert get_job(rt, job_id).next_attempt_at is not None  # it went the retry's way
    elif path == "sweeper":
        with database.session() as s:  # every other job's message is taken to be in the queue: left alone
            others = set(
                s.scalars(
                    select(Job.id).where(
                        Job.status.in_([JobStatus.PENDING.value, JobStatus.PROCESSING.value]), Job.id != job_id
                    )
                )
            )
        report = sweep(rt, {}, grace=timedelta(0), waiting=others)
        assert job_id in report.requeued
    elif path == "dead-letter replay":
        move_to_dead_letters(rt, job_id, "whisperq.transcribe", "gave up", None)
        resp = client.post(
            f"/v1/admin/dead-letters/{job_id}/replay", headers=bearer(os.environ["WHISPERQ_ADMIN_TOKEN"])
        )
        assert resp.status_code == 202, resp.get_json()
    mine = [headers for headers, _body in published if headers["id"] == job_id]
    assert mine and all(headers["ignore_result"] is True for headers in mine), mine
    job = get_job(rt, job_id)
    delay_job = dataclasses.replace(job) if dataclasses.is_dataclass(job) else job
    delay_job.origin = "delay"  # as the preparation pool records a transcribe.delay() job
    published.clear()
    publish_transcribe(celery_app, delay_job)
    assert published[-1][0]["ignore_result"] is False
