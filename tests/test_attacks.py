"""The attacks on the messages the service passes to itself, each through the real pools
(the session's workers on its broker; on the default setup, SQLite with local storage):
a producer writes to the queues with a plain broker client, as an attacker with access to
the broker would, and the job it aims at is left as it was.

The gRPC door's abuse (64 idle streams) is in test_grpc, through `whisperq grpc`; a message
on SQS's prepare queue naming another task in test_sqs; what a sealed file bound to its
name refuses in test_storage."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from api import FINAL, submit, wait_for_job
from helpers import CLIPS, flite, make_job, wait_for_line, wait_until
from test_door import finished_row
from test_producers import envelope, send

pytestmark = pytest.mark.integration

FOX = CLIPS["fox.flac"]["path"]


def dropped(task: str, job_id: str) -> str:
    return f"a {task} message (id {job_id[:64]}) was dropped unread"


def infer_message(job_id: str, samples_ref: str, windows: list | None = None) -> dict:
    """A well-formed inference message (models.pipeline.messages), as the preparation pool
    writes one: what a forger who read the docs would send."""
    from test_messages import prepared

    from models.speech.windows import Window

    chosen = tuple(windows if windows is not None else [Window(((0, 64_000),))])
    return prepared(job_id=job_id, samples_ref=samples_ref, windows=chosen, prompt="attacker's words").to_message()


def untouched(rt, job_id: str) -> tuple:
    from models.jobs.operations import get_job

    job = get_job(rt, job_id)
    return job.status, job.stage, job.attempts, job.result_text, job.error


@pytest.fixture()
def victim(settings, database):
    """Another tenant's job, prepared and waiting for the inference pool: its row (never
    published, so nothing of the service moves it) and its samples in storage."""
    from models.runtime import Runtime

    rt = Runtime(settings)
    job = make_job(rt, None, filename="secret.flac", duration=4.0, language="en", priority="normal")
    samples_ref = rt.storage.save_samples(job.id, np.zeros(64_000, dtype=np.float32))
    yield rt, job.id, samples_ref
    rt.db.dispose()


def test_a_traversal_job_id_reaches_neither_the_database_nor_the_victims_samples(victim, worker, settings):
    """On SQLite (which does not enforce the id column's length) an id such as
    `ab/../../../prepared/0f/<victim>` made prepared_ref() resolve to the victim's samples, and a
    forged infer message for it transcribed them into the attacker's job."""
    from models.errors import JobNotFound
    from models.jobs.operations import get_job

    rt, victim_id, samples_ref = victim
    before = untouched(rt, victim_id)
    evil = f"ab/../../../prepared/{victim_id[:2]}/{victim_id}"
    send(settings, envelope("whisperq.transcribe", evil, [str(FOX)], {"language": "en"}))
    wait_for_line(worker, dropped("whisperq.transcribe", evil) + ": its job id is not one")
    with pytest.raises(JobNotFound):
        get_job(rt, evil)

    forged = infer_message(evil, samples_ref)
    send(settings, envelope("whisperq.infer", evil, [forged], {}), pool="inference")
    wait_for_line(worker, dropped("whisperq.infer", evil) + ": unsigned")
    assert untouched(rt, victim_id) == before
    assert rt.storage.exists(samples_ref)  # still the victim's, read by no one


def test_a_forged_or_unsigned_internal_message_is_dropped_before_it_reads_a_job(victim, worker, settings):
    """`{"job_id": V}` failed job V; a well-formed infer message transcribed it with the sender's
    windows and prompt; a made-up signature is no better than none."""
    rt, victim_id, samples_ref = victim
    before = untouched(rt, victim_id)
    bare = str(uuid.uuid4())
    send(settings, envelope("whisperq.infer", bare, [{"job_id": victim_id}], {}), pool="inference")
    wait_for_line(worker, dropped("whisperq.infer", bare) + ": unsigned")

    well_formed = str(uuid.uuid4())
    send(
        settings,
        envelope("whisperq.infer", well_formed, [infer_message(victim_id, samples_ref, [])], {}),
        pool="inference",
    )
    wait_for_line(worker, dropped("whisperq.infer", well_formed) + ": unsigned")

    made_up = str(uuid.uuid4())
    mac = {"whisperq_mac": "wqm1:test:" + "A" * 43 + "="}
    send(
        settings,
        envelope("whisperq.infer", made_up, [infer_message(victim_id, samples_ref)], {}, headers=mac),
        pool="inference",
    )
    wait_for_line(worker, dropped("whisperq.infer", made_up))
    assert untouched(rt, victim_id) == before


def test_a_task_sent_to_another_pools_queue_is_dropped(victim, worker, settings):
    """Each queue takes only its own tasks: an infer message on the prepare queue, a
    transcribe message on the inference queue."""
    rt, victim_id, samples_ref = victim
    before = untouched(rt, victim_id)
    on_prepare = str(uuid.uuid4())
    send(settings, envelope("whisperq.infer", on_prepare, [infer_message(victim_id, samples_ref)], {}))
    wait_for_line(
        worker, dropped("whisperq.infer", on_prepare) + ": a task of the inference pool taken by a worker of prepare"
    )
    on_inference = str(uuid.uuid4())
    send(settings, envelope("whisperq.transcribe", on_inference, [str(FOX)], {}), pool="inference")
    wait_for_line(worker, dropped("whisperq.transcribe", on_inference) + ": a task of the prepare pool")
    assert untouched(rt, victim_id) == before


def test_a_producers_message_naming_a_waiting_job_adds_no_attempt(victim, worker, settings):
    """Repeating a transcribe message for a pending job added an attempt each time, until it was
    dead-lettered."""
    rt, victim_id, _ = victim
    before = untouched(rt, victim_id)
    for _ in range(3):
        send(settings, envelope("whisperq.transcribe", victim_id, [str(FOX)], {"language": "en"}))
    wait_until(
        lambda: worker.output().count(dropped("whisperq.transcribe", victim_id) + ": it names a job that exists") >= 3,
        120,
        "the three messages were not all dropped",
    )
    assert untouched(rt, victim_id) == before


def test_a_producers_api_key_is_kept_nowhere_in_the_result_backend(worker, settings, celery_app):
    """A raw message names its owner with its API key; no state the result backend keeps
    (STARTED, FAILURE, the result) carries it."""
    from models.access.apikeys import create_key
    from models.runtime import Runtime

    rt = Runtime(settings)
    _, key = create_key(rt, "producer-" + uuid.uuid4().hex[:6], "premium")
    ok, bad = str(uuid.uuid4()), str(uuid.uuid4())
    send(settings, envelope("whisperq.transcribe", ok, [str(FOX)], {"language": "en", "api_key": key}))
    send(
        settings, envelope("whisperq.transcribe", bad, [str(FOX)], {"language": "en", "api_key": key, "temperature": 7})
    )
    assert finished_row(rt, ok).status == "COMPLETED"
    assert finished_row(rt, bad).status == "FAILED"
    backend = celery_app.backend
    if not hasattr(backend, "client"):
        pytest.fail(f"a result backend this test cannot read: {type(backend).__name__}")
    kept = [backend.client.get(name) for name in backend.client.keys("celery-task-meta-*")]
    assert kept, "the backend holds the tasks' states"
    assert not [v for v in kept if v and key.encode() in v]
    rt.db.dispose()


@pytest.mark.timeout(600)
def test_a_redacted_job_cancelled_mid_inference_keeps_only_redacted_words(client, worker, tmp_path, settings):
    """Only cancel_job redacted: a job cancelled while it was transcribed kept its partial
    transcript unredacted, and GET served it."""
    import soundfile as sf

    said = "Please call me back on 415 555 0132 before noon. The card number is 4111 1111 1111 1111. "
    spoken = flite(tmp_path, "slt", said * 12)  # about two minutes: several windows
    samples, rate = sf.read(spoken)
    job = submit(client, None, data=spoken.read_bytes(), filename="call.wav", redact="pii", language="en")
    wait_until(
        lambda: client.get(f"/v1/jobs/{job['job_id']}").get_json()["stage"] == "infer",
        300,
        "the job was not taken for inference",
        interval=0.05,
    )
    assert client.post(f"/v1/jobs/{job['job_id']}/cancel").status_code in (200, 202)
    done = wait_for_job(client, job["job_id"], timeout=300, statuses=FINAL)
    assert done["status"] == "CANCELLED" and done["result"]["partial"] is True, done
    assert done["result"]["segments"] and len(samples) / rate > 60
    assert done["result"]["redacted"]["count"] >= 1, done["result"]
    served = json.dumps(done) + client.get(f"/v1/jobs/{job['job_id']}/transcript?format=txt").get_data(as_text=True)
    from models.jobs.record import Job
    from models.runtime import Runtime

    rt = Runtime(settings)
    with rt.db.session() as session:
        row = session.get(Job, job["job_id"])
        stored = json.dumps([row.result_text, row.result_segments, row.result_extra])
    rt.db.dispose()
    for kept in (served, stored):
        assert "0132" not in kept and "1111" not in kept and "4111" not in kept, kept
