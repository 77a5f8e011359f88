"""`audio_url=s3://BUCKET/KEY`: read with the deployment's credentials, only under the submitting
key's S3 sources (or, without a key, WHISPERQ_ANONYMOUS_S3_SOURCES), never from the service's own
storage prefix, on whole path segments, the key decoded once; refused at the door with what to
fix, the same through JSON, batches and MQTT; checked again when the preparation pool fetches it,
streamed into storage sealed like any upload. Against moto's S3 server on loopback
(tests/s3_server.py): without boto3 and moto these tests skip, or fail under REQUIRE_SERVICES=1."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from api import bearer
from helpers import CLIPS
from s3_server import REGION, s3_stack
from sqlalchemy import func, select

FOX = CLIPS["fox.flac"]["path"].read_bytes()
MB = 1024 * 1024


@dataclasses.dataclass
class World:
    """An app whose audio lives under `wq` in the bucket `svc`, recordings in `src` and `oth`, a
    key `alice` with the sources `src/a` and the whole of `svc`, a key `bob` with none."""

    app: object
    rt: object
    client: object
    s3: object  # the test's own client
    src: str
    svc: str
    oth: str
    alice: tuple  # (record, token)
    bob: tuple
    published: list

    def url(self, bucket: str, key: str) -> str:
        return f"s3://{bucket}/{key}"

    def post(self, body: dict, token: str | None = None):
        return self.client.post("/v1/jobs", json=body, headers=bearer(token) if token else {})

    def jobs(self) -> int:
        from models.jobs.record import Job

        with self.rt.db.session() as s:
            return s.scalar(select(func.count()).select_from(Job))


def _bucket(s3_env, name: str) -> str:
    s3_env.client().create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    return name


def make_world(settings, s3_env, tmp_path, monkeypatch, anonymous: str | None = None, **changes) -> World:
    from models.access.apikeys import create_key
    from tasks.broker import CeleryBroker
    from web import create_app

    published: list = []
    monkeypatch.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: published.append(job.id))
    tag = uuid.uuid4().hex[:10]
    src, svc, oth = (_bucket(s3_env, f"wq-{kind}-{tag}") for kind in ("src", "svc", "oth"))
    tmp_path.mkdir(parents=True, exist_ok=True)
    values = {
        "data_dir": tmp_path / "data",
        "database_url": f"sqlite:///{tmp_path / 'jobs.db'}",
        "storage": f"s3://{svc}/wq",
        "allow_anonymous": False,
        "anonymous_s3_sources": (f"{src}/{anonymous}",) if anonymous else (),
        **changes,
    }
    app = create_app({"SETTINGS": dataclasses.replace(settings, **values), "TESTING": True})
    rt = app.extensions["whisperq"]
    s3 = s3_env.client()
    for bucket, key in (
        (src, "a/fox.flac"),
        (src, "a/deep/er/fox.flac"),
        (src, "a/my call.flac"),
        (src, "ab/fox.flac"),
        (src, "public/fox.flac"),
        (oth, "a/fox.flac"),
        (svc, "shared/fox.flac"),
        (svc, "wq/audio/ab/someone-elses-job"),
    ):
        s3.put_object(Bucket=bucket, Key=key, Body=FOX)
    alice = create_key(rt, f"alice-{tag}", "premium", s3_sources=[f"{src}/a", f"s3://{svc}/"])
    bob = create_key(rt, f"bob-{tag}", "premium")
    return World(app, rt, app.test_client(), s3, src, svc, oth, alice, bob, published)


@pytest.fixture()
def world(settings, s3_env, tmp_path, monkeypatch) -> World:
    w = make_world(settings, s3_env, tmp_path, monkeypatch)
    yield w
    w.rt.db.dispose()


def prepare(w: World, job_id: str):
    """The preparation pool's work on the job, in this process: fetch, seal, store, decode."""
    from models.pipeline.preparation import prepare_job

    return prepare_job(w.rt, job_id, None, {})


