"""The one door, tried as an attacker would, on the ways in whose rules used to drift: raw
broker messages, MQTT paths, idempotency keys, headers that lie and files swapped for links.
Each test here failed on the code before models.pipeline.door (the note of the change that
added it has the table)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import uuid
from pathlib import Path

import numpy as np
import pytest
from api import bearer, upload, wait_for_job
from helpers import CLIPS, wait_for_line, wait_until

FOX = CLIPS["fox.flac"]["path"]


def lying_matroska(path: Path, seconds: float, claimed: float) -> Path:
    """`seconds` of speech (the fox clip, repeated) in Matroska, whose header claims `claimed`."""
    import av

    from models.speech import audio

    clip = (audio.decode(FOX) * 32767).astype(np.int16)
    pcm = np.tile(clip, int(np.ceil(seconds * audio.SAMPLE_RATE / clip.size)))[: int(seconds * audio.SAMPLE_RATE)]
    with av.open(str(path), "w", format="matroska") as out:
        stream = out.add_stream("flac", rate=audio.SAMPLE_RATE, layout="mono")
        for start in range(0, pcm.size, 4096):
            frame = av.AudioFrame.from_ndarray(pcm[start : start + 4096].reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate = audio.SAMPLE_RATE
            frame.pts = start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    data = bytearray(path.read_bytes())
    at = data.find(b"\x44\x89\x88")  # Segment Info's Duration, a float64 in milliseconds
    assert at > 0, "no Duration element written"
    data[at + 3 : at + 11] = struct.pack(">d", claimed * 1000.0)
    path.write_bytes(bytes(data))
    assert audio.probe(path).duration == pytest.approx(claimed, abs=0.5)
    return path


@pytest.fixture()
def door_rt(settings, private_db, tmp_path):
    """A runtime on a database of its own, whose jobs are recorded and never published."""
    from models.runtime import Runtime

    rt = Runtime(dataclasses.replace(settings, database_url=private_db, data_dir=tmp_path / "data"))
    rt.db.upgrade()
    rt.broker = Held()
    yield rt
    rt.db.dispose()


class Held:
    """The broker seam, holding every message back."""

    def __init__(self):
        self.jobs: list[str] = []

    def publish_job(self, job, countdown=None, reply_to=None) -> None:
        self.jobs.append(job.id)

    def publish_notify(self, delivery_ids) -> None:
        pass

    def forget_result(self, job_id) -> None:
        pass


# -- raw broker messages --------------------------------------------------------------------


@pytest.mark.integration
def test_a_raw_message_naming_a_finished_job_changes_nothing_and_returns_nothing(client, worker, settings, celery_app):
    from test_producers import message, send

    resp = upload(client)
    done = wait_for_job(client, resp.get_json()["job_id"])
    assert done["status"] == "COMPLETED"
    send(settings, message(done["job_id"], str(FOX), language="en"))
    wait_for_line(worker, f"a whisperq.transcribe message (id {done['job_id']}) was dropped unread: it names a job")
    answer = celery_app.AsyncResult(done["job_id"])  # the broker's result backend holds no transcript
    assert answer.state != "SUCCESS" and "text" not in (answer.result if isinstance(answer.result, dict) else {})
    again = client.get(f"/v1/jobs/{done['job_id']}").get_json()
    assert (again["status"], again["attempts"], again["finished_at"]) == (
        "COMPLETED",
        done["attempts"],
        done["finished_at"],
    )


@pytest.mark.integration
def test_a_raw_message_names_its_owner_only_with_the_key_itself(client, worker, settings):
    """A bare key id (what `whisperq keys list` shows) claims no one; a revoked key is refused;
    the key itself works, held to its tier's priority cap."""
    from test_producers import message, send

    from models.access.apikeys import create_key, revoke_key
    from models.runtime import Runtime

    rt = Runtime(settings)
    victim, victim_key = create_key(rt, "victim-" + uuid.uuid4().hex[:6], "premium")
    batch, batch_key = create_key(rt, "batch-" + uuid.uuid4().hex[:6], "batch")
    gone, gone_key = create_key(rt, "gone-" + uuid.uuid4().hex[:6], "premium")
    revoke_key(rt, gone.id)

    def raw(**options):
        job_id = str(uuid.uuid4())
        send(settings, message(job_id, str(FOX), language="en", **options))
        return finished_row(rt, job_id)

    by_id = raw(owner=victim.id)
    assert by_id.status == "FAILED" and "never with a bare key id" in by_id.error and by_id.owner is None, by_id.error
    revoked = raw(api_key=gone_key)
    assert revoked.status == "FAILED" and "revoked" in revoked.error and revoked.owner is None, revoked.error
    too_high = raw(api_key=batch_key, priority="high")
    assert too_high.status == "FAILED" and "tier (batch)" in too_high.error and too_high.owner == batch.id
    mine = raw(api_key=victim_key)
    assert mine.status == "COMPLETED" and mine.owner == victim.id and "fox" in mine.result_text.lower()
    rt.db.dispose()


