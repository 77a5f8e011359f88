"""Every storage backend (models.storage): the data dir, PostgreSQL large objects and S3 (on the
loopback server of tests/s3_server.py; its own tests are in test_s3). Same bytes in and out,
sealed at rest, gone with the job, and the job's row and its audio written together."""

from __future__ import annotations

import dataclasses
import io
import os
import random
import uuid

import pytest
from helpers import CLIPS, make_job, need_service
from sqlalchemy import text

from models.security.sealed import MAGIC
from models.storage.base import audio_ref, prepared_ref

FOX = CLIPS["fox.flac"]["path"].read_bytes()
TEST_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/whisperq_test"


@pytest.fixture(scope="module")
def postgres_url(settings) -> str:
    """The suite's PostgreSQL database, or the local test database beside SQLite runs."""
    url = (
        settings.database_url
        if settings.database_url.startswith("postgres")
        else os.environ.get("WHISPERQ_TEST_POSTGRES", TEST_POSTGRES)
    )
    from sqlalchemy import create_engine

    try:
        engine = create_engine(url)
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        need_service(f"PostgreSQL at {url.rsplit('@', 1)[-1]} unreachable: {exc}")
    return url


@pytest.fixture(params=["local", "postgres", "s3"])
def backend_rt(request, settings, tmp_path):
    """A runtime on each backend, with a data dir of its own (and on S3 a bucket of its own)."""
    from models.runtime import Runtime

    changes = {"data_dir": tmp_path / "data", "storage": request.param}
    if request.param == "s3":
        changes["storage"] = f"s3://{request.getfixturevalue('s3_bucket')}/whisperq"
    if request.param == "postgres":
        changes["database_url"] = request.getfixturevalue("postgres_url")
    elif not settings.database_url.startswith("postgres"):
        changes["database_url"] = f"sqlite:///{tmp_path / 'data' / 'whisperq.db'}"
    runtime = Runtime(dataclasses.replace(settings, **changes))
    runtime.db.upgrade()
    yield runtime
    runtime.db.dispose()


def oids(rt, *refs: str) -> set[int]:
    """The large objects that hold these references now."""
    with rt.db.engine.connect() as conn:
        return set(
            conn.execute(text("SELECT oid FROM stored_objects WHERE ref = ANY(:refs)"), {"refs": list(refs)}).scalars()
        )


def existing(rt, objects: set[int]) -> set[int]:
    """Which of these large objects the database still has (other tests may make others)."""
    with rt.db.engine.connect() as conn:
        return set(
            conn.execute(
                text("SELECT oid FROM pg_largeobject_metadata WHERE oid = ANY(:oids)"), {"oids": list(objects)}
            ).scalars()
        )


def raw_bytes(rt, ref: str) -> bytes:
    if rt.storage.kind == "postgres":
        return rt.storage.raw(ref)
    if rt.storage.kind == "s3":
        return rt.storage.client.get_object(Bucket=rt.storage.bucket, Key=rt.storage.key(ref))["Body"].read()
    return rt.storage.path(ref).read_bytes()


def spooled(rt, data: bytes):
    return rt.storage.spool(io.BytesIO(data))


def test_same_bytes_in_same_bytes_out_and_sealed_at_rest(backend_rt):
    data = random.Random(7).randbytes(3 * 1024 * 1024 + 12345)  # several 1 MiB blocks, a ragged end
    spool = spooled(backend_rt, data)
    job_id = str(uuid.uuid4())
    ref = backend_rt.storage.store_audio(spool.path, job_id)
    spool.release()
    assert backend_rt.storage.exists(ref)
    with backend_rt.storage.open(ref) as fh:
        assert fh.read() == data
        for offset in (0, 1, 65535, 65536, 1024 * 1024 - 3, 2 * 1024 * 1024 + 77, len(data) - 5):
            fh.seek(offset)
            assert fh.read(4096) == data[offset : offset + 4096]
        fh.seek(-10, io.SEEK_END)
        assert fh.read() == data[-10:]
    sealed = raw_bytes(backend_rt, ref)
    assert sealed.startswith(MAGIC) and data[1000:1064] not in sealed
    assert backend_rt.storage.key_id(ref) == "test"
    assert list(backend_rt.storage.tmp_dir.iterdir()) == []  # the spool went into the store
    backend_rt.storage.delete(ref)
    assert not backend_rt.storage.exists(ref)
    with pytest.raises(FileNotFoundError):
        backend_rt.storage.open(ref)