def job_of(w: World, job_id: str):
    from models.jobs.operations import get_job

    return get_job(w.rt, job_id)


# -- the URL and the rule, as functions -----------------------------------------------------


@pytest.mark.parametrize(
    "url, bucket, key",
    [
        ("s3://rec-bucket/a/fox.flac", "rec-bucket", "a/fox.flac"),
        ("S3://rec-bucket/a/my%20call.flac", "rec-bucket", "a/my call.flac"),
        ("s3://rec-bucket/a%2Ffox.flac", "rec-bucket", "a/fox.flac"),  # decoded once: checked as read
        ("s3://rec-bucket/a/100%25.flac", "rec-bucket", "a/100%.flac"),
        ("s3://rec-bucket/a/%252e%252e/x.flac", "rec-bucket", "a/%2e%2e/x.flac"),  # once only: a literal key
        ("s3://rec-bucket/a/K%C3%B6ln.flac", "rec-bucket", "a/Köln.flac"),
    ],
)
def test_an_s3_url_is_its_bucket_and_its_key_decoded_once(url, bucket, key):
    from models.access.s3_sources import parse_s3_url

    source = parse_s3_url(url)
    assert (source.bucket, source.key) == (bucket, key)
    assert parse_s3_url(source.url) == source  # what the job records reads back as the same object


@pytest.mark.parametrize(
    "url, words",
    [
        ("s3://rec-bucket/a/../ab/x.flac", "'..' segment"),
        ("s3://rec-bucket/a/%2e%2e/ab/x.flac", "'..' segment"),
        ("s3://rec-bucket/a/%2E%2E%2Fab/x.flac", "'..' segment"),
        ("s3://rec-bucket/./a/x.flac", "'.' or '..'"),
        ("s3://rec-bucket/a//x.flac", "empty"),
        ("s3://rec-bucket/a/", "ends in '/'"),
        ("s3://rec-bucket/a%2F", "ends in '/'"),
        ("s3://rec-bucket", "no object"),
        ("s3://rec-bucket/", "no object"),
        ("s3://Rec_Bucket/a/x.flac", "not an S3 bucket name"),
        ("s3://key:secret@rec-bucket/a/x.flac", "credentials or a port"),
        ("s3://rec-bucket/a/x.flac?versionId=1", "query or fragment"),
        ("s3://rec-bucket/a/x y.flac", "percent-encode a space"),
        ("s3://rec-bucket/a/%0Ax.flac", "control characters"),
        ("s3://rec-bucket/a/%ff.flac", "not UTF-8"),
    ],
)
def test_a_bad_s3_url_says_what_to_fix(url, words):
    from models.access.s3_sources import parse_s3_url
    from models.errors import InvalidRequest

    with pytest.raises(InvalidRequest) as err:
        parse_s3_url(url)
    assert words in str(err.value) and "s3://BUCKET/KEY" in str(err.value), str(err.value)


def test_an_entry_covers_whole_path_segments_below_it():
    from models.access.s3_sources import covers, parse_s3_url

    def ok(entry: str, url: str) -> bool:
        return covers(entry, parse_s3_url(url))

    assert ok("rec-bucket/a", "s3://rec-bucket/a/x.flac") and ok("rec-bucket/a", "s3://rec-bucket/a/b/c.flac")
    assert not ok("rec-bucket/a", "s3://rec-bucket/ab/x.flac")  # a sibling that shares the letters
    assert not ok("rec-bucket/a", "s3://rec-bucket/a")  # the folder's name, not an object below it
    assert not ok("rec-bucket/a/b", "s3://rec-bucket/a/x.flac")
    assert not ok("rec-bucket/a", "s3://rec-bucket2/a/x.flac") and not ok("rec-bucket/a", "s3://other-bkt/a/x.flac")
    assert ok("rec-bucket", "s3://rec-bucket/anything/at/all.flac")


