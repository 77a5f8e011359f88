"""The gRPC door (web/rpc/, docs/clients/grpc.md), called as a client in another program would
call it: through stubs generated from the .proto by grpc_tools into this run's temporary
directory, not the server's own classes. The server runs in this process over a Flask app's
runtime of the test's own settings, on a free loopback port."""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import struct
import threading
import uuid
from pathlib import Path

import pytest
from helpers import CLIPS, make_job, proto_stubs, wait_until, word_error_rate

grpc = pytest.importorskip("grpc")
pytest.importorskip("grpc_tools")

ROOT = Path(__file__).resolve().parent.parent
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED")


# --- a client from the .proto ------------------------------------------------------------------


@pytest.fixture(scope="session")
def client_stubs(tmp_path_factory):
    """(messages, service stubs) generated from the .proto into a directory of this run."""
    return proto_stubs(tmp_path_factory.mktemp("grpc-client"))


@dataclasses.dataclass
class Door:
    rt: object
    app: object
    port: int
    channel: object
    stub: object
    pb: object

    def call(self, name: str, request, key: str | None = None, timeout: float = 60.0):
        metadata = [("authorization", f"Bearer {key}")] if key else None
        return getattr(self.stub, name)(request, metadata=metadata, timeout=timeout)


@pytest.fixture()
def door(settings, database, client_stubs):
    """A gRPC server over an app with `settings` changed as `door.build(**changes)` says."""
    from config.grpc import GrpcSettings
    from web import create_app
    from web.rpc.server import start

    pb, pb_grpc = client_stubs
    started: list = []

    def build(tls: tuple[Path, Path] | None = None, door: dict | None = None, **changes) -> Door:
        """`door`: the gRPC door's own settings (config.grpc) over the test's defaults."""
        app = create_app({"SETTINGS": dataclasses.replace(settings, **changes), "TESTING": True})
        rt = app.extensions["whisperq"]
        cert, key = tls or (None, None)
        own = {"threads": 8, "streams": 4, **(door or {})}
        server = start(rt, GrpcSettings(address="127.0.0.1", port=0, tls_cert=cert, tls_key=key, **own))
        if tls:
            creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
            channel = grpc.secure_channel(f"localhost:{server.port}", creds)
        else:
            channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        started.append((server, channel))
        return Door(rt, app, server.port, channel, pb_grpc.TranscriptionStub(channel), pb)

    yield build
    for server, channel in started:
        channel.close()
        server.stop(0)


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def clip_request(pb, name: str = "fox.flac", **options):
    return pb.SubmitRequest(audio=CLIPS[name]["path"].read_bytes(), filename=name, **options)


def watch(d: Door, job_id: str, key: str | None = None, timeout: float = 240.0) -> list:
    """Every Job message WatchJob sends for `job_id`, until the stream ends."""
    return list(d.call("WatchJob", d.pb.WatchJobRequest(id=job_id), key=key, timeout=timeout))


def status_name(pb, job) -> str:
    return pb.Job.Status.Name(job.status)


# --- the stubs and the service's description ---------------------------------------------------


def test_the_checked_in_stubs_are_what_protoc_generates_from_the_proto(tmp_path):
    from web.rpc import protoc

    written = protoc.generate(tmp_path)
    assert [p.name for p in written] == list(protoc.FILES)
    for path in written:
        assert path.read_text() == (protoc.STUBS / path.name).read_text(), (
            f"web/rpc/v1/{path.name} is not what the .proto gives: run `make proto`"
        )


def test_the_stubs_load_on_the_oldest_grpcio_and_protobuf_setup_cfg_allows():
    """The generated code refuses to import on a grpcio or protobuf older than the generator
    that wrote it: the versions the stubs record are the floors of setup.cfg's ranges, so any
    install the ranges allow loads them (and grpcio-tools is pinned to that generator)."""
    import configparser

    from packaging.requirements import Requirement

    from web.rpc import protoc

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    floors = {}
    for line in cfg["options"]["install_requires"].splitlines() + cfg["options.extras_require"]["test"].splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        req = Requirement(line)
        for spec in req.specifier:
            if spec.operator in (">=", "=="):
                floors[req.name] = spec.version
    grpc_stub = (protoc.STUBS / "transcription_pb2_grpc.py").read_text()
    messages = (protoc.STUBS / "transcription_pb2.py").read_text()
    assert f"GRPC_GENERATED_VERSION = '{floors['grpcio']}'" in grpc_stub
    assert floors["grpcio-tools"] == floors["grpcio"], "grpcio-tools is pinned to the grpcio floor"
    major, minor, patch = floors["protobuf"].split(".")
    assert f"Protobuf Python Version: {floors['protobuf']}" in messages
    assert f"PUBLIC,\n    {major},\n    {minor},\n    {patch}," in messages


