"""Retention: audio and transcripts of ended jobs are deleted once their time has passed,
and nothing else is; leftover files are removed only past their age.

Each test has a database and a data dir of its own (retention looks at every job and
every file, and other tests' are in flight): a SQLite file, or a private schema of the
PostgreSQL database the suite runs on."""

from __future__ import annotations

import dataclasses
import io
import os
import threading
import uuid
from datetime import timedelta

import pytest
from helpers import wait_until
from sqlalchemy import select

from models.delivery.notify import WebhookDelivery
from models.errors import AudioPurged
from models.jobs.deadletter import DeadLetter, replay, take_for_replay
from models.jobs.record import Job, JobStatus, new_job_id, utcnow
from models.maintenance.retention import COUNTS, run_retention

HOUR, DAY = timedelta(hours=1), timedelta(days=1)
ADMIN = {"Authorization": f"Bearer {os.environ.get('WHISPERQ_ADMIN_TOKEN', '')}"}
# A pass that deleted nothing, from the product's own list: the tests below still name every
# count they expect (dict(NOTHING, audio_purged=7), counts["errors"]), so one renamed or gone fails.
NOTHING = dict.fromkeys(COUNTS, 0)


@pytest.fixture()
def retention_rt(settings, private_db, tmp_path):
    from models.runtime import Runtime

    # No publisher: outbox rows made here are not published (no worker reads this database).
    runtime = Runtime(
        dataclasses.replace(
            settings,
            database_url=private_db,
            data_dir=tmp_path / "data",
            audio_retention_seconds=3600.0,
            result_retention_seconds=7 * 86400.0,
        )
    )
    runtime.db.upgrade()
    yield runtime
    runtime.db.dispose()


def make(
    rt,
    status: str = "COMPLETED",
    ended: timedelta | None = None,
    *,
    caller_file=None,
    dead: bool = False,
    prepared: bool = True,
    **fields,
) -> str:
    """A job `ended` ago (None: not ended), with its stored upload (or the caller's own
    file), its prepared samples, a transcript, a callback (so a webhook delivery row) and
    optionally a dead letter."""
    import numpy as np

    job_id, now = new_job_id(), utcnow()
    if caller_file is None:
        ref, owned = store(rt, job_id, ".wav"), True
    else:
        caller_file.write_bytes(b"the caller's own audio")
        ref, owned = str(caller_file), False
    if prepared:
        rt.storage.save_samples(job_id, np.zeros(160, dtype=np.float32))
    values = dict(
        id=job_id,
        status=status,
        audio_ref=ref,
        audio_owned=owned,
        filename="call.wav",
        prompt="Acme Corp",
        created_at=now - (ended or timedelta(0)) - timedelta(minutes=5),
        attempts=1,
        priority="normal",
        finished_at=now - ended if ended is not None else None,
        callback_url="http://127.0.0.1:9/hook",
        result_text="secret words",
        result_language="en",
        result_segments=[{"start": 0.0, "end": 1.0, "text": "secret words"}],
        audio_duration=1.0,
    )
    values.update(fields)
    with rt.db.session() as s:
        s.add(Job(**values))
    if dead:
        with rt.db.session() as s:
            s.add(
                DeadLetter(
                    job_id=job_id,
                    task="whisperq.transcribe",
                    error="boom",
                    traceback="Traceback ...",
                    attempts=3,
                    replays=0,
                    message={"audio": ref},
                )
            )
    return job_id


def store(rt, job_id: str, suffix: str) -> str:
    """An upload as the store keeps it: `audio/<id[:2]>/<id><suffix>`."""
    ref = f"audio/{job_id[:2]}/{job_id}{suffix}"
    path = rt.storage.root / ref
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"RIFF fake audio")
    return ref


def spool(rt):
    """An upload being received, as the web process spools it into tmp/."""
    spooled = rt.storage.spool(io.BytesIO(b"an upload in progress"))
    return getattr(spooled, "path", spooled)


def row(rt, job_id: str) -> Job:
    with rt.db.session() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


def audio_of(rt, job_id: str):
    return rt.storage.root / "audio" / job_id[:2] / f"{job_id}.wav"