def test_entries_are_normalised_and_bad_ones_refused(tmp_path):
    from config import ConfigError, Settings
    from models.access.apikeys import checked_sources
    from models.errors import InvalidRequest

    assert checked_sources(["s3://rec-bucket/a/b/", " rec-bucket/a/b", "other-bkt"]) == ("rec-bucket/a/b", "other-bkt")
    for bad, words in [
        ("Rec/a", "not an S3 bucket name"),
        ("rec-bucket/a/../b", "without . or .. parts"),
        ("rec-bucket/a//b", "single slashes"),
        ("/a", "names no bucket"),
    ]:
        with pytest.raises(InvalidRequest, match="S3 source") as err:
            checked_sources([bad])
        assert words in str(err.value)
    env = {"WHISPERQ_DATA_DIR": str(tmp_path)}
    assert Settings.from_env(env).anonymous_s3_sources == ()  # none by default
    assert Settings.from_env(
        {**env, "WHISPERQ_ANONYMOUS_S3_SOURCES": "pub-bkt/in, pub-bkt/in/"}
    ).anonymous_s3_sources == ("pub-bkt/in",)
    with pytest.raises(ConfigError, match=r"^WHISPERQ_ANONYMOUS_S3_SOURCES=.*without \. or \.\. parts"):
        Settings.from_env({**env, "WHISPERQ_ANONYMOUS_S3_SOURCES": "pub-bkt/../x"})


# -- through the door -----------------------------------------------------------------------


def test_an_allowed_object_is_accepted_fetched_and_sealed_into_storage(world):
    from models.security.sealed import MAGIC

    w = world
    token = w.alice[1]
    made = {}
    for key in ("a/fox.flac", "a/deep/er/fox.flac", "a/my%20call.flac"):
        resp = w.post({"audio_url": w.url(w.src, key), "language": "en"}, token)
        assert resp.status_code == 202, resp.get_json()
        made[key] = resp.get_json()["job_id"]
    shared = w.post({"audio_url": w.url(w.svc, "shared/fox.flac")}, token)  # svc's whole bucket, less wq/
    assert shared.status_code == 202, shared.get_json()
    made["shared"] = shared.get_json()["job_id"]
    assert w.published == list(made.values())

    for key, job_id in made.items():
        job = job_of(w, job_id)
        assert job.audio_url.startswith("s3://") and not job.audio_ref  # fetched by the preparation pool
        prepare(w, job_id)
        job = job_of(w, job_id)
        assert job.status == "PROCESSING" and job.audio_ref and job.audio_duration == pytest.approx(4.3, abs=0.2), key
        with w.rt.storage.open(job.audio_ref) as fh:
            assert fh.read() == FOX  # the object's bytes, as stored
        raw = w.s3.get_object(Bucket=w.svc, Key=f"wq/{job.audio_ref}")["Body"].read()
        assert raw.startswith(MAGIC) and FOX[:4096] not in raw  # sealed like any upload
    assert job_of(w, made["a/my%20call.flac"]).audio_url == f"s3://{w.src}/a/my%20call.flac"