def test_every_option_of_post_v1_jobs_is_a_field_of_submit_request_that_can_be_left_unset(client_stubs):
    """The .proto is checked against the options' one declaration (models.pipeline.request):
    each option a field of SubmitRequest under its name, with presence, of its kind's type."""
    from google.protobuf.descriptor import FieldDescriptor as F

    from models.pipeline.request import OPTIONS, names_for

    pb, _ = client_stubs
    fields = pb.SubmitRequest.DESCRIPTOR.fields_by_name
    assert set(fields) == {*names_for("grpc"), "audio", "audio_url", "filename", "idempotency_key"}
    for o in OPTIONS:
        assert o.name in fields and fields[o.name].has_presence, o.name
        wanted = {"flag": F.TYPE_BOOL, "number": F.TYPE_DOUBLE}.get(o.kind, F.TYPE_STRING)
        assert fields[o.name].type == wanted, o.name


def _leaves(value, path=()):
    """Every (path, value) of a JSON value that is not empty nor false nor zero (what proto3
    leaves out), lists by position."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    elif value not in (None, "", [], {}, False, 0):
        yield path, value


def test_every_field_of_a_jobs_view_reaches_the_job_message(app_rt):
    """A job with every analysis (speakers over words, redaction, one analysis failed), scores,
    confidence, hotwords and a correction: its GET body as the Job message and back loses no
    field but the HTTP body's links (web.rpc.jobs.HTTP_ONLY), and a field the message lacks is
    an error, never dropped."""
    from google.protobuf import json_format

    from models.analysis import merged
    from models.jobs.record import Job, JobAnalysis, utcnow
    from web.rpc.jobs import HTTP_ONLY, job_body, message_of

    words = [
        {"word": "Call", "start": 0.0, "end": 0.4, "probability": 0.9},
        {"word": "bob@example.com", "start": 0.4, "end": 1.6, "probability": 0.8},
        {"word": "now.", "start": 2.0, "end": 2.4, "probability": 0.95},
    ]
    segment = {"start": 0.0, "end": 2.4, "text": "Call bob@example.com now.", "words": words}
    segment.update(avg_logprob=-0.2, no_speech_prob=0.01, compression_ratio=1.1)
    transcript = {"text": segment["text"], "language": "en", "duration": 2.5, "segments": [segment]}
    entity = {"kind": "EMAIL_ADDRESS", "segment": 0, "start": 5, "end": 20, "time_start": 0.4, "time_end": 1.6}
    runs = {
        "redact": ({"kinds": ["email"]}, {"kinds": ["EMAIL_ADDRESS"], "entities": [entity], "count": 1}),
        "speakers": (
            {},
            {
                "speakers": ["A", "B"],
                "turns": [{"speaker": "A", "start": 0, "end": 1.8}, {"speaker": "B", "start": 1.8, "end": 2.5}],
            },
        ),
    }
    out = merged(transcript, runs)
    asked = {"speakers": {}, "redact": {"kinds": ["email"]}}
    job_id = make_job(app_rt, audio_url="https://files.example.com/a.flac", hotwords="Bob", analyses=asked).id
    with app_rt.db.session() as session:
        job = session.get(Job, job_id)
        job.start("w@test", "w1")
        job.store_transcript(
            out["text"], "en", out["segments"], 2.5, {"name": "tiny.en", "version": "v", "beam_size": 5}, 0.97
        )
        job.result_extra = {k: v for k, v in out.items() if k not in ("text", "language", "duration", "segments")}
        job.analysis_runs = [
            JobAnalysis(name="redact", status="DONE", version="1", seconds=0.2),
            JobAnalysis(name="speakers", status="FAILED", error="the audio was gone"),
        ]
        job.finish()
        job.correction, job.corrected_at = {"text": "Call Bob now.", "segments": [segment]}, utcnow()
    with app_rt.db.session() as session:
        job = session.get(Job, job_id)
        body = job_body(app_rt, job)
    assert body["result"]["speakers"] == ["A", "B"] and body["result"]["redacted"]["count"] == 1
    assert body["analyses"]["speakers"]["error"] == "the audio was gone" and body["confidence"]
    assert any("speaker" in w for w in body["result"]["segments"][0]["words"])

    back = json_format.MessageToDict(message_of(body), preserving_proto_field_name=True)
    back["job_id"] = back.pop("id")
    expected = {k: v for k, v in body.items() if k not in HTTP_ONLY}
    expected["result"] = {k: v for k, v in expected["result"].items() if k != "job_id"}
    got = dict(_leaves(back))
    for path, value in _leaves(expected):
        assert path in got, f"{'.'.join(map(str, path))} is in the job's view but not in the Job message"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert float(got[path]) == pytest.approx(value), path
    with pytest.raises(json_format.ParseError, match="novel"):
        message_of({**body, "novel": 1})


def test_the_proto_ships_with_the_package():
    text = (ROOT / "setup.cfg").read_text()
    assert "rpc/proto/whisperq/v1/*.proto" in text
    assert "package whisperq.v1;" in (ROOT / "web/rpc/proto/whisperq/v1/transcription.proto").read_text()


def test_settings_have_loopback_defaults_and_say_what_to_set(tmp_path):
    from config import ConfigError
    from config.grpc import GrpcSettings

    default = GrpcSettings.from_env({})
    assert (default.address, default.port, default.tls) == ("127.0.0.1", 50051, False)
    assert GrpcSettings.from_env({"WHISPERQ_GRPC_ADDRESS": "::1", "WHISPERQ_GRPC_PORT": "0"}).target == "[::1]:0"
    with pytest.raises(ConfigError, match=r"WHISPERQ_GRPC_PORT.*set it to"):
        GrpcSettings.from_env({"WHISPERQ_GRPC_PORT": "http"})
    with pytest.raises(ConfigError, match="WHISPERQ_GRPC_TLS_KEY is not: set both"):
        cert = tmp_path / "cert.pem"
        cert.write_text("-----BEGIN CERTIFICATE-----\n")
        GrpcSettings.from_env({"WHISPERQ_GRPC_TLS_CERT": str(cert)})
    with pytest.raises(ConfigError, match=r"cannot be read.*set it to the path of a PEM file"):
        GrpcSettings.from_env(
            {"WHISPERQ_GRPC_TLS_CERT": str(tmp_path / "none.pem"), "WHISPERQ_GRPC_TLS_KEY": str(tmp_path / "none.key")}
        )
    # plaintext beyond this machine only when an operator says a proxy or mesh does TLS
    with pytest.raises(ConfigError, match=r"in plaintext: set WHISPERQ_GRPC_TLS_CERT .* or WHISPERQ_GRPC_PLAINTEXT"):
        GrpcSettings.from_env({"WHISPERQ_GRPC_ADDRESS": "0.0.0.0"})
    assert GrpcSettings.from_env({"WHISPERQ_GRPC_ADDRESS": "0.0.0.0", "WHISPERQ_GRPC_PLAINTEXT": "true"}).port == 50051
    assert GrpcSettings.from_env({"WHISPERQ_GRPC_ADDRESS": "::1"}).address == "::1"  # loopback: plaintext is fine
    assert (default.streams, default.streams_per_client, default.reflection) == (16, 4, False)
    with pytest.raises(ConfigError, match="WHISPERQ_GRPC_READ_RATE='often' is not a rate"):
        GrpcSettings.from_env({"WHISPERQ_GRPC_READ_RATE": "often"})


def test_the_command_and_whisperq_run_start_it(tmp_path):
    from click.testing import CliRunner

    from web.cli import cli
    from web.supervise import wanted

    result = CliRunner().invoke(cli, ["grpc", "--help"])
    assert result.exit_code == 0 and "WHISPERQ_GRPC_PORT" in result.output
    from web.supervise import config_text, procfile_processes

    # A Procfile line of its own (compose.yaml and deploy/k8s run it too: tests/test_deploy.py),
    # which `whisperq run` starts whatever the environment: no setting it waits for, and on SQS too.
    processes = procfile_processes(ROOT / "Procfile")
    assert ("grpc", "whisperq grpc") in processes
    for env in ({}, {"CELERY_BROKER_URL": "sqs://"}):
        run, left_out = wanted(processes, env)
        assert dict(run)["grpc"] == "whisperq grpc" and "grpc" not in left_out, env
    assert "[program:grpc]" in config_text(run, ROOT, tmp_path)


def test_the_domain_knows_nothing_of_grpc():
    import re

    library = re.compile(r"^\s*(?:import|from)\s+(?:grpc|grpc_\w+|google\.rpc)\b", re.MULTILINE)
    for top in ("config", "models", "tasks"):
        for path in (ROOT / top).rglob("*.py"):
            assert not library.search(path.read_text()), path


# --- health, reflection, TLS --------------------------------------------------------------------


def test_health_is_serving_and_reflection_lists_the_service_only_where_turned_on(door):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    closed = reflection_pb2_grpc.ServerReflectionStub(door().channel)
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    off = refused(lambda: list(closed.ServerReflectionInfo(iter([ask]), timeout=10)))
    assert off.code() == grpc.StatusCode.UNIMPLEMENTED  # WHISPERQ_GRPC_REFLECTION is off by default
    d = door(door={"reflection": True})
    health = health_pb2_grpc.HealthStub(d.channel)
    for service in ("", "whisperq.v1.Transcription"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    reflect = reflection_pb2_grpc.ServerReflectionStub(d.channel)
    answers = list(
        reflect.ServerReflectionInfo(
            iter(
                [
                    reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(file_containing_symbol="whisperq.v1.Transcription"),
                ]
            ),
            timeout=10,
        )
    )
    listed = {s.name for s in answers[0].list_services_response.service}
    assert {"whisperq.v1.Transcription", "grpc.health.v1.Health"} <= listed
    assert answers[1].file_descriptor_response.file_descriptor_proto  # grpcurl can describe it


def test_tls_when_a_certificate_and_key_are_given(door, tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    d = door(tls=(cert_path, key_path))
    answer = health_pb2_grpc.HealthStub(d.channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    plain = grpc.insecure_channel(f"127.0.0.1:{d.port}")  # a plaintext client gets nowhere
    try:
        err = refused(lambda: health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=5))
        assert err.code() is grpc.StatusCode.UNAVAILABLE
    finally:
        plain.close()


# --- refusals -----------------------------------------------------------------------------------


def test_a_bad_option_and_audio_that_is_not_audio_are_invalid_argument_with_the_apis_messages(door):
    d = door()
    pb = d.pb
    err = refused(lambda: d.call("Submit", clip_request(pb, priority="urgent")))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT and "priority" in err.details(), err.details()
    err = refused(lambda: d.call("Submit", clip_request(pb, temperature=3.0)))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature must be a number from 0 to 1" in err.details()
    err = refused(
        lambda: d.call("Submit", pb.SubmitRequest(audio=b"this is not audio at all" * 200, filename="notes.mp3"))
    )
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT, (err.code(), err.details())
    assert dict(err.trailing_metadata())["whisperq-error-code"] == "unsupported_audio"
    err = refused(lambda: d.call("Submit", pb.SubmitRequest(audio=b"", filename="empty.wav")))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    err = refused(lambda: d.call("Submit", pb.SubmitRequest(audio=b"RIFF", filename="../x.wav")))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT and "plain name" in err.details()
    err = refused(lambda: d.call("Submit", pb.SubmitRequest(priority="high")))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT and "no audio" in err.details()


def test_a_priority_above_the_callers_cap_is_permission_denied(door):
    d = door(anonymous_max_priority="normal")
    err = refused(lambda: d.call("Submit", clip_request(d.pb, priority="high")))
    assert err.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "anonymous use may ask for priority normal or low, not high" in err.details()


def test_an_upload_over_the_limit_is_refused_saying_the_limit(door):
    d = door(max_upload_mb=1)
    pb = d.pb

    def chunks():
        yield pb.UploadChunk(head=pb.SubmitRequest(filename="big.wav"), data=b"\0" * (512 * 1024))
        for _ in range(3):
            yield pb.UploadChunk(data=b"\0" * (512 * 1024))

    err = refused(lambda: d.call("Upload", chunks()))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "larger than the limit of 1 MB (WHISPERQ_MAX_UPLOAD_MB)" in err.details()
    err = refused(lambda: d.call("Upload", iter([pb.UploadChunk(data=b"RIFF")])))
    assert err.code() is grpc.StatusCode.INVALID_ARGUMENT and "first chunk must carry `head`" in err.details()


def test_a_full_queue_is_resource_exhausted_with_retry_info(door):
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    d = door(queue_budget_seconds=0.0)  # any backlog at all is past it
    err = refused(lambda: d.call("Submit", clip_request(d.pb)))
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "the queue is full" in err.details() and "try again in" in err.details()
    trailing = dict(err.trailing_metadata())
    assert trailing["whisperq-error-code"] == "queue_full" and 1 <= int(trailing["retry-after"]) <= 3600
    status = rpc_status.from_call(err)
    retry = [detail for detail in status.details if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR)]
    assert len(retry) == 1
    info = error_details_pb2.RetryInfo()
    retry[0].Unpack(info)
    assert info.retry_delay.seconds == int(trailing["retry-after"])


@pytest.mark.integration
def test_keys_required_unauthenticated_without_a_good_one_and_not_found_for_anothers_job(door, celery_app, worker):
    from models.access.apikeys import create_key

    d = door(allow_anonymous=False)
    pb = d.pb
    for key in (None, "wq_" + "0" * 40, "not-a-key"):
        err = refused(lambda key=key: d.call("GetJob", pb.GetJobRequest(id="x"), key=key))
        assert err.code() is grpc.StatusCode.UNAUTHENTICATED, key
    err = refused(lambda: d.stub.GetJob(pb.GetJobRequest(id="x"), metadata=[("authorization", "Basic abc")]))
    assert err.code() is grpc.StatusCode.UNAUTHENTICATED and "Bearer" in err.details()
    _, mine = create_key(d.rt, f"grpc-a-{uuid.uuid4().hex[:6]}", "standard")
    _, theirs = create_key(d.rt, f"grpc-b-{uuid.uuid4().hex[:6]}", "standard")
    # paused: the job must still be waiting when its owner cancels it
    with worker.paused(celery_app):
        job = d.call("Submit", clip_request(pb, priority="low"), key=mine)
        assert status_name(pb, job) == "PENDING" and job.id
        assert d.call("GetJob", pb.GetJobRequest(id=job.id), key=mine).id == job.id
        unknown = refused(lambda: d.call("GetJob", pb.GetJobRequest(id="no-such-job"), key=theirs))
        other = refused(lambda: d.call("GetJob", pb.GetJobRequest(id=job.id), key=theirs))
        assert unknown.code() is other.code() is grpc.StatusCode.NOT_FOUND
        assert other.details() == f"no job with id {job.id!r}"
        assert (
            refused(lambda: d.call("Cancel", pb.CancelRequest(id=job.id), key=theirs)).code()
            is grpc.StatusCode.NOT_FOUND
        )
        assert refused(lambda: watch(d, job.id, key=theirs)).code() is grpc.StatusCode.NOT_FOUND
        assert status_name(pb, d.call("Cancel", pb.CancelRequest(id=job.id), key=mine)) == "CANCELLED"


# --- jobs through the door ----------------------------------------------------------------------


@pytest.mark.integration
def test_cancel_a_waiting_job_and_its_watch_ends_cancelled(door, celery_app, worker):
    d = door()
    pb = d.pb
    with worker.paused(celery_app):
        job = d.call("Submit", clip_request(pb, "report.opus", priority="low"))
        assert status_name(pb, job) == "PENDING"
        seen: list = []
        follower = threading.Thread(target=lambda: seen.extend(watch(d, job.id, timeout=60)))
        follower.start()
        cancelled = d.call("Cancel", pb.CancelRequest(id=job.id))
        assert status_name(pb, cancelled) == "CANCELLED"
        follower.join(60)
    assert not follower.is_alive()
    assert status_name(pb, seen[-1]) == "CANCELLED"
    assert status_name(pb, d.call("GetJob", pb.GetJobRequest(id=job.id))) == "CANCELLED"


@pytest.mark.integration
def test_submit_then_watch_to_completed_with_the_words_and_the_same_job_as_http(door, worker):
    from google.protobuf import json_format

    d = door()
    pb = d.pb
    clip = CLIPS["fox.flac"]
    key = f"grpc-{uuid.uuid4().hex}"
    job = d.call("Submit", clip_request(pb, word_timestamps=True, idempotency_key=key))
    assert status_name(pb, job) == "PENDING" and job.filename == "fox.flac" and job.word_timestamps
    seen = watch(d, job.id)
    statuses = [status_name(pb, j) for j in seen]
    assert statuses[-1] == "COMPLETED", [(s, j.error) for s, j in zip(statuses, seen, strict=True)]
    assert not any(s in FINAL for s in statuses[:-1])  # one final state, the last
    assert len(seen) >= 2 and all(a != b for a, b in itertools.pairwise(seen))  # a message per change
    done = seen[-1]
    assert done.progress == 1.0 and not done.HasField("queue_position")
    assert word_error_rate(clip["text"], done.result.text) <= 0.2, done.result.text
    words = [w for s in done.result.segments for w in s.words]
    assert words and all(0 <= w.start <= w.end for w in words)
    assert word_error_rate(clip["text"], " ".join(w.word for w in words)) <= 0.2
    # The same job as GET /v1/jobs/<id> shows it, under the same names.
    body = d.app.test_client().get(f"/v1/jobs/{job.id}").get_json()
    mine = json_format.MessageToDict(done, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    assert mine["id"] == body["job_id"]
    for name in (
        "status",
        "task",
        "language",
        "priority",
        "model",
        "filename",
        "attempts",
        "progress",
        "word_timestamps",
        "audio_duration",
    ):
        assert mine.get(name) == body[name], name
    for name in ("created_at", "started_at", "finished_at"):
        assert datetime.datetime.fromisoformat(mine[name].replace("Z", "+00:00")) == datetime.datetime.fromisoformat(
            body[name].replace("Z", "+00:00")
        ), name
    assert mine["result"]["text"] == body["result"]["text"]
    assert [(s["start"], s["end"], s["text"]) for s in mine["result"]["segments"]] == [
        (s["start"], s["end"], s["text"]) for s in body["result"]["segments"]
    ]
    assert mine["result"]["model"] == body["result"]["model"]
    assert d.call("GetJob", pb.GetJobRequest(id=job.id)) == done
    # The same idempotency key gives the same job back, nothing new made.
    again = d.call("Submit", clip_request(pb, word_timestamps=True, idempotency_key=key))
    assert again == done
    # A finished job's watch is the one message.
    assert [j.status for j in watch(d, job.id)] == [done.status]


def silent_wav(seconds: int, rate: int = 16000):
    """A 16-bit mono PCM WAV of `seconds` of silence, in 1 MiB pieces, never whole in memory."""
    size = seconds * rate * 2
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)  # PCM, mono, 16 bits
    yield b"RIFF" + struct.pack("<I", 36 + size) + b"WAVEfmt " + fmt + b"data" + struct.pack("<I", size)
    piece = b"\0" * (1024 * 1024)
    while size > 0:
        yield piece[:size]
        size -= len(piece)


@pytest.mark.integration
def test_a_50_mb_upload_streams_in_chunks(door, celery_app):
    from helpers import stored_files

    seconds = 28 * 60  # 53.8 MB (51.3 MiB) of 16 kHz 16-bit PCM
    d = door(max_upload_mb=64, max_audio_seconds=3600.0)
    pb = d.pb
    sent = {"bytes": 0, "chunks": 0}

    def chunks():
        for i, data in enumerate(silent_wav(seconds)):
            sent["bytes"] += len(data)
            sent["chunks"] += 1
            yield pb.UploadChunk(
                head=pb.SubmitRequest(filename="long.wav", priority="low") if i == 0 else None, data=data
            )

    job = d.call("Upload", chunks(), timeout=240)
    assert sent["bytes"] > 50 * 1024 * 1024 and sent["chunks"] > 50  # no message near the 4 MiB limit
    try:
        assert status_name(pb, job) in ("PENDING", "PROCESSING") and job.filename == "long.wav"
        assert job.audio_duration == pytest.approx(seconds, abs=0.5)
    finally:
        assert status_name(pb, d.call("Cancel", pb.CancelRequest(id=job.id))) in ("CANCELLED", "PROCESSING")
    assert not [p for p in stored_files(d.rt.settings) if "upload-" in p]  # the spool moved into the store


# --- held, as an attacker would hold it: a real `whisperq grpc` ------------------------------------


@pytest.fixture()
def grpc_process(settings, database, tmp_path):
    """`whisperq grpc` as its own process on the suite's database, on a free port, idle uploads
    ended after 5 s: (target, its log)."""
    import os
    import subprocess
    import sys

    from helpers import free_port

    port = free_port()
    env = dict(os.environ, WHISPERQ_GRPC_PORT=str(port), WHISPERQ_GRPC_IDLE_SECONDS="5", WHISPERQ_LOG_FORMAT="text")
    log = tmp_path / "grpc.log"
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("whisperq")), "grpc"],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: "gRPC server listening" in log.read_text() or proc.poll() is not None, 60, "the server")
        assert proc.poll() is None, log.read_text()
        yield f"127.0.0.1:{port}", log
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.timeout(180)
def test_sixty_four_idle_streams_leave_health_and_uploads_answering_within_a_second(
    grpc_process, client_stubs, settings
):
    """64 Upload streams that send their head and then nothing, from one client and from 16
    keys: a client holds 4 at most, the server 16 (half its 32 threads); the rest are refused at
    once (RESOURCE_EXHAUSTED, come back in a second). Meanwhile Check and a whole upload answer
    within a second; the idle streams are ended after WHISPERQ_GRPC_IDLE_SECONDS."""
    import time

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from models.access.apikeys import create_key
    from models.runtime import Runtime

    target, _log = grpc_process
    pb, rpc = client_stubs
    rt = Runtime(settings)
    tokens = [create_key(rt, f"holder-{n}", "premium")[1] for n in range(16)]
    release = threading.Event()

    def idle():
        yield pb.UploadChunk(head=pb.SubmitRequest(filename="hold.flac"), data=b"fLaC")
        release.wait(60)  # then nothing more

    def hold(token: str | None):
        channel = grpc.insecure_channel(target)
        metadata = [("authorization", f"Bearer {token}")] if token else None
        return channel, rpc.TranscriptionStub(channel).Upload.future(idle(), metadata=metadata, timeout=60)

    def outcome(future) -> grpc.StatusCode | None:
        try:
            future.result(timeout=0.2)
        except grpc.FutureTimeoutError:
            return None  # still held
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    one_client = [hold(None) for _ in range(64)]
    wait_until(lambda: sum(outcome(f) is not None for _, f in one_client) >= 60, 30, "the refusals")
    codes = [outcome(f) for _, f in one_client]
    assert codes.count(None) == 4 and codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 60, codes
    keyed = [hold(tokens[n % 16]) for n in range(64)]
    wait_until(lambda: sum(outcome(f) is not None for _, f in keyed) >= 52, 30, "the server-wide refusals")
    held = sum(outcome(f) is None for _, f in one_client + keyed)
    assert held == 16, held  # the server's streams, all taken

    channel = grpc.insecure_channel(target)
    started = time.monotonic()
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    checked = time.monotonic() - started
    started = time.monotonic()
    job = rpc.TranscriptionStub(channel).Submit(clip_request(pb, language="en"), timeout=5)
    submitted = time.monotonic() - started
    assert health.status == health_pb2.HealthCheckResponse.SERVING and job.id
    assert checked < 1.0 and submitted < 1.0, (checked, submitted)

    # The idle ones are ended once they sent nothing for 5 s: the threads come back.
    wait_until(lambda: all(outcome(f) is not None for _, f in one_client + keyed), 30, "the idle streams ended")
    assert {outcome(f) for _, f in one_client + keyed} <= {
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    }
    release.set()
    for ch, _ in one_client + keyed:
        ch.close()
    channel.close()


def test_reads_are_rated_per_client(door):
    d = door(door={"read_rate": "5/second"})
    codes = []
    for _ in range(12):
        try:
            d.call("GetJob", d.pb.GetJobRequest(id=str(uuid.uuid4())))
        except grpc.RpcError as exc:
            codes.append(exc.code())
    assert codes.count(grpc.StatusCode.NOT_FOUND) == 5, codes
    assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 7, codes
