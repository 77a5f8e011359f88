"""A bounded web tier: small JSON bodies, few multipart parts, a door check whose cost does
not grow with the audio's length; and transcribe.delay() reads only the input directories."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from api import upload, wait_for_job
from helpers import CLIPS, stored_files
from sqlalchemy import func, select

from models.jobs.record import Job


def flac(path, seconds: float, rate: int = 8000):
    """A long FLAC that costs little to make: one second of a quiet tone, encoded over and over."""
    import av

    t = np.arange(rate) / rate
    pcm = (0.05 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2")[None]
    with av.open(str(path), "w", format="flac") as out:
        stream = out.add_stream("flac", rate=rate, layout="mono")
        for n in range(int(seconds)):
            frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, n * rate
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


@pytest.fixture()
def roomy(settings, database, monkeypatch):
    """A client of an app whose queue budget takes hours of audio. Its jobs are published
    nowhere (no worker spends hours on them) and removed afterwards, so they weigh on no
    other test."""
    import dataclasses

    from models.jobs.operations import discard_job
    from tasks.broker import CeleryBroker
    from web import create_app

    made: list[str] = []
    monkeypatch.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: made.append(job.id))
    app = create_app({"SETTINGS": dataclasses.replace(settings, queue_budget_seconds=10**7), "TESTING": True})
    yield app.test_client()
    for job_id in made:
        discard_job(app.extensions["whisperq"], job_id)


def jobs_count(database) -> int:
    with database.session() as session:
        return session.scalar(select(func.count()).select_from(Job))


def test_a_json_body_over_64_kib_is_413_and_stores_nothing(client, settings, database, published):
    before, files = jobs_count(database), stored_files(settings)
    body = json.dumps({"audio_url": "https://example.com/a.mp3", "prompt": "x" * 70_000})
    resp = client.post("/v1/jobs", data=body, content_type="application/json")
    assert resp.status_code == 413 and "64 KiB" in resp.get_json()["error"]["message"]
    # Chunked, with no Content-Length to refuse it by: cut off while it is read.
    resp = client.post(
        "/v1/jobs",
        input_stream=io.BytesIO(body.encode()),
        content_type="application/json",
        headers={"Transfer-Encoding": "chunked"},
    )
    assert resp.status_code in (400, 413)
    assert jobs_count(database) == before and not published and stored_files(settings) == files


def test_many_multipart_parts_are_refused_before_they_are_spooled(client, settings, database, published):
    files = stored_files(settings)
    data = {f"extra{n}": (io.BytesIO(b"x" * 1000), f"f{n}.bin") for n in range(40)}
    data["file"] = (io.BytesIO(CLIPS["fox.flac"]["path"].read_bytes()), "fox.flac")
    resp = client.post("/v1/jobs", data=data, content_type="multipart/form-data")
    assert resp.status_code == 413 and "too many parts" in resp.get_json()["error"]["message"]
    assert not published and stored_files(settings) == files


def test_the_door_check_costs_a_small_part_of_a_full_decode(roomy, tmp_path):
    """Only the container header and the first seconds are read at the door; the preparation
    pool decodes the whole file once. CPU of the request thread against a full decode."""
    from models.speech import audio

    path = flac(tmp_path / "hour.flac", 3600)
    data = path.read_bytes()
    started = time.thread_time()
    audio.decode(io.BytesIO(data))
    full = time.thread_time() - started
    started = time.thread_time()
    resp = upload(roomy, path.name, data=data)
    door = time.thread_time() - started
    assert resp.status_code == 202, resp.get_json()
    assert resp.get_json()["audio_duration"] == pytest.approx(3600, abs=1)
    assert door < full / 5, (door, full)


def test_audio_over_the_limit_is_refused_from_its_header(roomy, tmp_path, settings):
    path = flac(tmp_path / "four-hours.flac", settings.max_audio_seconds + 60)
    files = stored_files(settings)
    started = time.thread_time()
    resp = upload(roomy, path.name, data=path.read_bytes())
    assert time.thread_time() - started < 2.0
    assert resp.status_code == 413 and resp.get_json()["error"]["code"] == "audio_too_long"
    assert stored_files(settings) == files


@pytest.mark.integration
def test_audio_longer_than_its_header_says_is_cut_short_in_preparation(settings, database, tmp_path):
    """A header that lies is caught while the preparation pool decodes: a permanent failure."""
    import dataclasses

    from models.errors import PermanentJobError
    from models.pipeline.preparation import prepare_job
    from models.runtime import Runtime

    rt = Runtime(dataclasses.replace(settings, max_audio_seconds=30.0))
    rt.db.upgrade()
    path = flac(tmp_path / "long.flac", 45)
    with pytest.raises(PermanentJobError, match="longer than the limit of 30 s"):
        prepare_job(rt, "0a0a0a0a-0000-4000-8000-000000000001", str(path), {"language": "en"})


# --- transcribe.delay(path) ------------------------------------------------------------------


def test_delay_refuses_a_relative_path_before_anything_is_queued():
    from tasks import transcribe

    for given in ("../../etc/passwd", "relative.flac", "audio/ab/abcdef"):
        with pytest.raises(ValueError, match="absolute path of an audio file in your input directories"):
            transcribe.delay(given)


@pytest.mark.integration
@pytest.mark.parametrize("given", ["/etc/passwd", "/tmp/../etc/hostname", "STORE", "LINK"])
def test_delay_reads_only_files_in_the_input_directories(client, worker, settings, tmp_path, given, celery_app):
    """transcribe.delay() refuses the path before anything is queued; the same path in a raw
    message (no delay(): any producer may write one) makes a FAILED job, never retried."""
    from models.errors import PermanentJobError
    from tasks import transcribe

    # Another job's stored audio: the store is never readable through delay().
    resp = upload(client)
    other = wait_for_job(client, resp.get_json()["job_id"])
    stored = next(p for p in (settings.data_dir / "audio").rglob("*") if p.is_file())
    if given == "STORE":
        given = str(stored)
    elif given == "LINK":  # a link inside an input directory to a file outside of them
        link = tmp_path / "innocent.flac"
        os.symlink("/etc/hostname", link)
        given = str(link)
    with pytest.raises(ValueError, match=r"outside your input directories|data directory"):
        transcribe.delay(given)
    result = celery_app.send_task("whisperq.transcribe", args=[given])
    with pytest.raises(PermanentJobError):  # refused by the worker's door: failed, never retried
        result.get(timeout=60)
    job = client.get(f"/v1/jobs/{result.id}").get_json()
    assert job["status"] == "FAILED" and job["attempts"] == 0, job
    assert "input directories" in job["error"] or "data directory" in job["error"], job["error"]
    assert other["status"] == "COMPLETED"


@pytest.mark.integration
def test_delay_reads_a_file_in_an_input_directory(client, worker, tmp_path):
    from tasks import transcribe

    path = tmp_path / "fox.flac"
    path.write_bytes(CLIPS["fox.flac"]["path"].read_bytes())
    result = transcribe.delay(str(path))
    assert "fox" in result.get(timeout=120)["text"].lower()


def test_input_dirs_must_be_absolute(settings):
    from config import ConfigError, Settings

    env = {"WHISPERQ_DATA_DIR": str(settings.data_dir)}
    assert Settings.from_env(env).input_grants == ((None, settings.data_dir / "inbox"),)
    assert Settings.from_env(dict(env, WHISPERQ_INPUT_DIRS="/srv/a, /srv/b")).input_grants[1][1].name == "b"
    owned = Settings.from_env(dict(env, WHISPERQ_INPUT_DIRS="/srv/shared, 0123abcd=/srv/team-a")).input_grants
    assert owned == ((None, Path("/srv/shared")), ("0123abcd", Path("/srv/team-a")))
    with pytest.raises(ConfigError, match="not an API key id"):
        Settings.from_env(dict(env, WHISPERQ_INPUT_DIRS="ab=/srv/team-a"))
    with pytest.raises(ConfigError, match="WHISPERQ_INPUT_DIRS"):
        Settings.from_env(dict(env, WHISPERQ_INPUT_DIRS="incoming"))


def test_synchronous_waits_are_capped_in_all_and_per_client(settings, database, monkeypatch):
    """Requests past the caps answer 202 at once instead of holding a web thread."""
    import dataclasses
    import threading

    from models.jobs.operations import discard_job
    from tasks.broker import CeleryBroker
    from web import create_app

    made: list[str] = []
    monkeypatch.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: made.append(job.id))  # never done
    app = create_app(
        {
            "SETTINGS": dataclasses.replace(settings, sync_wait_seconds=3.0, sync_waits=2, sync_waits_per_client=1),
            "TESTING": True,
        }
    )
    answers: dict[str, list[tuple[int, float]]] = {}

    def call(address: str):
        client = app.test_client()
        client.environ_base["REMOTE_ADDR"] = address
        started = time.monotonic()
        resp = upload(client, path="/v1/audio/transcriptions", model="whisper-1")
        answers.setdefault(address, []).append((resp.status_code, time.monotonic() - started))

    threads = [
        threading.Thread(target=call, args=(address,))
        for address in ["10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    everyone = [a for got in answers.values() for a in got]
    assert all(status == 202 for status, _ in everyone), everyone
    waited = [took for _, took in everyone if took >= 2.5]
    assert len(waited) == 2, everyone  # the process-wide cap
    assert sum(1 for _, took in answers["10.0.0.1"] if took >= 2.5) <= 1  # one client: one wait at most
    for job_id in made:
        discard_job(app.extensions["whisperq"], job_id)