@pytest.mark.parametrize(
    "who, bucket, key, status, words",
    [
        ("alice", "oth", "a/fox.flac", 403, "its S3 sources are s3://{src}/a/…, s3://{svc}/…"),
        ("alice", "src", "ab/fox.flac", 403, "may not have audio_url s3://{src}/ab/fox.flac read"),
        ("alice", "src", "a", 403, "name an object under one of them"),
        ("alice", "svc", "wq/audio/ab/someone-elses-job", 403, "this service's own storage (WHISPERQ_STORAGE)"),
        ("alice", "svc", "wq/x/%2e%2e/audio/ab/someone-elses-job", 400, "'..' segment"),
        ("alice", "src", "a/../ab/fox.flac", 400, "'..' segment"),
        ("alice", "src", "a/%2E%2E/ab/fox.flac", 400, "'..' segment"),
        ("alice", "src", "a/nothing-here.flac", 400, "there is no such object (S3 answered 404"),
        ("bob", "src", "a/fox.flac", 403, "this API key may not have any S3 object read"),
    ],
)
def test_refused_at_the_door_saying_what_to_fix(world, who, bucket, key, status, words):
    w = world
    token = {"alice": w.alice[1], "bob": w.bob[1]}[who]
    resp = w.post({"audio_url": w.url(getattr(w, bucket), key)}, token)
    assert resp.status_code == status, resp.get_json()
    error = resp.get_json()["error"]
    assert words.format(src=w.src, svc=w.svc) in error["message"], error
    if status == 403:
        assert error["code"] == "forbidden"
        expected = [f"{w.src}/a", w.svc] if who == "alice" else []
        assert error["allowed_s3_sources"] == expected
    assert w.jobs() == 0 and w.published == []  # nothing stored, nothing queued


def test_an_object_over_the_upload_limit_is_refused_by_its_size(settings, s3_env, tmp_path, monkeypatch):
    w = make_world(settings, s3_env, tmp_path, monkeypatch, max_upload_mb=1)
    try:
        w.s3.put_object(Bucket=w.src, Key="a/long.flac", Body=FOX + b"\0" * (2 * MB))
        resp = w.post({"audio_url": w.url(w.src, "a/long.flac")}, w.alice[1])
        assert resp.status_code == 413, resp.get_json()
        assert "larger than the upload limit of 1 MB (WHISPERQ_MAX_UPLOAD_MB)" in resp.get_json()["error"]["message"]
        assert w.jobs() == 0
        # Grown past the limit after the door let it in: the fetch stops at the limit, stores nothing.
        accepted = w.post({"audio_url": w.url(w.src, "a/fox.flac")}, w.alice[1]).get_json()["job_id"]
        w.s3.put_object(Bucket=w.src, Key="a/fox.flac", Body=FOX + b"\0" * (2 * MB))
        from models.errors import PermanentJobError

        with pytest.raises(PermanentJobError, match="larger than the upload limit"):
            prepare(w, accepted)
        job = job_of(w, accepted)
        assert job.status == "FAILED" and not job.audio_ref
        assert not list((w.rt.storage.tmp_dir).glob("fetch-*"))  # nothing left half-written
    finally:
        w.rt.db.dispose()


def test_without_a_key_none_unless_the_operator_opens_prefixes(settings, s3_env, tmp_path, monkeypatch):
    closed = make_world(settings, s3_env, tmp_path / "closed", monkeypatch, allow_anonymous=True)
    try:
        resp = closed.post({"audio_url": closed.url(closed.src, "public/fox.flac")})
        assert resp.status_code == 403, resp.get_json()
        error = resp.get_json()["error"]
        assert "a submission without an API key may not have any S3 object read" in error["message"]
        assert "WHISPERQ_ANONYMOUS_S3_SOURCES" in error["message"] and error["allowed_s3_sources"] == []
    finally:
        closed.rt.db.dispose()
    opened = make_world(settings, s3_env, tmp_path / "open", monkeypatch, anonymous="public", allow_anonymous=True)
    try:
        src = opened.src
        assert opened.post({"audio_url": opened.url(src, "public/fox.flac")}).status_code == 202
        other = opened.post({"audio_url": opened.url(src, "a/fox.flac")})
        assert other.status_code == 403 and other.get_json()["error"]["allowed_s3_sources"] == [f"{src}/public"]
    finally:
        opened.rt.db.dispose()


