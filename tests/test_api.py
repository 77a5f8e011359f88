"""The API's contract: what it accepts, what it refuses, and that a refusal leaves nothing."""

import dataclasses
import time
from datetime import UTC, datetime, timedelta

import pytest
from api import upload
from helpers import CLIPS, stored_files
from sqlalchemy import func, select

from models.jobs.record import Job


def job_count(database) -> int:
    with database.session() as s:
        return s.scalar(select(func.count()).select_from(Job))


FOX = CLIPS["fox.flac"]["path"].read_bytes()


def _silence() -> bytes:
    import tempfile
    from pathlib import Path

    import numpy as np
    from helpers import write_wav

    with tempfile.TemporaryDirectory() as d:
        return write_wav(Path(d) / "s.wav", np.zeros(16000 * 1, dtype=np.float32)).read_bytes()


SILENCE = _silence()


@pytest.mark.parametrize(
    "kwargs, status, code, words",
    [
        (dict(), 400, "invalid_request", "multipart form field 'file'"),
        (dict(data=FOX, filename=""), 400, "invalid_request", "multipart form field 'file'"),
        (dict(data=b""), 400, "invalid_request", "empty"),
        (
            dict(data=b"hello, I am a text file\n" * 50, filename="notes.wav"),
            415,
            "unsupported_audio",
            "could not be decoded as audio",
        ),
        (dict(data=b"\x89PNG\r\n\x1a\n" + bytes(2000), filename="pic.mp3"), 415, "unsupported_audio", "audio"),
        (dict(data=FOX[:60]), 415, "unsupported_audio", "audio"),
        (dict(data=FOX, language="klingon"), 400, "invalid_request", "language 'klingon'"),
        (dict(data=FOX, language="de"), 400, "invalid_request", "English-only"),
        (dict(data=FOX, priority="urgent"), 400, "invalid_request", "high, normal, low"),
        (dict(data=FOX, task="summarise"), 400, "invalid_request", "transcribe, translate"),
        (dict(data=FOX, task="translate"), 400, "invalid_request", "multilingual"),
        (dict(data=FOX, speed="fast"), 400, "invalid_request", "unknown field(s) 'speed'"),
        (dict(data=FOX, filename="../../etc/passwd.flac"), 400, "invalid_request", "plain name"),
        (dict(data=FOX, filename="C:/Users/me/talk.flac"), 400, "invalid_request", "plain name"),
        (dict(data=FOX, filename="a\x1b[31mred.flac"), 400, "invalid_request", "control characters"),
        (dict(data=FOX, filename="x" * 300 + ".flac"), 400, "invalid_request", "longer than 255"),
        (dict(data=SILENCE, filename="quiet.wav"), 422, "silent_audio", "silent"),
    ],
)
def test_bad_input_is_refused_and_leaves_nothing(client, settings, database, published, kwargs, status, code, words):
    files_before, jobs_before = stored_files(settings), job_count(database)
    resp = upload(client, None, **kwargs)
    assert resp.status_code == status, resp.get_json()
    body = resp.get_json()
    assert body["error"]["code"] == code
    assert words in body["error"]["message"]
    assert stored_files(settings) == files_before
    assert job_count(database) == jobs_before
    assert published == []


def test_oversized_upload_is_413(settings, database, published):
    from web import create_app

    small = create_app({"SETTINGS": dataclasses.replace(settings, max_upload_mb=1), "TESTING": True})
    files_before, jobs_before = stored_files(settings), job_count(database)
    resp = upload(small.test_client(), None, data=FOX * 14)  # about 1.1 MB
    assert resp.status_code == 413
    assert "WHISPERQ_MAX_UPLOAD_MB" in resp.get_json()["error"]["message"]
    assert stored_files(settings) == files_before and job_count(database) == jobs_before
    assert published == []


def broken_broker_app(settings, monkeypatch):
    from web import create_app

    # Celery reads CELERY_BROKER_URL itself, ahead of its configuration: change both.
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:9/0")
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    return create_app(
        {
            "SETTINGS": dataclasses.replace(settings, broker_url="redis://127.0.0.1:9/0", result_backend=None),
            "TESTING": True,
        }
    )


