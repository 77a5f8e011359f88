"""Storage under encryption (models.storage and the preparation pool): samples, fetched audio and
upload spools are written sealed; a worker without the key retries, a damaged file fails; a
refused upload, a chunked one over the limit included, leaves nothing in tmp."""

from __future__ import annotations

import dataclasses
import io
import os
import socket
import threading

import pytest
from api import upload
from helpers import LiveServer, make_job, wait_until
from keyrings import FOX, KIB, A, B, assert_not_plain

pytestmark = pytest.mark.usefixtures("keyring_restored")  # tests here switch the process's keys


def test_samples_and_owned_files(private_rt, tmp_path):
    import numpy as np

    from models.pipeline import preparation

    rt = private_rt()
    mine = tmp_path / "caller's own.flac"
    mine.write_bytes(FOX)
    before = mine.stat()
    job_id = "0123abcd-0000-4000-8000-000000000001"
    prepared = preparation.prepare_job(rt, job_id, str(mine))  # an absolute path: read in place
    assert mine.read_bytes() == FOX and mine.stat().st_mtime_ns == before.st_mtime_ns
    path = rt.storage.path(prepared.samples_ref)
    assert_not_plain(path)
    samples = rt.storage.load_samples(prepared.samples_ref)
    from models.speech import audio

    assert np.allclose(samples, audio.decode(mine), atol=1 / 32768 + 1e-6)


def test_a_worker_without_the_key_retries_and_a_damaged_file_fails(private_rt):
    from models.errors import PermanentJobError, TransientJobError
    from models.jobs import operations as jobs
    from models.pipeline import preparation

    rt = private_rt(A)
    made = []
    for _ in range(2):
        spool = rt.storage.spool(io.BytesIO(FOX))
        made.append(make_job(rt, spool.path, filename=None, duration=4.3, language="en", priority="normal"))
        spool.release()
    rt_b = private_rt(B)
    with pytest.raises(TransientJobError, match=r"key id 'a'.*WHISPERQ_ENCRYPTION_KEYS"):
        preparation.prepare_job(rt_b, made[0].id, made[0].audio_ref)
    rt = private_rt(A)
    path = rt.storage.path(made[1].audio_ref)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(PermanentJobError, match="failed decryption"):
        preparation.prepare_job(rt, made[1].id, made[1].audio_ref)
    assert jobs.get_job(rt, made[1].id).status == "FAILED"


def test_fetched_audio_is_written_encrypted(private_rt):
    from helpers import Receiver

    from models.jobs import operations as jobs
    from models.pipeline import preparation

    rt = private_rt()
    with Receiver({"/fox.flac": (200, {"Content-Type": "audio/flac"}, FOX)}) as server:
        job = make_job(
            rt,
            None,
            filename="fox.flac",
            duration=None,
            language="en",
            priority="normal",
            audio_url=server.url("/fox.flac"),
        )
        preparation.prepare_job(rt, job.id, "")
    stored = jobs.get_job(rt, job.id)
    assert stored.audio_duration == pytest.approx(4.3, abs=0.05)
    assert_not_plain(rt.storage.path(stored.audio_ref), FOX)
    with rt.storage.open(stored.audio_ref) as fh:
        assert fh.read() == FOX
    assert list((rt.storage.root / "tmp").iterdir()) == []


def test_an_upload_spool_is_encrypted_as_it_arrives(private_rt):
    import hashlib

    from models.storage import SealedSpool

    rt = private_rt()
    spool = SealedSpool(rt.storage.tmp_dir, limit=len(FOX))
    spool.write(FOX[:70_000])
    for path in rt.storage.tmp_dir.iterdir():  # half-way: the name placeholder and the part being written
        assert FOX[1000:3000] not in path.read_bytes()
    spool.write(FOX[70_000:])
    assert spool.seek(0) == 0 and spool.read() == FOX
    assert spool.size == len(FOX) and spool.sha256.hexdigest() == hashlib.sha256(FOX).hexdigest()
    assert [p.name for p in rt.storage.tmp_dir.iterdir()] == [spool.path.name]
    assert_not_plain(spool.path, FOX)
    with pytest.raises(ValueError, match="complete"):
        spool.write(b"more")
    spool.discard()
    over = SealedSpool(rt.storage.tmp_dir, limit=100, too_large=lambda: OverflowError("too big"))
    with pytest.raises(OverflowError):
        over.write(b"x" * 101)
    assert list(rt.storage.tmp_dir.iterdir()) == []