def test_a_batch_is_checked_item_by_item_by_the_same_rule(world):
    w = world
    good, sibling = w.url(w.src, "a/fox.flac"), w.url(w.src, "ab/fox.flac")
    refused = w.client.post("/v1/batches", json={"audio_urls": [good, sibling]}, headers=bearer(w.alice[1]))
    assert refused.status_code == 403, refused.get_json()
    error = refused.get_json()["error"]
    assert error["message"].startswith("audio_urls[1]: this API key may not have audio_url")
    assert error["allowed_s3_sources"] == [f"{w.src}/a", w.svc]
    missing = w.client.post(
        "/v1/batches",
        json={"items": [{"audio_url": good}, {"audio_url": w.url(w.src, "a/none.flac")}]},
        headers=bearer(w.alice[1]),
    )
    assert missing.status_code == 400 and missing.get_json()["error"]["message"].startswith("items[1]: audio_url")
    own = w.client.post(
        "/v1/batches", json={"audio_urls": [w.url(w.svc, "wq/audio/ab/someone-elses-job")]}, headers=bearer(w.alice[1])
    )
    assert own.status_code == 403 and "own storage" in own.get_json()["error"]["message"]
    assert w.jobs() == 0 and w.published == []
    made = w.client.post(
        "/v1/batches", json={"audio_urls": [good, w.url(w.src, "a/deep/er/fox.flac")]}, headers=bearer(w.alice[1])
    )
    assert made.status_code == 202, made.get_json()
    jobs = made.get_json()["jobs"]
    assert len(jobs) == 2 and w.jobs() == 2
    prepare(w, jobs[1]["job_id"])
    with w.rt.storage.open(job_of(w, jobs[1]["job_id"]).audio_ref) as fh:
        assert fh.read() == FOX


def test_an_mqtt_request_meets_the_same_rule(world):
    from models.access.apikeys import principal_for_key_id
    from web.mqtt.requests import Refused, Request
    from web.mqtt.submit import submit

    w = world
    alice, bob = (principal_for_key_id(w.rt, k[0].id) for k in (w.alice, w.bob))

    def ask(who, key: str, bucket: str | None = None):
        body = {"audio_url": w.url(bucket or w.src, key)}
        return submit(w.app, Request("c-" + uuid.uuid4().hex[:6], "r-1", "whisperq/replies/x", "audio_url", body), who)

    for who, bucket, key, code, words in [
        (alice, w.src, "ab/fox.flac", "forbidden", f"its S3 sources are s3://{w.src}/a/…"),
        (alice, w.svc, "wq/audio/ab/someone-elses-job", "forbidden", "own storage"),
        (alice, w.src, "a/%2e%2e/ab/fox.flac", "invalid_request", "'..' segment"),
        (alice, w.src, "a/none.flac", "invalid_request", "no such object"),
        (bob, w.src, "a/fox.flac", "forbidden", "may not have any S3 object read"),
    ]:
        with pytest.raises(Refused) as err:
            ask(who, key, bucket)
        assert (err.value.code, words in str(err.value)) == (code, True), (key, str(err.value))
    assert w.jobs() == 0
    job, created = ask(alice, "a/fox.flac")
    assert created and job.audio_url == w.url(w.src, "a/fox.flac") and job.origin == "mqtt"


