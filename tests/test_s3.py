"""S3 storage (WHISPERQ_STORAGE=s3://BUCKET/PREFIX, models.storage.s3) against moto's server on
loopback (tests/s3_server.py), reached through AWS's own variables as a deployment reaches S3.

What every backend does (same bytes in and out, samples, a job's audio deleted with it, key
rotation of one file) is tested over all three in test_storage; here is what is S3's own: reads
are range requests, so a seek reads a little of the object; large files go up in parts; what
the bucket holds is sealed; listing pages; rotation and retention on a bucket; the settings'
errors; and one job through real workers with its audio in the bucket."""

from __future__ import annotations

import dataclasses
import io
import random
import sys
import time
import uuid
from datetime import timedelta

import pytest
from api import submit_id, wait_for_job
from helpers import CLIPS, make_job, wait_until, word_error_rate
from s3_server import Traffic, s3_stack

from models.security.sealed import CHUNK_BYTES, MAGIC, TAG_BYTES

MIB = 1024 * 1024
SEALED_CHUNK = CHUNK_BYTES + TAG_BYTES
FOX = CLIPS["fox.flac"]["path"].read_bytes()


@pytest.fixture()
def s3_rt(settings, tmp_path, s3_bucket):
    """A runtime with its audio under the prefix `wq` of a new bucket, and a database and data
    dir of its own."""
    from models.runtime import Runtime

    rt = Runtime(
        dataclasses.replace(
            settings,
            data_dir=tmp_path / "data",
            storage=f"s3://{s3_bucket}/wq",
            database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
            audio_retention_seconds=3600.0,
        )
    )
    rt.db.upgrade()
    yield rt
    rt.db.dispose()


def stored(rt, data: bytes, job_id: str | None = None) -> str:
    """`data` stored as a job's audio, the way an upload is: its reference."""
    spool = rt.storage.spool(io.BytesIO(data))
    ref = rt.storage.store_audio(spool.path, job_id or str(uuid.uuid4()))
    spool.release()
    return ref


def job_with_audio(rt):
    """A PENDING job with the fox clip as its audio, recorded as the door records one."""
    spool = rt.storage.spool(io.BytesIO(FOX))
    job = make_job(rt, spool.path, filename="fox.flac", duration=4.3, language="en", priority="normal")
    spool.release()
    return job


def in_bucket(s3_env, rt, ref: str) -> bytes:
    """The object's bytes as the bucket holds them, read with a client of the test's own."""
    return s3_env.client().get_object(Bucket=rt.storage.bucket, Key=f"wq/{ref}")["Body"].read()


def small_parts(rt) -> None:
    """Parts of 5 MiB (S3's smallest) from 5 MiB up, so a test's file goes in parts."""
    from boto3.s3.transfer import TransferConfig

    rt.storage.transfer = TransferConfig(multipart_threshold=5 * MIB, multipart_chunksize=5 * MIB, max_concurrency=2)


# -- the settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, words",
    [
        ("s3", "is not one of: local, postgres, s3://BUCKET/PREFIX; set it to one of them"),
        ("nfs://server/x", "is not one of: local, postgres, s3://BUCKET/PREFIX"),
        ("s3://", "names no bucket; set it to s3://BUCKET/PREFIX"),
        ("s3:///audio", "names no bucket"),
        ("s3://My_Bucket/audio", "names 'My_Bucket', which is not an S3 bucket name"),
        ("s3://ab", "not an S3 bucket name (3 to 63 lowercase letters"),
        ("s3://10.0.0.1/audio", "not an S3 bucket name"),
        ("s3://bucket/a//b", "has the prefix 'a//b'"),
        ("s3://bucket/a/../b", "without . or .. parts"),
        ("s3://bucket/a b", "has the prefix 'a b'"),
        ("s3://AKIA:secret@bucket/x", "carries credentials or a port; name only the bucket"),
        ("s3://bucket:9000/x", "AWS_ENDPOINT_URL"),
    ],
)
def test_a_bad_storage_value_says_what_to_set(tmp_path, value, words):
    from config import ConfigError, Settings

    with pytest.raises(ConfigError) as err:
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_STORAGE": value})
    message = str(err.value)
    assert message.startswith("WHISPERQ_STORAGE=") and words in message, message
    assert "secret" not in message  # credentials written into the URL are not echoed