def test_unreachable_broker_is_503_and_withdraws_the_job(settings, database, published, monkeypatch):
    down = broken_broker_app(settings, monkeypatch)
    files_before, jobs_before = stored_files(settings), job_count(database)
    started = time.monotonic()
    resp = upload(down.test_client(), None, data=FOX)
    assert resp.status_code == 503
    assert resp.headers["Retry-After"]
    assert resp.get_json()["error"]["code"] == "broker_unavailable"
    assert time.monotonic() - started < 30  # bounded retries, not a hung request
    assert stored_files(settings) == files_before and job_count(database) == jobs_before


def test_accepted_upload_answers_202_and_publishes_only_references(client, settings, database, published, celery_app):
    resp = upload(client, priority="high", language="en")
    assert resp.status_code == 202
    body = resp.get_json()
    assert set(body) >= {"job_id", "status", "status_url", "created_at"}
    assert body["status"] == "PENDING"
    assert resp.headers["Location"] == body["status_url"]
    assert body["status_url"].endswith(f"/v1/jobs/{body['job_id']}")

    ((headers, message),) = published
    assert headers["id"] == body["job_id"] and headers["task"] == "whisperq.transcribe"
    args, kwargs, _embed = message
    assert args == [f"audio/{body['job_id'][:2]}/{body['job_id']}"]  # no client suffix: FFmpeg learns nothing from it
    assert kwargs == {"language": "en", "priority": "high", "task": "transcribe"}
    assert len(str(message)) < 1000  # ids and references, never audio bytes

    stored = settings.data_dir / args[0]
    assert FOX[:4096] not in stored.read_bytes()  # encrypted at rest (tests/test_sealed_storage.py)
    from models.security.sealed import open_decrypted

    with open_decrypted(stored) as fh:
        assert fh.read() == FOX
    job = client.get(f"/v1/jobs/{body['job_id']}").get_json()
    assert job["filename"] == "fox.flac" and job["priority"] == "high"
    assert job["audio_duration"] == pytest.approx(4.3, abs=0.05)


def test_every_answer_says_the_cpu_it_took_in_server_timing(client, published):
    """`Server-Timing: cpu;dur=MS` on every answer, a refusal too: what a client or
    bench/load.py reads to learn what an upload costs the web tier."""
    import re

    for resp in (upload(client), client.get("/v1/jobs/nope"), client.get("/healthz")):
        match = re.fullmatch(r"cpu;dur=(\d+\.\d\d)", resp.headers.get("Server-Timing", ""))
        assert match, (resp.status_code, resp.headers.get("Server-Timing"))
        assert 0 <= float(match.group(1)) < 60_000


def test_unknown_job_is_404_json(client):
    resp = client.get("/v1/jobs/00000000-0000-0000-0000-000000000000")
    assert resp.status_code == 404
    assert resp.get_json()["error"]["code"] == "not_found"
    assert client.get("/v1/jobs/nope/transcript").status_code == 404


def test_transcript_is_409_until_completed(client, database):
    from models.jobs.record import new_job_id

    job_id = new_job_id()
    with database.session() as s:
        s.add(Job(id=job_id, audio_ref="audio/x.flac", priority="normal"))
    resp = client.get(f"/v1/jobs/{job_id}/transcript?format=srt")
    assert resp.status_code == 409
    assert "PENDING" in resp.get_json()["error"]["message"]
    assert client.get(f"/v1/jobs/{job_id}/transcript?format=docx").status_code == 400