def prepared_of(rt, job_id: str):
    return rt.storage.root / "prepared" / job_id[:2] / f"{job_id}.npy"


def deliveries(rt, job_id: str) -> int:
    with rt.db.session() as s:
        return len(s.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)).all())


def dead_letter(rt, job_id: str) -> DeadLetter | None:
    with rt.db.session() as s:
        return s.get(DeadLetter, job_id)


def test_audio_after_an_hour_and_transcripts_after_a_week_and_nothing_else(retention_rt, tmp_path):
    caller = tmp_path / "caller"
    caller.mkdir()
    week_old = make(retention_rt, "COMPLETED", 8 * DAY)
    two_hours = make(retention_rt, "COMPLETED", 2 * HOUR)
    recent = make(retention_rt, "COMPLETED", 10 * timedelta(minutes=1))
    failed = make(retention_rt, "FAILED", 2 * HOUR, dead=True, error="the audio could not be decoded")
    failed_old = make(retention_rt, "FAILED", 8 * DAY, dead=True)
    cancelled = make(retention_rt, "CANCELLED", 2 * HOUR)
    expired = make(retention_rt, "EXPIRED", 2 * HOUR, prepared=False, result_text=None, result_segments=None)
    pending = make(
        retention_rt, "PENDING", None, created_at=utcnow() - 30 * DAY, result_text=None, result_segments=None
    )
    running = make(
        retention_rt,
        "PROCESSING",
        None,
        created_at=utcnow() - 30 * DAY,
        started_at=utcnow() - 29 * DAY,
        stage="infer",
        result_text=None,
        result_segments=None,
    )
    theirs = make(retention_rt, "COMPLETED", 8 * DAY, caller_file=caller / "theirs.wav")
    assert deliveries(retention_rt, week_old) == 1  # the outbox row of its job.completed webhook

    counts = run_retention(retention_rt)

    # Audio: the six ended over an hour ago, and the caller's job (its prepared copy only).
    assert counts == dict(
        NOTHING,
        audio_purged=7,
        results_purged=3,
        files_deleted=12,
        webhook_deliveries_deleted=3,
        dead_letters_deleted=1,
    )
    for job_id in (week_old, two_hours, failed, failed_old, cancelled, expired):
        job = row(retention_rt, job_id)
        assert job.audio_purged_at is not None and job.audio_ref == ""
        assert not audio_of(retention_rt, job_id).exists() and not prepared_of(retention_rt, job_id).exists()
    for job_id in (week_old, failed_old, theirs):
        job = row(retention_rt, job_id)
        assert job.result_purged_at is not None and job.status in ("COMPLETED", "FAILED")
        assert (job.result_text, job.result_segments, job.result_language) == (None, None, None)
        assert (job.filename, job.prompt, job.audio_url, job.callback_url) == (None, None, None, None)
        assert deliveries(retention_rt, job_id) == 0
    # Younger than a week: the transcript and what came with it stay.
    for job_id in (two_hours, failed, cancelled):
        job = row(retention_rt, job_id)
        assert job.result_purged_at is None and job.filename == "call.wav" and job.callback_url
        assert deliveries(retention_rt, job_id) == 1
    assert row(retention_rt, two_hours).result()["text"] == "secret words"
    assert dead_letter(retention_rt, failed) is not None and dead_letter(retention_rt, failed_old) is None
    assert row(retention_rt, failed).error == "the audio could not be decoded"
    # Younger than an hour, or not ended however old: untouched.
    for job_id in (recent, pending, running):
        job = row(retention_rt, job_id)
        assert job.audio_purged_at is None and job.result_purged_at is None and job.audio_ref
        assert audio_of(retention_rt, job_id).exists() and prepared_of(retention_rt, job_id).exists()
    assert row(retention_rt, running).status == "PROCESSING" and row(retention_rt, pending).status == "PENDING"
    # The caller's own file stays; only the prepared copy went, and the path with the transcript.
    assert (caller / "theirs.wav").read_bytes() == b"the caller's own audio"
    assert not prepared_of(retention_rt, theirs).exists()
    assert row(retention_rt, theirs).audio_purged_at is not None and row(retention_rt, theirs).audio_ref == ""

    assert run_retention(retention_rt) == NOTHING  # idempotent
    # An hour and a week later, the recent job goes the same way; the others stay as they are.
    later = run_retention(retention_rt, now=utcnow() + 7 * DAY)
    assert later["audio_purged"] == 1 and later["results_purged"] == 5
    assert row(retention_rt, running).status == "PROCESSING" and audio_of(retention_rt, running).exists()
    assert audio_of(retention_rt, pending).exists() and prepared_of(retention_rt, pending).exists()