def finished_row(rt, job_id: str, timeout: float = 120.0):
    """The job's row once it has finished (the preparation pool makes it from the message)."""
    from models.errors import JobNotFound
    from models.jobs.operations import get_job

    def finished():
        try:
            job = get_job(rt, job_id)
        except JobNotFound:
            return None
        return job if job.state.finished else None

    return wait_until(finished, timeout, f"job {job_id} did not finish")


def test_a_header_that_lies_gains_nothing_at_preparation(door_rt, tmp_path):
    """A Matroska file claiming 10 s with 60 s in it passes a 30 s tier's door by its header;
    preparation decodes it with the tier's own limit and fails it."""
    from models.access.apikeys import authenticate, create_key
    from models.errors import PermanentJobError
    from models.jobs.operations import get_job
    from models.pipeline import intake
    from models.pipeline.door import Submission
    from models.pipeline.preparation import prepare_job
    from models.storage import SealedSpool

    rt = door_rt
    rt.settings = dataclasses.replace(rt.settings, max_audio_seconds_standard=30.0)
    _record, token = create_key(rt, "liar", "standard")
    who = authenticate(rt, token)
    fake = lying_matroska(tmp_path / "call.mkv", seconds=60.0, claimed=10.0)
    spool = SealedSpool(rt.storage.tmp_dir, keyring=rt.keyring)
    spool.write(fake.read_bytes())
    spool.finish()
    job, created = intake.submit(
        rt, Submission(who, "api", fields={"language": "en"}, upload=spool, filename="call.mkv")
    )
    assert created and job.audio_duration == pytest.approx(10.0, abs=0.5)  # the door believed the header
    with pytest.raises(PermanentJobError, match="longer than the limit of 30 s"):
        prepare_job(rt, job.id, job.audio_ref, {})
    assert get_job(rt, job.id).status == "FAILED"


# -- idempotency keys -----------------------------------------------------------------------


def test_an_idempotency_key_reaches_no_other_owners_job(settings, database, monkeypatch):
    """An anonymous caller sending an MQTT request's idempotency key, or another key's, gets a
    job of its own, never theirs."""
    from celery import Celery

    from models.access.apikeys import create_key
    from models.delivery.mqtt_replies import request_id
    from models.pipeline.door import anonymous
    from web import create_app
    from web.mqtt.requests import Request
    from web.mqtt.submit import submit

    monkeypatch.setattr(Celery, "send_task", lambda *a, **kw: None)  # recorded, never sent
    app = create_app({"SETTINGS": dataclasses.replace(settings, allow_anonymous=True), "TESTING": True})
    rt = app.extensions["whisperq"]
    body = {"audio_url": "http://127.0.0.1:9/call.mp3"}
    client = uuid.uuid4().hex[:8]
    theirs, _ = submit(app, Request(client, "c-1", None, "audio_url", dict(body)), anonymous(rt.settings))
    web = app.test_client()
    for sent in (request_id(client, "c-1"), "mqtt:" + request_id(client, "c-1")):
        resp = web.post("/v1/jobs", json=body, headers={"Idempotency-Key": sent})
        assert resp.status_code == 202 and resp.get_json()["job_id"] != theirs.id, resp.get_json()
    _alice, alice = create_key(rt, "alice-" + uuid.uuid4().hex[:6], "premium")
    _bob, bob = create_key(rt, "bob-" + uuid.uuid4().hex[:6], "premium")
    first = web.post("/v1/jobs", json=body, headers={"Idempotency-Key": "same", **bearer(alice)})
    other = web.post("/v1/jobs", json=body, headers={"Idempotency-Key": "same", **bearer(bob)})
    assert first.status_code == other.status_code == 202
    assert first.get_json()["job_id"] != other.get_json()["job_id"]


# -- paths that belong to someone -----------------------------------------------------------


def test_an_mqtt_path_in_another_keys_directory_is_refused_as_if_it_were_not_there(
    settings, database, tmp_path, monkeypatch
):
    from models.access.apikeys import create_key, principal_for_key_id
    from models.runtime import Runtime
    from tasks.broker import CeleryBroker
    from web import create_app
    from web.mqtt.requests import Refused, Request
    from web.mqtt.submit import submit

    monkeypatch.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: None)
    rt = Runtime(settings)
    team_a, _ = create_key(rt, "team-a-" + uuid.uuid4().hex[:6], "premium")
    team_b, _ = create_key(rt, "team-b-" + uuid.uuid4().hex[:6], "premium")
    inbox = tmp_path / "inbox"
    for team in ("a", "b"):
        (inbox / team).mkdir(parents=True)
        shutil.copy(FOX, inbox / team / "call.flac")
    grants = ((None, inbox), (team_a.id, inbox / "a"), (team_b.id[:8], inbox / "b"))
    app = create_app({"SETTINGS": dataclasses.replace(settings, input_grants=grants), "TESTING": True})
    a, b = principal_for_key_id(rt, team_a.id), principal_for_key_id(rt, team_b.id)

    def ask(who, path: Path):
        return submit(
            app,
            Request(
                "client-" + uuid.uuid4().hex[:6], uuid.uuid4().hex, None, "path", {"path": str(path), "language": "en"}
            ),
            who,
        )

    job, created = ask(a, inbox / "a" / "call.flac")
    assert created and job.owner == team_a.id
    assert ask(b, inbox / "b" / "call.flac")[0].owner == team_b.id
    refusals = []
    for path in (inbox / "b" / "call.flac", inbox / "b" / "no-such.flac", inbox / "b"):
        with pytest.raises(Refused) as refused:
            ask(a, path)
        refusals.append(str(refused.value).replace(str(path), "PATH"))
    assert "outside your input directories" in refusals[0]
    assert refusals[0] == refusals[1] == refusals[2]  # nothing tells which of team b's files exist
    rt.db.dispose()