def test_status_has_an_etag_and_a_poll_hint(client, database):
    """A waiting job: 304 for the ETag the client holds, until the job changes; Retry-After
    says when polling again is worth it; a finished job has no hint."""
    from models.jobs.record import new_job_id

    job_id = new_job_id()
    with database.session() as s:
        s.add(Job(id=job_id, audio_ref="audio/x.flac", priority="normal", audio_duration=4.0))
    first = client.get(f"/v1/jobs/{job_id}")
    assert first.status_code == 200 and first.headers["ETag"]
    assert 1 <= int(first.headers["Retry-After"]) <= 30
    again = client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": first.headers["ETag"]})
    assert again.status_code == 304 and again.data == b"" and again.headers["ETag"] == first.headers["ETag"]
    with database.session() as s:
        job = s.get(Job, job_id)
        job.start("w")
        job.stage = "infer"
    moved = client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": first.headers["ETag"]})
    assert moved.status_code == 200 and moved.get_json()["status"] == "PROCESSING"
    assert moved.headers["ETag"] != first.headers["ETag"] and moved.headers["Retry-After"] == "1"
    with database.session() as s:
        s.get(Job, job_id).fail("test")
    done = client.get(f"/v1/jobs/{job_id}")
    assert done.status_code == 200 and "Retry-After" not in done.headers


def test_a_long_poll_ends_when_the_job_changes_not_when_the_queue_moves(client, database):
    """In a burst every job ahead that finishes would otherwise answer every waiting client
    (n² answers for n jobs): moving up the queue shows in the answer the wait ends with,
    but does not end it; a change of the job itself does."""
    import threading

    from models.jobs.eta import QUEUE_SNAPSHOT_SECONDS
    from models.jobs.record import new_job_id

    ahead, mine = new_job_id(), new_job_id()
    with database.session() as s:
        s.add(
            Job(
                id=ahead,
                audio_ref="audio/a.flac",
                priority="normal",
                audio_duration=4.0,
                created_at=datetime.now(UTC) - timedelta(minutes=1),
            )
        )
        s.add(Job(id=mine, audio_ref="audio/b.flac", priority="normal", audio_duration=4.0))
    first = client.get(f"/v1/jobs/{mine}")
    place = first.get_json()["queue_position"]
    assert place >= 1

    def finish_the_one_ahead():
        with database.session() as s:
            s.get(Job, ahead).fail("test")

    timer = threading.Timer(0.5, finish_the_one_ahead)
    timer.start()
    started = time.monotonic()
    waited = client.get(f"/v1/jobs/{mine}?wait=3", headers={"If-None-Match": first.headers["ETag"]})
    timer.join()
    assert time.monotonic() - started >= 2.9  # the queue moved at 0.5 s: no answer for it
    assert waited.status_code == 200 and waited.get_json()["queue_position"] == place - 1
    assert waited.headers["ETag"] != first.headers["ETag"]

    def start_mine():
        with database.session() as s:
            s.get(Job, mine).start("w")

    time.sleep(QUEUE_SNAPSHOT_SECONDS)  # the queue snapshot's lifetime, so the next answer reads afresh: not ordering
    timer = threading.Timer(0.5, start_mine)
    timer.start()
    started = time.monotonic()
    woke = client.get(f"/v1/jobs/{mine}?wait=30", headers={"If-None-Match": waited.headers["ETag"]})
    timer.join()
    assert woke.status_code == 200 and woke.get_json()["status"] == "PROCESSING"
    assert time.monotonic() - started < 10


def test_unknown_route_and_method_are_json(client):
    assert client.get("/v1/nothing").get_json()["error"]["code"] == "not_found"
    assert client.delete("/v1/jobs").status_code == 405


@pytest.mark.integration
def test_healthz_and_readyz(client, worker):
    assert client.get("/healthz").get_json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.get_json()
    assert ready.get_json()["checks"] == {"database": "ok", "broker": "ok", "disk": "ok", "inference_workers": "ok"}


def test_readyz_names_the_broken_dependency(settings, database, monkeypatch):
    down = broken_broker_app(settings, monkeypatch)
    resp = down.test_client().get("/readyz")
    assert resp.status_code == 503
    assert resp.get_json()["checks"]["database"] == "ok"
    assert resp.get_json()["checks"]["broker"].startswith("unreachable")


def test_a_large_upload_is_accepted(client, tmp_path, published):
    import numpy as np
    from helpers import write_wav

    from models.speech import audio

    fox = audio.decode(CLIPS["fox.flac"]["path"])
    path = write_wav(tmp_path / "big.wav", np.concatenate([np.zeros(16000 * 300, dtype=np.float32), fox]))
    assert path.stat().st_size > 9 * 1024 * 1024
    resp = upload(client, "big.wav", data=path.read_bytes(), priority="low")
    assert resp.status_code == 202, resp.get_json()
    assert client.get(resp.headers["Location"]).get_json()["audio_duration"] == pytest.approx(304.3, abs=0.1)