def test_one_jobs_file_put_under_another_jobs_name_does_not_open_there(backend_rt, tmp_path):
    """A sealed file is bound to its reference: its bytes copied under another job's name (a
    traversal, a swapped object, a restored backup put in the wrong place) fail to open."""
    from models.security.crypto import DecryptionError

    mine, theirs = str(uuid.uuid4()), str(uuid.uuid4())
    ref = backend_rt.storage.store_audio(spooled(backend_rt, FOX).path, theirs)
    stolen = tmp_path / "stolen"
    stolen.write_bytes(raw_bytes(backend_rt, ref))
    backend_rt.storage._place(stolen, audio_ref(mine), None)  # the bytes as they are, no binding made
    with pytest.raises(DecryptionError, match=f"is not bound to '{audio_ref(mine)}'"):
        backend_rt.storage.open(audio_ref(mine))
    samples = backend_rt.storage.save_samples(theirs, __import__("numpy").zeros(1600, dtype="float32"))
    stolen.write_bytes(raw_bytes(backend_rt, samples))
    backend_rt.storage._place(stolen, prepared_ref(mine), None)
    with pytest.raises(DecryptionError, match="is not bound"):
        backend_rt.storage.load_samples(prepared_ref(mine))
    with backend_rt.storage.open(ref) as fh:  # the file under its own name opens
        assert fh.read() == FOX


def test_a_file_of_the_first_format_opens_and_rotation_binds_it(backend_rt, tmp_path):
    from test_sealed import legacy_seal

    from models.security.crypto import current_keyring
    from models.security.sealed import LEGACY_MAGIC

    ref = audio_ref(str(uuid.uuid4()))
    backend_rt.storage._place(legacy_seal(tmp_path / "old", FOX, current_keyring()), ref, None)
    assert raw_bytes(backend_rt, ref).startswith(LEGACY_MAGIC) and backend_rt.storage.key_id(ref) == "test"
    with backend_rt.storage.open(ref) as fh:
        assert fh.read() == FOX
    assert backend_rt.storage.reseal(ref)
    assert raw_bytes(backend_rt, ref).startswith(MAGIC)
    with backend_rt.storage.open(ref) as fh:  # bound to its name now
        assert fh.read() == FOX


def test_samples_round_trip_and_are_replaced_in_place(backend_rt):
    import numpy as np

    job_id = str(uuid.uuid4())
    samples = np.linspace(-0.5, 0.5, 16000 * 3, dtype=np.float32)
    ref = backend_rt.storage.save_samples(job_id, samples)
    assert np.allclose(backend_rt.storage.load_samples(ref), samples, atol=1 / 32768)
    first = oids(backend_rt, ref) if backend_rt.storage.kind == "postgres" else set()
    ref_again = backend_rt.storage.save_samples(job_id, samples[:16000])  # a redelivered job prepares again
    assert ref_again == ref and len(backend_rt.storage.load_samples(ref)) == 16000
    if backend_rt.storage.kind == "postgres":
        assert first and existing(backend_rt, first) == set()  # the first object was let go, not left behind
    assert ref in {f.ref for f in backend_rt.storage.listing(("prepared",))}
    backend_rt.storage.delete(ref)
    assert ref not in {f.ref for f in backend_rt.storage.listing(("prepared",))}