def test_an_upload_from_any_stream_is_spooled_encrypted(private_rt, monkeypatch):
    """sealed_upload's fallback, for a FileStorage that UploadRequest did not parse."""
    from werkzeug.datastructures import FileStorage

    from models.pipeline import intake
    from models.pipeline.door import anonymous
    from tasks.broker import CeleryBroker
    from web import uploads

    app = upload_app(private_rt)
    rt = app.extensions["whisperq"]
    monkeypatch.setattr(
        CeleryBroker, "publish_job", lambda *a, **kw: None
    )  # this private job must not reach the workers
    with app.test_request_context():
        job, created = intake.submit(
            rt,
            uploads.upload_submission(rt, anonymous(rt.settings), "api", FileStorage(io.BytesIO(FOX), "fox.flac"), {}),
        )
    assert created and job.audio_duration == pytest.approx(4.3, abs=0.05)
    assert_not_plain(rt.storage.path(job.audio_ref), FOX)
    assert list(rt.storage.tmp_dir.iterdir()) == []


def upload_app(private_rt, max_upload_mb: int = 200):
    from web import create_app

    rt = private_rt()
    return create_app({"SETTINGS": dataclasses.replace(rt.settings, max_upload_mb=max_upload_mb), "TESTING": True})


@pytest.mark.parametrize(
    "data, name, status",
    [
        (b"", "empty.flac", 400),
        (b"hello, not audio\n" * 100, "notes.wav", 415),
        (FOX, "../x.flac", 400),
        (FOX * 14, "big.flac", 413),
    ],
)
def test_refused_uploads_leave_nothing_in_tmp(private_rt, data, name, status):
    app = upload_app(private_rt, max_upload_mb=1)
    resp = upload(app.test_client(), name, data=data)
    assert resp.status_code == status, resp.get_json()
    tmp = app.extensions["whisperq"].storage.tmp_dir
    assert list(tmp.iterdir()) == []


def test_a_chunked_upload_over_the_limit_is_refused_while_it_streams(private_rt):
    """No Content-Length, so only counting the bytes as they arrive can stop it: 413 after
    about 1 MB of a 64 MB body, and nothing left behind."""
    app = upload_app(private_rt, max_upload_mb=1)
    tmp = app.extensions["whisperq"].storage.tmp_dir
    sent = {"bytes": 0}
    with LiveServer(app) as server:
        port = int(server.url.rsplit(":", 1)[1])
        sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        sock.sendall(
            b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: multipart/form-data; boundary=xyz\r\n\r\n"
        )

        def chunk(data: bytes) -> bytes:
            return b"%x\r\n%s\r\n" % (len(data), data)

        def send():
            try:
                sock.sendall(chunk(b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.flac"\r\n\r\n'))
                block = os.urandom(64 * KIB)
                for _ in range(1024):  # 64 MB, far past the limit
                    sock.sendall(chunk(block))
                    sent["bytes"] += len(block)
            except OSError:
                pass  # the server stopped reading: expected

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        reply = b""
        while b"\r\n\r\n" not in reply or b"}" not in reply:
            part = sock.recv(65536)
            if not part:
                break
            reply += part
        sock.close()
        sender.join(10)
    status, body = reply.split(b"\r\n", 1)[0], reply.split(b"\r\n\r\n", 1)[1]
    assert b" 413 " in status, reply[:300]
    assert b"WHISPERQ_MAX_UPLOAD_MB" in body and b"too_large" in body
    assert sent["bytes"] < 16 * 1024 * 1024  # refused early, not after the whole body
    wait_until(lambda: not list(tmp.iterdir()), 5, f"the refused upload's spool is still in {tmp}")