def raw_post(client, body: bytes, content_type: str, headers: dict | None = None):
    return client.post("/v1/jobs", data=body, headers={"Content-Type": content_type, **(headers or {})})


@pytest.mark.parametrize(
    "body, content_type, status, words",
    [
        (b'{"file": "x"}', "application/json", 400, "unknown field(s) 'file'"),
        (b'{"audio_url": ', "application/json", 400, "not valid JSON"),
        (b'["http://example.com/a.mp3"]', "application/json", 400, "JSON object"),
        (
            b'{"audio_url": "http://127.0.0.1:9/a.mp3", "callback_url": "http://169.254.169.254/x"}',
            "application/json",
            400,
            "callback_url",
        ),
        (FOX, "audio/flac", 415, "multipart/form-data"),
        (b"--xyz\r\nContent-Disposition: form-data; name=file\r\n\r\nabc", "multipart/form-data", 400, "no boundary"),
        (b"this is not multipart at all", "multipart/form-data; boundary=xyz", 400, "multipart form field 'file'"),
        (
            b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a\xff\xfe.flac"\r\n\r\n'
            + FOX
            + b"\r\n--xyz--\r\n",
            "multipart/form-data; boundary=xyz",
            400,
            "UTF-8 file name",
        ),
    ],
)
def test_malformed_requests_are_refused_and_leave_nothing(
    client, settings, database, published, body, content_type, status, words
):
    files_before, jobs_before = stored_files(settings), job_count(database)
    resp = raw_post(client, body, content_type)
    assert resp.status_code == status, resp.get_data(as_text=True)
    assert words in resp.get_json()["error"]["message"]
    assert stored_files(settings) == files_before and job_count(database) == jobs_before
    assert published == []
    assert upload(client, None, data=FOX).status_code == 202  # and the service keeps serving


def test_huge_headers_get_431(client, published):
    resp = upload(client, headers={f"X-Pad-{i}": "p" * 1000 for i in range(20)})
    assert resp.status_code == 431
    assert "headers" in resp.get_json()["error"]["message"]
    assert published == []


def test_idempotency_key_returns_the_same_job(client, published, database):
    key = {"Idempotency-Key": f"order-{time.time_ns()}"}
    first = upload(client, headers=key)
    assert first.status_code == 202
    again = upload(client, headers=key)
    assert again.status_code == 200
    assert again.get_json()["job_id"] == first.get_json()["job_id"]
    assert len(published) == 1
    jobs = job_count(database)
    other = upload(client, headers=key, priority="high")
    assert other.status_code == 409
    assert "different request" in other.get_json()["error"]["message"]
    assert job_count(database) == jobs and len(published) == 1


def test_idempotency_keys_are_kept_a_day(app, database):
    from datetime import timedelta

    from models.jobs import idempotency
    from models.jobs.record import utcnow

    rt = app.extensions["whisperq"]
    idempotency.remember(rt, "old-key", "f1", "job-1")
    idempotency.remember(rt, "new-key", "f2", "job-2")
    with database.session() as s:
        s.get(idempotency.IdempotencyKey, "old-key").created_at = utcnow() - timedelta(hours=25)
        s.get(idempotency.IdempotencyKey, "new-key").created_at = utcnow() - timedelta(hours=23)
    assert idempotency.lookup(rt, "new-key", "f2") == "job-2"
    assert idempotency.lookup(rt, "old-key", "f1") is None
    assert idempotency.forget_old(rt) >= 1
    assert idempotency.lookup(rt, "new-key", "f2") == "job-2"


def test_bad_idempotency_key_is_400(client):
    resp = upload(client, headers={"Idempotency-Key": "x" * 300})
    assert resp.status_code == 400 and "Idempotency-Key" in resp.get_json()["error"]["message"]