def test_an_s3_url_is_read_as_bucket_and_prefix(tmp_path):
    from config import Settings
    from config.settings import s3_location

    for value, stored_as in [
        ("S3://audio-bucket/whisperq/prod/", "s3://audio-bucket/whisperq/prod"),
        ("s3://audio.bucket", "s3://audio.bucket"),
        ("s3://audio-bucket/", "s3://audio-bucket"),
    ]:
        settings = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_STORAGE": value})
        assert settings.storage == stored_as and settings.describe()["storage"] == stored_as
    assert s3_location("s3://audio-bucket/whisperq/prod") == ("audio-bucket", "whisperq/prod")
    assert s3_location("s3://audio-bucket") == ("audio-bucket", "")


def test_without_boto3_s3_storage_stops_at_start_saying_what_to_install(tmp_path, monkeypatch):
    from config import ConfigError, Settings
    from models.storage.s3 import S3Storage

    monkeypatch.setitem(sys.modules, "boto3", None)  # as if it were not installed
    monkeypatch.setitem(sys.modules, "boto3.s3.transfer", None)
    with pytest.raises(ConfigError, match=r"boto3, which is not installed: pip install 'whisperq\[s3\]'"):
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_STORAGE": "s3://audio-bucket/wq"})
    with pytest.raises(ConfigError, match=r"pip install 'whisperq\[s3\]'"):  # a Settings made by hand
        S3Storage(tmp_path, "s3://audio-bucket/wq")
    local = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path)})  # the other backends need no boto3
    assert local.storage == "local"


def test_a_reference_never_leaves_the_prefix(s3_rt):
    job_id = str(uuid.uuid4())
    assert s3_rt.storage.key(f"audio/{job_id[:2]}/{job_id}") == f"wq/audio/{job_id[:2]}/{job_id}"
    bad = ("../other/x", "audio/../../x", "audio//x", "audio/./x", "/etc/passwd", "audio/ab/abc", f"audio/zz/{job_id}")
    for ref in bad:
        with pytest.raises(ValueError, match="is not one this service makes"):
            s3_rt.storage.key(ref)


def test_with_an_expected_owner_every_bucket_request_names_it(settings, tmp_path, s3_bucket):
    """WHISPERQ_S3_EXPECTED_OWNER goes out on every request that names a bucket, as S3's
    x-amz-expected-bucket-owner header (S3 answers 403 for a bucket another account owns)."""
    from models.storage.s3 import S3Storage

    storage = S3Storage(tmp_path / "data", f"s3://{s3_bucket}/wq", owner="123456789012")
    sent: list[tuple[str, str | None]] = []
    storage.client.meta.events.register(
        "before-send.s3",
        lambda request, **_kw: sent.append((request.method, request.headers.get("x-amz-expected-bucket-owner"))),
    )
    spool = storage.spool(io.BytesIO(FOX))
    ref = storage.store_audio(spool.path, str(uuid.uuid4()))
    spool.release()
    with storage.open(ref) as fh:
        assert fh.read() == FOX
    storage.delete(ref)
    assert {method for method, _ in sent} >= {"PUT", "GET", "DELETE"}
    assert {owner for _, owner in sent} == {b"123456789012"}, sent

    unset = S3Storage(tmp_path / "data", f"s3://{s3_bucket}/wq")
    seen: list[object] = []
    unset.client.meta.events.register(
        "before-send.s3", lambda request, **_kw: seen.append(request.headers.get("x-amz-expected-bucket-owner"))
    )
    assert not unset.exists(ref)
    assert seen == [None]


def test_an_expected_owner_must_be_an_account_id(tmp_path):
    from config.settings import ConfigError, Settings

    base = {"WHISPERQ_DATA_DIR": str(tmp_path)}
    with pytest.raises(ConfigError, match="WHISPERQ_S3_EXPECTED_OWNER='my-account' is not an AWS account id"):
        Settings.from_env({**base, "WHISPERQ_S3_EXPECTED_OWNER": "my-account"})
    assert (
        Settings.from_env({**base, "WHISPERQ_S3_EXPECTED_OWNER": " 123456789012 "}).s3_expected_owner == "123456789012"
    )
    assert Settings.from_env(base).s3_expected_owner is None