def test_grpc_submit_meets_the_same_rule(world):
    grpc = pytest.importorskip("grpc")
    from config.grpc import GrpcSettings
    from web.rpc.server import start
    from web.rpc.v1 import transcription_pb2 as pb
    from web.rpc.v1.transcription_pb2_grpc import TranscriptionStub

    w = world
    server = start(w.rt, GrpcSettings(address="127.0.0.1", port=0, threads=2))
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        stub = TranscriptionStub(channel)

        def submit(key: str, bucket: str | None = None, token: str | None = None):
            metadata = [("authorization", f"Bearer {token or w.alice[1]}")]
            return stub.Submit(pb.SubmitRequest(audio_url=w.url(bucket or w.src, key)), metadata=metadata, timeout=30)

        for key, bucket, token, code, words in [
            ("ab/fox.flac", None, None, grpc.StatusCode.PERMISSION_DENIED, f"its S3 sources are s3://{w.src}/a/…"),
            ("wq/audio/ab/someone-elses-job", w.svc, None, grpc.StatusCode.PERMISSION_DENIED, "own storage"),
            ("a/%2e%2e/ab/fox.flac", None, None, grpc.StatusCode.INVALID_ARGUMENT, "'..' segment"),
            ("a/none.flac", None, None, grpc.StatusCode.INVALID_ARGUMENT, "no such object"),
            ("a/fox.flac", None, w.bob[1], grpc.StatusCode.PERMISSION_DENIED, "may not have any S3 object read"),
        ]:
            with pytest.raises(grpc.RpcError) as err:
                submit(key, bucket, token)
            assert err.value.code() is code and words in err.value.details(), (key, err.value.details())
        assert w.jobs() == 0
        job = submit("a/fox.flac")
        assert job.audio_url == w.url(w.src, "a/fox.flac") and w.jobs() == 1
    finally:
        channel.close()
        server.stop(0)


# -- one job through real workers -------------------------------------------------------------


@pytest.mark.integration
def test_an_s3_job_runs_through_real_workers(settings, s3_env, tmp_path, monkeypatch):
    """Web and workers of their own (broker, database, S3 storage), as tests/test_s3.py runs
    them: the preparation pool reads the key's object with the deployment's credentials, seals
    it into storage, and the job completes with the clip's words."""
    from helpers import wait_until, word_error_rate

    from models.access.apikeys import create_key

    tag = uuid.uuid4().hex[:10]
    src, svc = (_bucket(s3_env, f"wq-{kind}-{tag}") for kind in ("src", "svc"))
    s3_env.client().put_object(Bucket=src, Key="calls/fox.flac", Body=FOX)
    with s3_stack(settings, tmp_path, monkeypatch, f"s3://{svc}/wq", "s3src", allow_anonymous=False) as stack:
        rt, client, workers = stack.rt, stack.client, stack.workers
        _record, token = create_key(rt, f"e2e-{tag}", "premium", s3_sources=[f"{src}/calls"])
        resp = client.post(
            "/v1/jobs", json={"audio_url": f"s3://{src}/calls/fox.flac", "language": "en"}, headers=bearer(token)
        )
        assert resp.status_code == 202, resp.get_json()
        job_id = resp.get_json()["job_id"]

        def finished():
            job = client.get(f"/v1/jobs/{job_id}", headers=bearer(token)).get_json()
            return job["status"] in ("COMPLETED", "FAILED") and job

        job = wait_until(finished, 240, f"job {job_id} did not finish")
        assert job["status"] == "COMPLETED", (job, [w.output()[-3000:] for w in workers])
        assert word_error_rate(CLIPS["fox.flac"]["text"], job["result"]["text"]) <= 0.2, job["result"]["text"]
        with rt.storage.open(f"audio/{job_id[:2]}/{job_id}") as fh:
            assert fh.read() == FOX  # the object, sealed into the service's own prefix


# -- again at the fetch -----------------------------------------------------------------------


def test_the_fetch_checks_again_and_fails_a_job_saying_why(world):
    from models.access.apikeys import set_s3_sources
    from models.errors import PermanentJobError

    w = world
    token = w.alice[1]
    gone, revoked = (
        w.post({"audio_url": w.url(w.src, key)}, token).get_json()["job_id"]
        for key in ("a/fox.flac", "a/my%20call.flac")
    )
    w.s3.delete_object(Bucket=w.src, Key="a/fox.flac")
    with pytest.raises(PermanentJobError):
        prepare(w, gone)
    assert job_of(w, gone).status == "FAILED" and "there is no such object" in job_of(w, gone).error
    set_s3_sources(w.rt, w.alice[0].id, [f"{w.src}/b"])  # the operator narrowed the key meanwhile
    with pytest.raises(PermanentJobError):
        prepare(w, revoked)
    failed = job_of(w, revoked)
    assert failed.status == "FAILED" and f"its S3 sources are s3://{w.src}/b/…" in failed.error, failed.error
    assert not failed.audio_ref and not list(w.rt.storage.tmp_dir.glob("fetch-*"))