def test_work_goes_in_batches_and_overlapping_runs_share_it(retention_rt):
    jobs = [make(retention_rt, "COMPLETED", 8 * DAY) for _ in range(24)]
    results: list[dict] = []

    def one_run():
        results.append(run_retention(retention_rt, batch=5))

    runs = [threading.Thread(target=one_run) for _ in range(2)]
    for t in runs:
        t.start()
    for t in runs:
        t.join(60)
    assert len(results) == 2 and all(r["errors"] == 0 for r in results)
    assert sum(r["audio_purged"] for r in results) == 24 and sum(r["results_purged"] for r in results) == 24
    assert sum(r["webhook_deliveries_deleted"] for r in results) == 24
    assert sum(r["files_deleted"] for r in results) == 48
    assert all(row(retention_rt, j).audio_purged_at and row(retention_rt, j).result_purged_at for j in jobs)


def test_off_keeps_everything(retention_rt):
    retention_rt.settings = dataclasses.replace(
        retention_rt.settings, audio_retention_seconds=None, result_retention_seconds=None
    )
    old = make(retention_rt, "COMPLETED", 400 * DAY)
    failed = make(retention_rt, "FAILED", 400 * DAY, dead=True)
    assert run_retention(retention_rt) == NOTHING
    for job_id in (old, failed):
        job = row(retention_rt, job_id)
        assert job.audio_purged_at is None and job.result_purged_at is None and job.result_text == "secret words"
        assert audio_of(retention_rt, job_id).exists() and prepared_of(retention_rt, job_id).exists()
        assert deliveries(retention_rt, job_id) == 1
    assert dead_letter(retention_rt, failed) is not None


def test_leftover_files_go_only_past_their_age(retention_rt):
    import numpy as np

    spooled = spool(retention_rt)
    lost = new_job_id()  # stored, then the web process died before its row was written
    lost_audio = store(retention_rt, lost, ".flac")
    lost_prepared = retention_rt.storage.save_samples(new_job_id(), np.zeros(16, dtype=np.float32))
    cut_short = retention_rt.storage.root / "prepared" / lost[:2] / f".{lost}.npy.k2j4x9.part"  # a write that crashed
    cut_short.parent.mkdir(parents=True, exist_ok=True)
    cut_short.write_bytes(b"half")
    # A running job deleted by its client, whose worker wrote its samples and then died.
    deleted = make(
        retention_rt,
        "PROCESSING",
        None,
        stage="prepare",
        prepared=False,
        deleted_at=utcnow(),
        audio_ref="",
        cancel_requested=True,
    )
    deleted_prepared = retention_rt.storage.save_samples(deleted, np.zeros(16, dtype=np.float32))
    live = make(retention_rt, "PENDING", None, result_text=None, result_segments=None)
    foreign = retention_rt.storage.root / "audio" / "xx" / "notes.txt"
    foreign.parent.mkdir(parents=True, exist_ok=True)
    foreign.write_text("not a name whisperq writes")
    paths = [retention_rt.storage.path(r) for r in (lost_audio, lost_prepared, deleted_prepared)]
    paths += [audio_of(retention_rt, deleted), cut_short]

    now = utcnow()
    assert run_retention(retention_rt, now=now) == NOTHING  # all just written
    assert run_retention(retention_rt, now=now + 50 * timedelta(minutes=1)) == NOTHING
    assert run_retention(retention_rt, now=now + 2 * HOUR) == dict(NOTHING, orphans_deleted=5)
    assert not any(p.exists() for p in paths)
    assert spooled.exists() and foreign.exists()
    assert audio_of(retention_rt, live).exists() and prepared_of(retention_rt, live).exists()
    assert run_retention(retention_rt, now=now + 23 * HOUR) == NOTHING
    assert run_retention(retention_rt, now=now + 25 * HOUR) == dict(NOTHING, tmp_deleted=1)
    assert not spooled.exists() and foreign.exists()
    # not ended: never touched
    assert audio_of(retention_rt, live).exists() and prepared_of(retention_rt, live).exists()


