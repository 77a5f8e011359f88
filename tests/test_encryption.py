"""Encryption at rest: the file format, the values, the keys, rotation, and a real job whose
files and transcript are never on disk in plaintext."""
from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import socket
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy import text

from helpers import CLIPS, LiveServer, make_job, wait_for_job, wait_until, word_error_rate
from models.security.crypto import DecryptionError, Keyring, decrypt_value, parse_keys
from models.security import crypto
from models.security.sealed import CHUNK_BYTES, MAGIC, EncryptedWriter, open_decrypted

FOX = CLIPS["fox.flac"]["path"].read_bytes()
PLAIN_MAGIC = (b"RIFF", b"ID3", b"fLaC", b"OggS", b"\x93NUMPY", b"\xff\xfb", b"\xff\xf1")
KIB = 1024


def key(key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"


def ring(*entries: str) -> Keyring:
    return Keyring(tuple(parse_keys(",".join(entries))))


A, B = key("a"), key("b")


@pytest.fixture(autouse=True)
def keep_keyring():
    """Tests here switch the process's keys; the next test gets the suite's back."""
    before = crypto._current
    yield
    crypto.set_keyring(before)


def seal(path: Path, data: bytes, keyring: Keyring, step: int = 10_000) -> Path:
    with EncryptedWriter(path, keyring) as out:
        for n in range(0, len(data), step):
            out.write(data[n:n + step])
    return path


def assert_not_plain(path: Path, plaintext: bytes | None = None) -> None:
    data = path.read_bytes()
    assert not data.startswith(PLAIN_MAGIC), f"{path} starts like plaintext audio: {data[:8]!r}"
    assert data.startswith(MAGIC), f"{path} is not in the encrypted format"
    if plaintext:
        assert plaintext[:4096] not in data and plaintext[-4096:] not in data


# --- the file format ---------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 64 * KIB - 1, 64 * KIB, 64 * KIB + 1, 3 * 64 * KIB, 3_000_017])
def test_round_trip(tmp_path, size):
    keys = ring(A)
    data = os.urandom(size)
    path = seal(tmp_path / "f", data, keys, step=max(1, size // 7 or 1))
    chunks = max(1, -(-size // CHUNK_BYTES))
    assert path.stat().st_size == len(MAGIC) + 1 + 1 + 16 + 7 + size + 16 * chunks
    assert_not_plain(path, data if size >= 64 else None)
    with open_decrypted(path, keys) as fh:
        assert fh.read() == data
        assert fh.seek(0, io.SEEK_END) == size
    assert [p.name for p in tmp_path.iterdir()] == ["f"]  # no temporary part left


def test_seek_anywhere(tmp_path):
    keys = ring(A)
    data = os.urandom(5 * CHUNK_BYTES + 123)
    import random

    rnd = random.Random(7)
    with open_decrypted(seal(tmp_path / "f", data, keys), keys) as fh:
        for _ in range(200):
            pos, n = rnd.randrange(len(data) + 10), rnd.randrange(1, 3 * CHUNK_BYTES)
            fh.seek(pos)
            assert fh.read(n) == data[pos:pos + n]
            assert fh.tell() == min(len(data), pos + n) if pos <= len(data) else True
        fh.seek(-100, io.SEEK_END)
        assert fh.read() == data[-100:]
        fh.seek(CHUNK_BYTES - 3)
        fh.seek(10, io.SEEK_CUR)
        assert fh.read(5) == data[CHUNK_BYTES + 7:CHUNK_BYTES + 12]


def test_pyav_reads_an_mp4_whose_index_is_at_the_end(tmp_path):
    """An M4A as most encoders write it (moov after mdat): PyAV must seek to read it."""
    import av
    import numpy as np

    from models.speech import audio

    samples = audio.decode(CLIPS["fox.flac"]["path"])
    plain = tmp_path / "fox.m4a"
    with av.open(str(plain), "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None, :].astype(np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    data = plain.read_bytes()
    assert data.index(b"moov") > data.index(b"mdat")
    keys = ring(A)
    path = seal(tmp_path / "sealed.m4a", data, keys)
    with open_decrypted(path, keys) as fh:
        info = audio.probe(fh)
    assert info.codec == "aac" and info == audio.probe(plain)  # AAC adds priming samples: compare with the plain file
    with open_decrypted(path, keys) as fh:
        assert np.array_equal(audio.decode(fh), audio.decode(plain))


def _sealed_file(tmp_path, keys, chunks: int = 4) -> tuple[Path, bytes]:
    data = os.urandom(chunks * CHUNK_BYTES - 1000)
    return seal(tmp_path / "f", data, keys), data


def _read_all(path, keys) -> bytes:
    with open_decrypted(path, keys) as fh:
        return fh.read()


@pytest.mark.parametrize("damage", ["flip-body", "flip-header", "flip-tag", "truncate-chunk", "truncate-bytes",
                                    "swap", "drop-middle", "append", "splice"])
def test_tampering_is_detected(tmp_path, damage):
    keys = ring(A)
    path, _ = _sealed_file(tmp_path, keys)
    raw = bytearray(path.read_bytes())
    header, sealed = len(MAGIC) + 1 + 1 + 16 + 7, CHUNK_BYTES + 16
    body = [bytes(raw[header + i * sealed:header + (i + 1) * sealed]) for i in range(4)]
    if damage == "flip-body":
        raw[header + sealed + 500] ^= 0x01
    elif damage == "flip-header":
        raw[len(MAGIC) + 3] ^= 0x80  # the salt
    elif damage == "flip-tag":
        raw[header + sealed - 1] ^= 0x01
    elif damage == "truncate-chunk":  # a whole number of chunks: only the last-chunk flag tells
        raw = raw[:header + 2 * sealed]
    elif damage == "truncate-bytes":
        raw = raw[:-7]
    elif damage == "swap":
        raw = raw[:header] + body[1] + body[0] + body[2] + body[3]
    elif damage == "drop-middle":
        raw = raw[:header] + body[0] + body[2] + body[3]
    elif damage == "append":
        raw = raw + body[1]
    elif damage == "splice":  # a chunk from another file under the same key
        (tmp_path / "other").mkdir()
        o = _sealed_file(tmp_path / "other", keys)[0].read_bytes()
        raw = raw[:header + sealed] + o[header + sealed:header + 2 * sealed] + raw[header + 2 * sealed:]
    path.write_bytes(bytes(raw))
    with pytest.raises(DecryptionError, match="failed authentication|truncated") as err:
        _read_all(path, keys)
    assert str(path) in str(err.value)


def test_an_unknown_key_id_is_named(tmp_path):
    path, _ = _sealed_file(tmp_path, ring(A), chunks=1)
    with pytest.raises(DecryptionError) as err:
        _read_all(path, ring(B))
    assert err.value.missing_key and err.value.key_id == "a"
    assert "key id 'a', which is not configured" in str(err.value) and str(path) in str(err.value)
    # The same id with other key material: authentication fails, it does not decrypt to junk.
    with pytest.raises(DecryptionError, match="failed authentication"):
        _read_all(path, ring(key("a")))


def test_a_writer_that_fails_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with EncryptedWriter(tmp_path / "f", ring(A)) as out:
            out.write(b"x" * 100_000)
            raise RuntimeError("the source broke")
    assert list(tmp_path.iterdir()) == []


# --- keys and values ---------------------------------------------------------------------

def test_parse_keys():
    raw = os.urandom(32)
    keys = parse_keys(f" new:{base64.urlsafe_b64encode(raw).decode().rstrip('=')} , old:{base64.b64encode(raw).decode()}")
    assert keys == [("new", raw), ("old", raw)]
    assert Keyring(tuple(keys)).active == "new"
    for bad, words in [("", "no key given"), ("abc", "not KEYID:BASE64KEY"), ("a b:" + "A" * 44, "key id"),
                       ("a:" + base64.b64encode(os.urandom(16)).decode(), "16 bytes"), ("a:!!!!", "not base64"),
                       (f"{A},{key('a')}", "appears twice")]:
        with pytest.raises(ValueError, match=words) as err:
            parse_keys(bad)
        assert "new-key" in str(err.value) or "twice" in str(err.value) or "key id" in str(err.value)


def test_a_bad_setting_stops_the_process(tmp_path):
    from config import ConfigError, Settings

    with pytest.raises(ConfigError, match="WHISPERQ_ENCRYPTION_KEYS: .*whisperq encryption new-key"):
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_ENCRYPTION_KEYS": "k1:c2hvcnQ="})


def test_a_generated_key_is_shared_and_private(tmp_path, settings):
    from concurrent.futures import ThreadPoolExecutor

    local = dataclasses.replace(settings, data_dir=tmp_path, encryption_keys=None)
    with ThreadPoolExecutor(8) as pool:
        rings = list(pool.map(lambda _: crypto.keyring_for(local), range(16)))
    assert len({r.keys for r in rings}) == 1 and rings[0].active.startswith("local-")
    assert (tmp_path / "encryption-key").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["encryption-key"]


def legacy_token(text_: str, keys, key_id: str = "a") -> str:
    """A ``wqe1`` value, as versions before bound values wrote it."""
    nonce = os.urandom(12)
    sealed = keys.value_cipher(key_id).encrypt(nonce, text_.encode(), f"wqe1:{key_id}".encode())
    return f"wqe1:{key_id}:" + base64.b64encode(nonce + sealed).decode()


def test_values():
    keys = ring(A)
    place = "jobs.result_text:job-1"
    token = crypto.seal_value("the quick brown fox ✓", place, keys)
    assert token.startswith("wqe2:a:") and "fox" not in token
    assert decrypt_value(token, keys, place) == "the quick brown fox ✓"
    assert crypto.seal_value("same", place, keys) != crypto.seal_value("same", place, keys)  # a fresh nonce each time
    with pytest.raises(DecryptionError, match="not a sealed token"):  # a token or nothing
        decrypt_value("written before encryption", keys)
    with pytest.raises(DecryptionError, match="jobs.result_text of row job-1 is not a sealed token"):
        decrypt_value("written before encryption", dataclasses.replace(keys, allow_plaintext=True), place)
    assert decrypt_value(legacy_token("an older value", keys), keys) == "an older value"
    with pytest.raises(DecryptionError) as err:
        decrypt_value(token, ring(B), place)
    assert err.value.missing_key
    blob = bytearray(base64.b64decode(token.split(":", 2)[2]))
    blob[-1] ^= 1
    with pytest.raises(DecryptionError, match="failed authentication"):
        decrypt_value("wqe2:a:" + base64.b64encode(bytes(blob)).decode(), keys, place)
    with pytest.raises(DecryptionError, match="failed authentication"):  # the key id is bound to the token
        decrypt_value(token.replace("wqe2:a:", "wqe2:b:"), ring(B, A), place)
    for elsewhere in ("jobs.result_text:job-2", "jobs.result_segments:job-1"):  # another row, another column
        with pytest.raises(DecryptionError, match="copied from another row or column"):
            decrypt_value(token, keys, elsewhere)
    with pytest.raises(DecryptionError, match="failed authentication"):  # nor passes as an unbound one
        decrypt_value(token.replace("wqe2:", "wqe1:"), keys)


def test_swapped_transcripts_fail_to_decrypt(database):
    """Two rows' ciphertexts swapped in the database (or a row's text and segments): each
    read fails authentication instead of showing one job's transcript as another's."""
    from sqlalchemy import text as sql

    from models.jobs.record import Job, new_job_id

    ids = [new_job_id(), new_job_id()]
    with database.session() as s:
        for n, job_id in enumerate(ids):
            job = Job(id=job_id, audio_ref="", status="PENDING", priority="normal")
            job.result_text, job.result_segments = f"words of job {n}", [{"text": f"words of job {n}"}]
            s.add(job)
    try:
        with database.session() as s:
            assert [s.get(Job, i).result_text for i in ids] == ["words of job 0", "words of job 1"]
            raw = {i: s.execute(sql("SELECT result_text, result_segments FROM jobs WHERE id = :id"), {"id": i}).one()
                   for i in ids}
            assert all("words" not in str(v) and str(v[0]).startswith("wqe2:") for v in raw.values())
            s.execute(sql("UPDATE jobs SET result_text = :t WHERE id = :id"), {"t": raw[ids[1]][0], "id": ids[0]})
            s.execute(sql("UPDATE jobs SET result_text = :t WHERE id = :id"), {"t": raw[ids[0]][0], "id": ids[1]})
        for job_id in ids:
            with database.session() as s:
                with pytest.raises(DecryptionError, match="copied from another row or column"):
                    s.get(Job, job_id).result_text
        with database.session() as s:  # a row's own text moved into its segments column
            s.execute(sql("UPDATE jobs SET result_segments = :t WHERE id = :id"),
                      {"t": json.dumps(raw[ids[0]][0]), "id": ids[0]})
        with database.session() as s:
            with pytest.raises(DecryptionError, match="failed authentication"):
                s.get(Job, ids[0]).result_segments
    finally:
        with database.session() as s:
            s.execute(sql("DELETE FROM jobs WHERE id IN (:a, :b)"), {"a": ids[0], "b": ids[1]})


def test_plaintext_where_a_sealed_value_belongs_is_refused_unless_allowed(database):
    """Someone who can write the database but has no key must not be able to plant a
    transcript (or a webhook secret) that reads as genuine: plaintext is refused, except while
    WHISPERQ_ALLOW_PLAINTEXT_ROWS lets rows from before encryption be read (and rotated)."""
    from sqlalchemy import text as sql

    from models.jobs.record import Job, new_job_id

    job_id = new_job_id()
    with database.session() as s:
        s.add(Job(id=job_id, audio_ref="", status="COMPLETED", priority="normal"))
    try:
        with database.engine.begin() as conn:
            conn.execute(sql("UPDATE jobs SET result_text = 'planted words', result_segments = '[]' WHERE id = :id"),
                         {"id": job_id})
        for column in ("result_text", "result_segments"):
            with database.session() as s:
                with pytest.raises(crypto.PlaintextRefused, match=f"jobs.{column} of row {job_id} is plaintext") as err:
                    getattr(s.get(Job, job_id), column)
                assert "WHISPERQ_ALLOW_PLAINTEXT_ROWS=1" in str(err.value)
                assert "whisperq encryption rotate" in str(err.value)
        crypto.set_keyring(dataclasses.replace(crypto.current_keyring(), allow_plaintext=True))
        with database.session() as s:
            job = s.get(Job, job_id)
            assert (job.result_text, job.result_segments) == ("planted words", [])
    finally:
        with database.session() as s:
            s.execute(sql("DELETE FROM jobs WHERE id = :id"), {"id": job_id})


def test_a_plain_file_in_the_store_is_refused_unless_allowed(tmp_path):
    from models.security.sealed import open_stored

    plain = tmp_path / "audio.flac"
    plain.write_bytes(FOX)
    with pytest.raises(crypto.PlaintextRefused, match="stored file x is plaintext.*WHISPERQ_ALLOW_PLAINTEXT_ROWS=1"):
        open_stored(plain, ring(A), what="stored file x")
    with open_stored(plain, dataclasses.replace(ring(A), allow_plaintext=True)) as fh:
        assert fh.read() == FOX
    sealed = seal(tmp_path / "sealed", FOX, ring(A))
    with open_stored(sealed, ring(A)) as fh:
        assert fh.read() == FOX


def test_the_plaintext_flag_comes_from_the_settings(tmp_path):
    from config import Settings

    for env, allowed in (({}, False), ({"WHISPERQ_ALLOW_PLAINTEXT_ROWS": "1"}, True)):
        s = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_ENCRYPTION_KEYS": A, **env})
        assert s.allow_plaintext_rows is allowed and crypto.keyring_for(s).allow_plaintext is allowed


def test_a_plaintext_owner_token_names_no_one():
    """A raw broker message's owner_token must be one this deployment sealed for that job: a
    plain key id in its place would let any producer act as any key."""
    from models.errors import InvalidRequest
    from models.pipeline.door import owner_from_token, owner_token

    crypto.set_keyring(dataclasses.replace(ring(A), allow_plaintext=True))  # not even while rows may be plain
    assert owner_from_token("job-1", owner_token("job-1", "key-1")) == "key-1"
    with pytest.raises(InvalidRequest, match="not issued by this deployment"):
        owner_from_token("job-1", "key-1")


def test_a_sealed_value_needs_its_row_id():
    from models.jobs.record import Job

    with pytest.raises(ValueError, match="set the row's id before result_text"):
        Job(audio_ref="").result_text = "words"


# --- storage -------------------------------------------------------------------------------

@pytest.fixture()
def private_rt(tmp_path, settings):
    """A runtime on its own data dir and database, under key A."""
    from models.runtime import Runtime

    def make(keys: str | None = A, allow_plaintext: bool = False) -> Runtime:
        rt = Runtime(dataclasses.replace(settings, data_dir=tmp_path / "data", encryption_keys=keys,
                                         database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
                                         allow_plaintext_rows=allow_plaintext))
        rt.db.upgrade()
        return rt

    return make


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
        made.append(make_job(rt, spool.path, filename=None, duration=4.3, language="en",
                                    priority="normal"))
        spool.release()
    rt_b = private_rt(B)
    with pytest.raises(TransientJobError, match="key id 'a'.*WHISPERQ_ENCRYPTION_KEYS"):
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
        job = make_job(rt, None, filename="fox.flac", duration=None, language="en",
                              priority="normal", audio_url=server.url("/fox.flac"))
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

    from models.access.apikeys import ANONYMOUS
    from models.pipeline import intake
    from tasks.broker import CeleryBroker
    from web import uploads

    app = upload_app(private_rt)
    rt = app.extensions["whisperq"]
    monkeypatch.setattr(CeleryBroker, "publish_job", lambda *a, **kw: None)  # this private job must not reach the workers
    with app.test_request_context():
        job, created = intake.submit(rt, uploads.upload_submission(rt, ANONYMOUS, "api",
                                                                 FileStorage(io.BytesIO(FOX), "fox.flac"), {}))
    assert created and job.audio_duration == pytest.approx(4.3, abs=0.05)
    assert_not_plain(rt.storage.path(job.audio_ref), FOX)
    assert list(rt.storage.tmp_dir.iterdir()) == []


def upload_app(private_rt, max_upload_mb: int = 200):
    from web import create_app

    rt = private_rt()
    return create_app({"SETTINGS": dataclasses.replace(rt.settings, max_upload_mb=max_upload_mb), "TESTING": True})


@pytest.mark.parametrize("data, name, status", [
    (b"", "empty.flac", 400), (b"hello, not audio\n" * 100, "notes.wav", 415), (FOX, "../x.flac", 400),
    (FOX * 14, "big.flac", 413)])
def test_refused_uploads_leave_nothing_in_tmp(private_rt, data, name, status):
    app = upload_app(private_rt, max_upload_mb=1)
    resp = app.test_client().post("/v1/jobs", data={"file": (io.BytesIO(data), name)}, content_type="multipart/form-data")
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
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: multipart/form-data; boundary=xyz\r\n\r\n")

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


# --- rotation ------------------------------------------------------------------------------

def test_rotation(private_rt, monkeypatch):
    from click.testing import CliRunner

    from models.jobs import operations as jobs

    from models.jobs.record import Job
    from models.pipeline import preparation
    from web.cli import cli

    rt = private_rt(A, allow_plaintext=True)  # rows and a file from before encryption, read to be sealed
    spool = rt.storage.spool(io.BytesIO(FOX))
    job = make_job(rt, spool.path, filename="fox.flac", duration=4.3, language="en",
                          priority="normal")
    spool.release()
    preparation.prepare_job(rt, job.id, job.audio_ref)
    jobs.complete_job(rt, job.id, {"text": "the quick brown fox", "language": "en", "duration": 4.3,
                                   "segments": [{"start": 0.0, "end": 4.3, "text": "the quick brown fox"}]})
    legacy = rt.storage.root / "audio" / "le" / "legacy.flac"  # stored before encryption existed
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(FOX)
    with rt.db.session() as s:
        s.add(Job(id="1e9acy00-0000-4000-8000-000000000000", audio_ref="audio/le/legacy.flac", priority="normal",
                  status="PENDING"))
        s.add(Job(id="2e9acy00-0000-4000-8000-000000000000", audio_ref="", priority="normal", status="PENDING"))
    with rt.db.engine.begin() as conn:
        conn.execute(text("UPDATE jobs SET status = 'COMPLETED', result_text = 'old plain words', "
                          "result_segments = '[]' WHERE id LIKE '1e9acy%'"))
        # written under key a by a version whose values were not bound to their row
        conn.execute(text("UPDATE jobs SET status = 'COMPLETED', result_text = :t WHERE id LIKE '2e9acy%'"),
                     {"t": legacy_token("older sealed words", ring(A))})

    env = {"WHISPERQ_DATA_DIR": str(rt.settings.data_dir), "DATABASE_URL": rt.settings.database_url}
    runner = CliRunner()

    def whisperq(*args: str, keys: str, plaintext: str = "1"):
        result = runner.invoke(cli, ["encryption", *args], catch_exceptions=False, env={
            **env, "WHISPERQ_ENCRYPTION_KEYS": keys, "WHISPERQ_ALLOW_PLAINTEXT_ROWS": plaintext})
        return result

    refused = whisperq("rotate", keys=A, plaintext="")  # without the flag, what is plaintext stays unread
    assert refused.exit_code == 1 and refused.output.count("WHISPERQ_ALLOW_PLAINTEXT_ROWS=1") == 2, refused.output
    assert "legacy.flac is plaintext" in refused.output and "jobs.result_text of row 1e9acy" in refused.output

    status = json.loads(whisperq("status", "--json", keys=f"{B},{A}").output)
    assert status["active"] == "b" and status["files"] == {"a": 2, "(unencrypted)": 1}
    assert status["transcripts"] == {"a": 2, "(unencrypted)": 1}

    result = whisperq("rotate", keys=f"{B},{A}")
    assert result.exit_code == 0, result.output
    assert "files         3 re-encrypted, 0 already current" in result.output
    assert "transcripts   3 re-encrypted" in result.output
    again = whisperq("rotate", keys=f"{B},{A}")
    assert "0 re-encrypted, 3 already current" in again.output

    status = json.loads(whisperq("status", "--json", keys=B).output)
    assert status["files"] == {"b": 3} and status["transcripts"] == {"b": 3}
    rt_b = private_rt(B)  # the old key and the plaintext flag dropped: everything still reads
    for ref in (job.audio_ref, "audio/le/legacy.flac"):
        assert_not_plain(rt_b.storage.path(ref), FOX)
        with rt_b.storage.open(ref) as fh:
            assert fh.read() == FOX
    assert rt_b.storage.load_samples(f"prepared/{job.id[:2]}/{job.id}.npy").size > 60_000
    assert jobs.get_job(rt_b, job.id).result()["text"] == "the quick brown fox"
    assert jobs.get_job(rt_b, "1e9acy00-0000-4000-8000-000000000000").result_text == "old plain words"
    assert jobs.get_job(rt_b, "2e9acy00-0000-4000-8000-000000000000").result_text == "older sealed words"
    with rt_b.db.engine.connect() as conn:  # rewritten bound to their rows
        assert all(v.startswith("wqe2:b:") for v in conn.execute(text(
            "SELECT result_text FROM jobs WHERE result_text IS NOT NULL")).scalars())

    failing = runner.invoke(cli, ["encryption", "rotate"], env={**env, "WHISPERQ_ENCRYPTION_KEYS": key("c")})
    assert failing.exit_code == 1 and "key id 'b', which is not configured" in failing.output


def test_rotation_does_not_bring_back_a_file_deleted_meanwhile(tmp_path):
    from models.storage.local import _Gone, _replace_if_unchanged

    dest, tmp = tmp_path / "audio.flac", tmp_path / ".audio.flac.part"
    dest.write_bytes(b"old")
    inode = dest.stat().st_ino
    tmp.write_bytes(b"new")
    dest.unlink()  # a DELETE or retention got there first
    with pytest.raises(_Gone):
        _replace_if_unchanged(tmp, dest, inode)
    assert not dest.exists()
    dest.write_bytes(b"old")
    _replace_if_unchanged(tmp, dest, dest.stat().st_ino)
    assert dest.read_bytes() == b"new" and not tmp.exists()


# --- the whole path ------------------------------------------------------------------------

@pytest.mark.integration
def test_a_real_job_leaves_nothing_in_plaintext(client, settings, database, worker, caplog, celery_app):
    caplog.set_level("DEBUG")
    name = "board-meeting-7f3a.flac"
    resp = client.post("/v1/jobs", data={"file": (io.BytesIO(FOX), name), "language": "en"},
                       content_type="multipart/form-data")
    assert resp.status_code == 202, resp.get_json()
    job_id = resp.get_json()["job_id"]
    done = wait_for_job(client, job_id)
    assert done["status"] == "COMPLETED", done
    words = done["result"]["text"]
    assert word_error_rate(CLIPS["fox.flac"]["text"], words) < 0.25

    checked = 0
    for path in settings.data_dir.rglob("*"):
        if (not path.is_file() or path.name.startswith("whisperq.db") or path.name in ("encryption-key", "webhook-secret")
                or path.relative_to(settings.data_dir).parts[0] == "models"):  # converted model weights
            continue
        data = path.read_bytes()
        assert not data.startswith(PLAIN_MAGIC), f"{path} is plaintext audio"
        assert FOX[1000:3000] not in data
        checked += 1
    assert checked >= 1
    with database.session() as s:
        ref, raw_text, raw_segments = s.execute(
            text("SELECT audio_ref, result_text, result_segments FROM jobs WHERE id = :id"), {"id": job_id}).one()
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
        s.execute(sql("INSERT INTO jobs (id, status, task, priority, audio_ref, audio_owned, attempts, created_at, "
                      "result_text) VALUES (:id, 'COMPLETED', 'transcribe', 'normal', '', true, 1, :now, :text)"),
                  {"id": job_id, "now": datetime.now(timezone.utc).replace(tzinfo=None),
                   "text": "wqe1:gone:" + base64.b64encode(bytes(40)).decode()})
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
        client, celery_app, published, database, settings, monkeypatch, path):
    """An API job's transcript lives in its row, encrypted: no message for it may ask the
    result backend to keep one. A transcribe.delay() job keeps its result for .get().
    Each path publishes as it does in service: the door; the task's own retry after a
    transient failure; a sweeper pass finding the job's message lost; an operator's replay."""
    import io as _io
    from datetime import timedelta

    from sqlalchemy import select

    from models.jobs.deadletter import bury
    from models.jobs.operations import get_job
    from models.jobs.record import Job, JobStatus
    from models.jobs.sweeper import sweep
    from tasks import transcribe
    from tasks.broker import CeleryBroker, publish_transcribe

    def submit() -> str:
        resp = client.post("/v1/jobs", data={"file": (_io.BytesIO(CLIPS["fox.flac"]["path"].read_bytes()), "fox.flac")},
                           content_type="multipart/form-data")
        assert resp.status_code == 202, resp.get_json()
        return resp.get_json()["job_id"]

    rt = client.application.extensions["whisperq"]
    if path == "first publish":
        job_id = submit()
    else:
        with monkeypatch.context() as m:  # its first message is lost: no worker runs it meanwhile
            m.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: None)
            job_id = submit()
        published.clear()
    if path == "retry":
        job = get_job(rt, job_id)
        stored = rt.storage.path(job.audio_ref)
        away = stored.rename(stored.with_name(stored.name + ".away"))  # shared storage has not caught up yet
        try:
            transcribe.apply(args=[job.audio_ref], kwargs={"language": job.language, "priority": job.priority},
                             task_id=job_id)  # the task as a worker runs it, here
        finally:
            away.rename(stored)
        assert get_job(rt, job_id).next_attempt_at is not None  # it went the retry's way
    elif path == "sweeper":
        with database.session() as s:  # every other job's message is taken to be in the queue: left alone
            others = set(s.scalars(select(Job.id).where(Job.status.in_([JobStatus.PENDING.value,
                                                                        JobStatus.PROCESSING.value]), Job.id != job_id)))
        report = sweep(rt, {}, grace=timedelta(0), waiting=others)
        assert job_id in report.requeued
    elif path == "dead-letter replay":
        bury(rt, job_id, "whisperq.transcribe", "gave up", None)
        resp = client.post(f"/v1/admin/dead-letters/{job_id}/replay",
                           headers={"Authorization": f"Bearer {os.environ['WHISPERQ_ADMIN_TOKEN']}"})
        assert resp.status_code == 202, resp.get_json()
    mine = [headers for headers, _body in published if headers["id"] == job_id]
    assert mine and all(headers["ignore_result"] is True for headers in mine), mine
    job = get_job(rt, job_id)
    delay_job = dataclasses.replace(job) if dataclasses.is_dataclass(job) else job
    delay_job.origin = "delay"  # as the preparation pool records a transcribe.delay() job
    published.clear()
    publish_transcribe(celery_app, delay_job)
    assert published[-1][0]["ignore_result"] is False