def test_a_job_and_its_audio_are_written_together_and_deleted_together(backend_rt):
    from models.jobs.operations import delete_job

    data = CLIPS["fox.flac"]["path"].read_bytes()
    job = make_job(
        backend_rt,
        spooled(backend_rt, data).path,
        filename="fox.flac",
        duration=4.3,
        audio_format="flac",
        language="en",
        priority="normal",
    )
    assert backend_rt.storage.exists(job.audio_ref)
    with backend_rt.storage.open(job.audio_ref) as fh:
        assert fh.read() == data
    prepared = backend_rt.storage.save_samples(job.id, __import__("numpy").zeros(1600, dtype="float32"))
    held = oids(backend_rt, job.audio_ref, prepared) if backend_rt.storage.kind == "postgres" else set()
    delete_job(backend_rt, job.id)
    assert not backend_rt.storage.exists(job.audio_ref) and not backend_rt.storage.exists(prepared)
    if backend_rt.storage.kind == "postgres":
        assert len(held) == 2 and existing(backend_rt, held) == set()  # every large object of the job unlinked
    else:
        assert not any((backend_rt.settings.data_dir / "audio").rglob("*.*"))


def test_a_row_that_cannot_be_written_leaves_no_audio(backend_rt, monkeypatch):
    from models.jobs import operations
    from models.storage import postgres

    made: list[int] = []
    upload = postgres._upload

    def recorded(conn, tmp):
        oid, size = upload(conn, tmp)
        made.append(oid)
        return oid, size

    monkeypatch.setattr(postgres, "_upload", recorded)

    def refused(**_row):
        raise RuntimeError("the row is refused")  # after the audio went into the store

    monkeypatch.setattr(operations, "Job", refused)
    job_id = str(uuid.uuid4())
    with pytest.raises(RuntimeError, match="refused"):
        make_job(
            backend_rt,
            spooled(backend_rt, b"audio" * 1000).path,
            filename=None,
            duration=1.0,
            audio_format="wav",
            language="en",
            priority="normal",
            job_id=job_id,
        )
    if backend_rt.storage.kind == "postgres":
        assert made and existing(backend_rt, set(made)) == set()  # rolled back with the row
    assert not backend_rt.storage.exists(audio_ref(job_id)) and list(backend_rt.storage.tmp_dir.iterdir()) == []


def test_key_rotation_reseals_stored_files_on_either_backend(backend_rt):
    """Storage.reseal, what `whisperq encryption rotate` does to each file (the whole rotation,
    which rewrites every row of a shared database, is tested in test_key_rotation)."""
    from models.maintenance.rotation import stored_files
    from models.security.crypto import Keyring, set_keyring

    data = random.Random(3).randbytes(200_000)
    job_id = str(uuid.uuid4())
    spool = spooled(backend_rt, data)
    ref = backend_rt.storage.store_audio(spool.path, job_id)
    spool.release()
    old = backend_rt.keyring
    rotated = Keyring((("next", os.urandom(32)), *old.keys))  # a new active key; the old one still reads
    set_keyring(rotated)
    try:
        assert backend_rt.storage.key_id(ref) == "test"
        assert ref in set(stored_files(backend_rt))  # what the rotation goes through
        assert backend_rt.storage.reseal(ref)
        assert backend_rt.storage.key_id(ref) == "next"
        with backend_rt.storage.open(ref) as fh:
            assert fh.read() == data
        backend_rt.storage.delete(ref)
        assert not backend_rt.storage.reseal(ref)  # gone meanwhile: nothing brought back
    finally:
        set_keyring(old)
        backend_rt.storage.delete(ref)


def test_postgres_storage_needs_a_postgres_database(tmp_path):
    from config import ConfigError, Settings

    with pytest.raises(ConfigError, match=r"WHISPERQ_STORAGE=postgres.*DATABASE_URL"):
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_STORAGE": "postgres"})
    with pytest.raises(ConfigError, match="WHISPERQ_STORAGE"):
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_STORAGE": "s3"})