def test_a_file_swapped_for_a_link_after_the_door_is_not_followed(door_rt, tmp_path):
    from models.errors import PermanentJobError
    from models.jobs.operations import get_job
    from models.pipeline import intake
    from models.pipeline.door import Submission, anonymous
    from models.pipeline.preparation import prepare_job

    rt = door_rt
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    secret = tmp_path / "secret.flac"  # outside every input directory
    shutil.copy(FOX, secret)
    shutil.copy(FOX, inbox / "call.flac")
    rt.settings = dataclasses.replace(rt.settings, input_grants=((None, inbox),))
    job, _ = intake.submit(
        rt, Submission(anonymous(rt.settings), "mqtt", fields={"language": "en"}, path=str(inbox / "call.flac"))
    )
    (inbox / "call.flac").unlink()
    os.symlink(secret, inbox / "call.flac")
    with pytest.raises(PermanentJobError, match="link"):
        prepare_job(rt, job.id, job.audio_ref, {})
    assert get_job(rt, job.id).status == "FAILED"


# -- what a message may not claim -----------------------------------------------------------


def test_an_owner_token_names_only_the_job_and_key_it_was_sealed_for(door_rt):
    from models.errors import InvalidRequest
    from models.pipeline import door

    token = door.owner_token("job-1", "key-a")
    assert door.owner_from_token("job-1", token) == "key-a"
    for job_id, given in (("job-2", token), ("job-1", "key-a"), ("job-1", None)):
        with pytest.raises(InvalidRequest, match="owner_token"):
            door.owner_from_token(job_id, given)


def test_an_inference_message_naming_samples_not_its_own_is_dropped(door_rt, monkeypatch):
    """Unsigned, an inference or shadow message is dropped unread; signed by this deployment (a
    message replayed, or a bug), one naming samples not its job's own is rejected all the same."""
    from celery.exceptions import Ignore, Reject

    from models.pipeline.messages import Prepared
    from models.security.signing import HEADER, sign
    from models.speech.windows import Window
    from tasks import transcription

    monkeypatch.setattr(transcription, "runtime", lambda: door_rt)
    theirs = Prepared(str(uuid.uuid4()), f"prepared/ab/{uuid.uuid4()}.npy", 1.0, (Window(((0, 16000),)),))
    message = theirs.to_message()
    for task in (transcription.infer, transcription.shadow):
        with pytest.raises(Ignore):
            task.run(message)
        task.push_request(args=[message], kwargs={}, headers={HEADER: sign(task.name, [message], {})})
        try:
            with pytest.raises(Reject, match="not its own"):
                task.run(message)
        finally:
            task.pop_request()


def test_every_way_in_builds_its_caller_with_the_one_rule(door_rt):
    """One anonymous principal, one priority cap, one WHISPERQ_ALLOW_ANONYMOUS rule at every way
    in: HTTP, gRPC, MQTT, transcribe.delay() and a raw message (whose anonymous jobs had no
    priority cap and were let in where anonymous use was off)."""
    from models.errors import Forbidden, Unauthorized
    from models.pipeline import door
    from models.pipeline.preparation import _message_principal
    from web.mqtt.requests import Refused, Request
    from web.mqtt.submit import principal_for
    from web.rpc.auth import principal as grpc_principal

    rt = door_rt
    mqtt = Request("sensor-1", str(uuid.uuid4()), "whisperq/replies/sensor-1", "path", {"path": "/a.flac"})
    ways = {
        "http": lambda: door.identify(rt, how="send it as 'Authorization: Bearer <key>'"),
        "grpc": lambda: grpc_principal(rt, []),
        "mqtt": lambda: principal_for(rt, {}, mqtt),
        "delay or raw": lambda: _message_principal(rt, str(uuid.uuid4()), {})[0],
    }
    rt.settings = dataclasses.replace(rt.settings, allow_anonymous=True, anonymous_max_priority="normal")
    for way, who in ways.items():
        caller = who()
        assert caller == door.anonymous(rt.settings) and caller.max_priority == "normal", way
        with pytest.raises(Forbidden, match="anonymous use may ask for priority normal or low, not high"):
            caller.check_priority("high")
    rt.settings = dataclasses.replace(rt.settings, allow_anonymous=False)
    for who in ways.values():
        with pytest.raises((Unauthorized, Refused), match="needs an API key"):
            who()