def test_a_purge_whose_file_delete_failed_is_finished_by_the_orphan_sweep(retention_rt, monkeypatch):
    job_id = make(retention_rt, "COMPLETED", 2 * HOUR)
    real = type(retention_rt.storage).delete
    monkeypatch.setattr(
        type(retention_rt.storage), "delete", lambda self, ref: (_ for _ in ()).throw(PermissionError(ref))
    )
    counts = run_retention(retention_rt)
    assert counts["audio_purged"] == 1 and counts["errors"] == 2 and prepared_of(retention_rt, job_id).exists()
    monkeypatch.setattr(type(retention_rt.storage), "delete", real)
    assert run_retention(retention_rt)["orphans_deleted"] == 0  # the files are younger than an hour
    counts = run_retention(retention_rt, now=utcnow() + 2 * HOUR)
    assert counts == dict(NOTHING, orphans_deleted=2)
    assert not audio_of(retention_rt, job_id).exists() and not prepared_of(retention_rt, job_id).exists()


def test_a_purged_job_still_answers_and_its_transcript_is_gone(retention_rt):
    from web import create_app

    client = create_app({"SETTINGS": retention_rt.settings, "TESTING": True}).test_client()
    old = make(retention_rt, "COMPLETED", 8 * DAY)
    audio_only = make(retention_rt, "COMPLETED", 2 * HOUR)
    run_retention(retention_rt)

    body = client.get(f"/v1/jobs/{old}").get_json()
    assert body["status"] == "COMPLETED" and body["result"] is None
    assert body["result_purged_at"] and body["audio_purged_at"] and "WHISPERQ_RESULT_RETENTION" in body["notice"]
    assert body["filename"] is None and body["callback_url"] is None
    for fmt in ("txt", "json", "srt"):
        resp = client.get(f"/v1/jobs/{old}/transcript?format={fmt}")
        assert resp.status_code == 410
        error = resp.get_json()["error"]
        assert error["code"] == "result_deleted" and "WHISPERQ_RESULT_RETENTION" in error["message"]
    # Its audio is gone, its transcript not yet.
    body = client.get(f"/v1/jobs/{audio_only}").get_json()
    assert body["audio_purged_at"] and body["result_purged_at"] is None and body["notice"] is None
    assert body["result"]["text"] == "secret words"
    assert client.get(f"/v1/jobs/{audio_only}/transcript").data.decode().strip() == "secret words"


def test_a_dead_letter_whose_audio_was_purged_cannot_be_replayed(retention_rt, tmp_path):
    from web import create_app

    client = create_app({"SETTINGS": retention_rt.settings, "TESTING": True}).test_client()
    failed = make(retention_rt, "FAILED", 2 * HOUR, dead=True)
    theirs = make(retention_rt, "FAILED", 2 * HOUR, dead=True, caller_file=tmp_path / "theirs.wav")
    run_retention(retention_rt)

    with pytest.raises(AudioPurged, match="WHISPERQ_AUDIO_RETENTION") as caught:
        replay(retention_rt, failed)
    assert caught.value.http_status == 409
    resp = client.post(f"/v1/admin/dead-letters/{failed}/replay", headers=ADMIN)
    assert resp.status_code == 409 and resp.get_json()["error"]["code"] == "audio_deleted"
    assert "WHISPERQ_AUDIO_RETENTION" in resp.get_json()["error"]["message"]
    assert row(retention_rt, failed).status == "FAILED" and dead_letter(retention_rt, failed) is not None
    # The caller's own file is still there: that job can run again (its samples are made anew).
    job = take_for_replay(retention_rt, theirs)
    assert job.state is JobStatus.PENDING and row(retention_rt, theirs).audio_purged_at is None