# -- reading and writing ------------------------------------------------------------------------


def test_reads_are_range_requests_so_a_seek_reads_little_of_the_object(s3_rt):
    data = random.Random(11).randbytes(3 * MIB + 12345)
    ref = stored(s3_rt, data)
    traffic = Traffic().watch(s3_rt.storage.client)
    size = s3_rt.storage.client.head_object(Bucket=s3_rt.storage.bucket, Key=s3_rt.storage.key(ref))["ContentLength"]
    traffic.clear()

    with s3_rt.storage.open(ref) as fh:  # opening reads the header and the last chunk (its length is checked)
        fh.seek(-4096, io.SEEK_END)
        assert fh.read() == data[-4096:]
        fh.seek(len(data) // 2)
        assert fh.read(4096) == data[len(data) // 2 : len(data) // 2 + 4096]
    gets = traffic.of("GetObject")
    assert gets and all(g["Range"].startswith("bytes=") and g.get("IfMatch") for g in gets)
    assert sum(traffic.received) <= 3 * SEALED_CHUNK + 64, (sum(traffic.received), size)  # not the 3 MiB
    assert sum(traffic.received) < size / 10

    traffic.clear()
    with s3_rt.storage.open(ref) as fh:  # read through: about the object once, a MiB a request
        assert fh.read() == data
    assert all("Range" in g for g in traffic.of("GetObject"))
    assert sum(traffic.received) <= size + 2 * SEALED_CHUNK
    assert len(traffic.of("GetObject")) <= size // MIB + 4


def test_what_the_bucket_holds_is_sealed(s3_rt, s3_env):
    ref = stored(s3_rt, FOX)
    raw = in_bucket(s3_env, s3_rt, ref)
    assert raw.startswith(MAGIC + bytes([len("test")]) + b"test")  # the sealed header, under the suite's key
    assert FOX[:4096] not in raw and FOX[-4096:] not in raw and b"fLaC" not in raw[:64]
    assert s3_rt.storage.key_id(ref) == "test"
    with s3_rt.storage.open(ref) as fh:
        assert fh.read() == FOX
    assert list(s3_rt.storage.tmp_dir.iterdir()) == []  # the spool went into the bucket
    assert not (s3_rt.settings.data_dir / "audio").exists()  # and nothing into the data dir


def test_a_file_above_the_multipart_threshold_goes_in_parts_and_reads_back_intact(s3_rt, s3_env):
    small_parts(s3_rt)
    data = random.Random(5).randbytes(11 * MIB + 777)
    traffic = Traffic().watch(s3_rt.storage.client)
    ref = stored(s3_rt, data)
    assert traffic.count()["UploadPart"] == 3 and traffic.count()["CompleteMultipartUpload"] == 1
    assert traffic.count()["PutObject"] == 0
    head = s3_env.client().head_object(Bucket=s3_rt.storage.bucket, Key=f"wq/{ref}")
    assert head["ETag"].strip('"').endswith("-3")  # S3's mark of an object put together from 3 parts
    with s3_rt.storage.open(ref) as fh:
        assert fh.read() == data
        fh.seek(5 * MIB - 10)  # across the first part's end
        assert fh.read(20) == data[5 * MIB - 10 : 5 * MIB + 10]
    assert in_bucket(s3_env, s3_rt, ref).startswith(MAGIC)


def test_delete_exists_and_a_missing_object(s3_rt):
    ref = stored(s3_rt, b"audio" * 1000)
    assert s3_rt.storage.exists(ref)
    s3_rt.storage.delete(ref)
    assert not s3_rt.storage.exists(ref)
    s3_rt.storage.delete(ref)  # none there: nothing happens
    with pytest.raises(FileNotFoundError, match=f"stored file {ref}"):
        s3_rt.storage.open(ref)
    with pytest.raises(FileNotFoundError):
        s3_rt.storage.key_id(ref)
    s3_rt.storage.delete("/a/callers/own/file.flac")  # a caller's own file is never touched (nor sent to S3)


def test_listing_pages_through_the_folders_with_when_each_was_written(s3_rt, s3_env):
    import numpy as np

    before = time.time()
    audio = sorted(stored(s3_rt, b"x" * 100, f"{n:02x}000000-0000-4000-8000-000000000000") for n in range(5))
    samples = s3_rt.storage.save_samples("ab000000-0000-4000-8000-000000000000", np.zeros(160, dtype=np.float32))
    own = s3_env.client()
    own.put_object(Bucket=s3_rt.storage.bucket, Key="wq/audio/", Body=b"")  # a console's folder placeholder
    own.put_object(Bucket=s3_rt.storage.bucket, Key="wq/elsewhere/x", Body=b"not ours")
    own.put_object(Bucket=s3_rt.storage.bucket, Key="other/audio/ab/x", Body=b"outside the prefix")
    s3_rt.storage.page_size = 2
    traffic = Traffic().watch(s3_rt.storage.client)

    listed = list(s3_rt.storage.listing())
    assert [f.ref for f in listed] == [*audio, samples]
    assert traffic.count()["ListObjectsV2"] >= 4  # three pages of audio, one of samples
    assert all(before - 5 <= f.written_at <= time.time() + 5 for f in listed)  # LastModified
    assert [f.ref for f in s3_rt.storage.listing(("prepared",), parts=True)] == [samples]


# -- key rotation -------------------------------------------------------------------------------


@pytest.mark.usefixtures("keyring_restored")
def test_rotation_reseals_every_object_under_the_new_key(s3_rt, s3_env):
    """What `whisperq encryption rotate` does (models.maintenance.rotation), on a bucket: a
    small object rewritten in one conditional PUT, one above the threshold in parts."""
    import os

    from models.maintenance import rotation
    from models.security.crypto import Keyring, set_keyring

    small_parts(s3_rt)
    small, large = b"small audio" * 1000, random.Random(9).randbytes(6 * MIB)
    refs = [stored(s3_rt, small), stored(s3_rt, large)]
    assert dict(rotation.usage(s3_rt).files) == {"test": 2}
    set_keyring(Keyring((("next", os.urandom(32)), *s3_rt.keyring.keys)))
    traffic = Traffic().watch(s3_rt.storage.client)

    report = rotation.rotate(s3_rt)
    assert (report.files_rewritten, report.files_current, report.failures) == (2, 0, [])
    assert len(traffic.of("PutObject")) == 1 and traffic.of("PutObject")[0]["IfMatch"]
    assert len(traffic.of("CompleteMultipartUpload")) == 1 and traffic.of("CompleteMultipartUpload")[0]["IfMatch"]
    assert dict(rotation.usage(s3_rt).files) == {"next": 2}
    for ref, data in zip(refs, (small, large), strict=True):
        assert in_bucket(s3_env, s3_rt, ref).startswith(MAGIC + bytes([4]) + b"next")
        with s3_rt.storage.open(ref) as fh:
            assert fh.read() == data
    again = rotation.rotate(s3_rt)
    assert (again.files_rewritten, again.files_current) == (0, 2)
    assert list(s3_rt.storage.tmp_dir.iterdir()) == []


@pytest.mark.usefixtures("keyring_restored")
def test_reseal_does_not_bring_back_an_object_deleted_or_replaced_meanwhile(s3_rt, s3_env, monkeypatch):
    import os

    from models.security.crypto import Keyring, set_keyring

    ref = stored(s3_rt, b"audio" * 1000)
    set_keyring(Keyring((("next", os.urandom(32)), *s3_rt.keyring.keys)))
    own, key = s3_env.client(), f"wq/{ref}"
    swap = s3_rt.storage._replace_if_unchanged

    def deleted_first(tmp, key_, etag):  # a DELETE /v1/jobs/<id> or retention got there first
        own.delete_object(Bucket=s3_rt.storage.bucket, Key=key)
        return swap(tmp, key_, etag)

    monkeypatch.setattr(s3_rt.storage, "_replace_if_unchanged", deleted_first)
    assert s3_rt.storage.reseal(ref) is False
    assert not s3_rt.storage.exists(ref)  # not brought back

    ref = stored(s3_rt, b"audio" * 1000)

    def replaced_first(tmp, key_, etag):  # written anew meanwhile (a redelivered job prepared again)
        own.put_object(Bucket=s3_rt.storage.bucket, Key=f"wq/{ref}", Body=b"newer")
        return swap(tmp, key_, etag)

    monkeypatch.setattr(s3_rt.storage, "_replace_if_unchanged", replaced_first)
    assert s3_rt.storage.reseal(ref) is False
    assert in_bucket(s3_env, s3_rt, ref) == b"newer"  # the newer object stays
    assert list(s3_rt.storage.tmp_dir.iterdir()) == []


# -- retention ----------------------------------------------------------------------------------


def test_retention_deletes_expired_audio_and_orphans_from_the_bucket(s3_rt):
    import numpy as np

    from models.jobs.record import Job, new_job_id, utcnow
    from models.maintenance.retention import run_retention

    ended, live = job_with_audio(s3_rt), job_with_audio(s3_rt)
    prepared = s3_rt.storage.save_samples(ended.id, np.zeros(160, dtype=np.float32))
    with s3_rt.db.session() as s:
        row = s.get(Job, ended.id)
        row.status, row.finished_at = "COMPLETED", utcnow()
    orphan = stored(s3_rt, b"left by a crash before its row", new_job_id())  # no job row names it

    now = utcnow()
    assert run_retention(s3_rt, now=now)["audio_purged"] == 0  # not yet an hour
    assert s3_rt.storage.exists(orphan)  # too young to judge: its row may be a moment away
    counts = run_retention(s3_rt, now=now + timedelta(hours=2))
    assert counts["audio_purged"] == 1 and counts["orphans_deleted"] == 1 and counts["errors"] == 0, counts
    assert not s3_rt.storage.exists(ended.audio_ref) and not s3_rt.storage.exists(prepared)
    assert not s3_rt.storage.exists(orphan)
    assert s3_rt.storage.exists(live.audio_ref)  # a job that has not ended keeps its audio


# -- a job through real workers -----------------------------------------------------------------


@pytest.mark.integration
def test_a_job_runs_through_real_workers_with_its_audio_in_the_bucket(
    settings, s3_env, s3_bucket, tmp_path, monkeypatch
):
    """Web and workers on S3 storage (and a broker and database of their own, so the session's
    workers, on the data dir, take none of these jobs): the audio is sealed in the bucket
    while its job lives, gone after DELETE /v1/jobs/<id>, and retention removes expired audio."""
    from models.jobs.record import utcnow
    from models.maintenance.retention import run_retention

    url = f"s3://{s3_bucket}/wq"
    with s3_stack(settings, tmp_path, monkeypatch, url, "s3", audio_retention_seconds=3600.0) as stack:
        private, rt, client, workers = stack.settings, stack.rt, stack.client, stack.workers
        assert rt.storage.kind == "s3"
        kept, deleted = submit_id(client, "fox.flac"), submit_id(client, "fox.flac")
        own, bucket = s3_env.client(), s3_bucket

        for job_id in (kept, deleted):
            job = wait_for_job(client, job_id, timeout=240)
            assert job["status"] == "COMPLETED", (job, [w.output()[-3000:] for w in workers])
            assert word_error_rate(CLIPS["fox.flac"]["text"], job["result"]["text"]) <= 0.2, job["result"]["text"]
            raw = own.get_object(Bucket=bucket, Key=f"wq/audio/{job_id[:2]}/{job_id}")["Body"].read()
            assert raw.startswith(MAGIC) and FOX[:4096] not in raw  # sealed in the bucket while the job lives
        wait_until(  # the inference pool lets the prepared samples go once the transcript is stored
            lambda: not any(rt.storage.exists(f"prepared/{j[:2]}/{j}.npy") for j in (kept, deleted)),
            60,
            "the prepared samples were not deleted from the bucket",
        )
        assert not (private.data_dir / "audio").exists() and not (private.data_dir / "prepared").exists()

        assert client.delete(f"/v1/jobs/{deleted}").status_code == 204
        keys = {o["Key"] for o in own.list_objects_v2(Bucket=bucket, Prefix="wq/").get("Contents", [])}
        assert keys == {f"wq/audio/{kept[:2]}/{kept}"}  # the deleted job's audio is gone, the other's stays

        counts = run_retention(rt, now=utcnow() + timedelta(hours=2))  # the beat task's pass, two hours on
        assert counts["files_deleted"] == 1 and counts["errors"] == 0, counts  # the kept job's audio
        assert own.list_objects_v2(Bucket=bucket, Prefix="wq/").get("KeyCount") == 0