class Refusing:
    """A client that answers every request with one S3 error."""

    def __init__(self, status: int, code: str):
        from botocore.exceptions import ClientError

        self.error = ClientError(
            {
                "Error": {"Code": code, "Message": "words of the server's"},
                "ResponseMetadata": {"HTTPStatusCode": status},
            },
            "GetObject",
        )

    def head_object(self, **_kw):
        raise self.error

    def get_object(self, **_kw):
        raise self.error


@pytest.mark.parametrize(
    "status, code, at_door, at_fetch, words",
    [
        (403, "AccessDenied", 400, "permanent", "S3 refused this deployment's credentials (403 AccessDenied)"),
        (404, "NoSuchBucket", 400, "permanent", "there is no such bucket"),
        (503, "SlowDown", 202, "transient", "S3 answered 503 SlowDown; it will be tried again"),
        (500, "InternalError", 202, "transient", "it will be tried again"),
    ],
)
def test_what_s3_answers_is_told_without_its_words(world, monkeypatch, status, code, at_door, at_fetch, words):
    """S3's refusals at the door are 400 saying what to fix; what may pass is left to the fetch,
    which retries it. Nothing the server wrote but its status and code reaches the client."""
    from models.errors import PermanentJobError, TransientJobError

    w = world
    monkeypatch.setattr(type(w.rt), "s3_client", lambda rt: Refusing(status, code))
    resp = w.post({"audio_url": w.url(w.src, "a/fox.flac")}, w.alice[1])
    assert resp.status_code == at_door, resp.get_json()
    if at_door == 400:
        assert words in resp.get_json()["error"]["message"] and "server's" not in resp.get_json()["error"]["message"]
        return
    with pytest.raises(TransientJobError if at_fetch == "transient" else PermanentJobError) as err:
        prepare(w, resp.get_json()["job_id"])
    assert words in str(err.value) and "server's" not in str(err.value)


def test_the_keys_command_sets_and_shows_a_keys_sources(settings, database):
    from click.testing import CliRunner

    from models.access.apikeys import find_key
    from models.runtime import Runtime
    from web.cli import cli

    runner = CliRunner()
    name = f"s3-cli-{uuid.uuid4().hex[:6]}"
    made = runner.invoke(cli, ["keys", "create", "--name", name, "--s3-source", "rec-bucket/calls/"])
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[0]
    assert "S3 sources rec-bucket/calls" in made.stderr
    rt = Runtime(settings)
    try:
        assert find_key(rt, token[:10]).s3_sources == ["rec-bucket/calls"]
        shown = runner.invoke(cli, ["keys", "s3-sources", token[:10]])
        assert shown.exit_code == 0 and "under rec-bucket/calls" in shown.output
        changed = runner.invoke(cli, ["keys", "s3-sources", token[:10], "rec-bucket/a", "s3://other-bkt"])
        assert changed.exit_code == 0 and "rec-bucket/a, other-bkt" in changed.output, changed.output
        assert find_key(rt, token[:10]).to_dict()["s3_sources"] == ["rec-bucket/a", "other-bkt"]
        bad = runner.invoke(cli, ["keys", "s3-sources", token[:10], "rec-bucket/a/../b"])
        assert bad.exit_code != 0 and "without . or .. parts" in bad.output
        cleared = runner.invoke(cli, ["keys", "s3-sources", token[:10], "--none"])
        assert cleared.exit_code == 0 and "no S3 sources" in cleared.output
        assert find_key(rt, token[:10]).s3_sources is None
        listed = runner.invoke(cli, ["keys", "list", "--json"])
        assert '"s3_sources": []' in listed.output
    finally:
        rt.db.dispose()