def test_the_command_runs_it_once(retention_rt, runner):
    from web.cli import cli

    old = make(retention_rt, "COMPLETED", 8 * DAY)
    env = {"DATABASE_URL": retention_rt.settings.database_url, "WHISPERQ_DATA_DIR": str(retention_rt.settings.data_dir)}
    result = runner.invoke(cli, ["retention", "--json"], env=env)
    assert result.exit_code == 0, result.output
    import json

    counts = json.loads(result.output)
    assert counts["audio_purged"] == 1 and counts["results_purged"] == 1 and counts["errors"] == 0
    assert row(retention_rt, old).result_purged_at is not None
    text_out = runner.invoke(cli, ["retention"], env=env).output
    assert "audio purged" in text_out and "secret" not in text_out and old not in text_out


def test_beat_schedules_it_on_the_preparation_queue(celery_app, settings):
    from config import PREPARE_QUEUE

    entry = celery_app.conf.beat_schedule["whisperq-retention"]
    assert entry["task"] == "whisperq.retention" and entry["schedule"] == settings.retention_interval_seconds
    assert entry["options"]["expires"] == settings.retention_interval_seconds
    assert celery_app.conf.task_routes["whisperq.retention"]["queue"] == PREPARE_QUEUE
    assert "whisperq.retention" in celery_app.tasks


@pytest.mark.integration
def test_the_task_runs_in_a_real_worker(retention_rt, celery_app, tmp_path):
    """A prefork worker (the preparation pool's kind) on this test's database and data dir,
    on a queue of its own, so that it takes nobody else's messages."""
    from conftest import start_worker, stop_worker

    job_id = make(retention_rt, "COMPLETED", 8 * DAY)
    queue = f"whisperq.retention-test-{uuid.uuid4().hex[:8]}"
    worker = start_worker(
        celery_app,
        tmp_path,
        f"retention-{uuid.uuid4().hex[:6]}",
        queue,
        extra_env={
            "DATABASE_URL": retention_rt.settings.database_url,
            "WHISPERQ_DATA_DIR": str(retention_rt.settings.data_dir),
        },
    )
    try:
        celery_app.send_task("whisperq.retention", queue=queue)
        wait_until(
            lambda: row(retention_rt, job_id).result_purged_at is not None,
            60,
            "the worker's retention pass purged nothing",
        )
        job = row(retention_rt, job_id)
        assert job.result_purged_at is not None and job.audio_purged_at is not None, worker.output()
        assert not audio_of(retention_rt, job_id).exists()
        assert "secret words" not in worker.output() and "call.wav" not in worker.output()
    finally:
        stop_worker(worker)


def test_a_worker_counts_what_it_deleted(retention_rt):
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from models.jobs import metrics

    def deleted(kind: str) -> float:
        text_out = generate_latest(metrics.registry()).decode()
        return sum(
            s.value
            for f in text_string_to_metric_families(text_out)
            for s in f.samples
            if s.name == "whisperq_retention_deleted_total" and s.labels.get("kind") == kind
        )

    make(retention_rt, "COMPLETED", 8 * DAY)
    was_enabled = metrics.enabled()
    metrics.enable()
    try:
        before = deleted("results_purged"), deleted("files_deleted")
        run_retention(retention_rt)
        assert (deleted("results_purged"), deleted("files_deleted")) == (before[0] + 1, before[1] + 2)
    finally:
        if not was_enabled:
            metrics.disable()


def test_a_transcript_sealed_with_a_key_no_longer_configured_is_purged_all_same(retention_rt, tmp_path):
    """Retention never reads a transcript: after a key is retired, old ones still go."""
    from models.security import crypto

    job_id = make(retention_rt, "COMPLETED", 8 * DAY)
    retired = crypto.current_keyring()
    crypto.set_keyring(
        crypto.keyring_for(
            dataclasses.replace(retention_rt.settings, data_dir=tmp_path / "other", encryption_keys=None)
        )
    )
    try:
        with pytest.raises(crypto.DecryptionError):
            _ = row(retention_rt, job_id).result_text
        counts = run_retention(retention_rt)
        assert counts["results_purged"] == 1 and counts["errors"] == 0
        job = row(retention_rt, job_id)  # nothing sealed is left on it to read
        assert job.result_text is None and job.result_purged_at is not None
    finally:
        crypto.set_keyring(retired)
