"""The prepare -> inference message (models.pipeline.messages): typed on both sides, versioned,
checked where the inference pool takes it."""

import json

import pytest
from helpers import signed

from models.errors import PermanentJobError, TransientJobError
from models.pipeline.messages import SCHEMA, MalformedMessage, Prepared
from models.speech.windows import Window

JOB = "0a0a0a0a-0000-4000-8000-00000000abcd"


def prepared(**changes) -> Prepared:
    fields = dict(
        job_id=JOB,
        samples_ref="prepared/0a/x.npy",
        duration=61.5,
        windows=(Window(((0, 480_000),)), Window(((480_000, 700_000), (720_000, 984_000)))),
        language="en",
        task="transcribe",
        priority="high",
        word_timestamps=True,
        prompt="Kubernetes",
        temperature=0.2,
    )
    fields.update(changes)
    return Prepared(**fields)


def test_a_message_survives_json_both_ways():
    sent = prepared()
    wire = json.loads(json.dumps(sent.to_message()))
    assert wire["schema"] == SCHEMA
    assert Prepared.from_message(wire) == sent


def test_a_message_from_before_versioning_is_read_as_version_one():
    """What the prepare pool sent before messages had a schema: in flight during an upgrade."""
    old = {
        "job_id": JOB,
        "prepared": "prepared/0a/x.npy",
        "duration": 12.0,
        "windows": [[0, 192000]],
        "language": None,
        "task": "transcribe",
        "priority": "normal",
        "word_timestamps": False,
        "prompt": None,
        "temperature": None,
    }
    message = Prepared.from_message(old)
    assert message.windows == (Window(((0, 192000),)),) and message.temperature == 0.0 and message.language is None


@pytest.mark.parametrize(
    "change, words",
    [
        ({"job_id": None}, "'job_id' is None"),
        ({"prepared": 7}, "'prepared' is 7, not str"),
        ({"duration": "long"}, "'duration' is 'long'"),
        ({"windows": [["a", "b"]]}, "windows are not lists of [start, end]"),
        ({"windows": "0-10"}, "'windows' is '0-10'"),
        ({"word_timestamps": "yes"}, "'word_timestamps' is 'yes', not bool"),
        ({"schema": "one"}, "schema 'one' is not a version number"),
    ],
)
def test_a_malformed_message_says_what_is_wrong(change, words):
    wire = dict(prepared().to_message(), **change)
    with pytest.raises(MalformedMessage) as caught:
        Prepared.from_message(wire)
    assert words in str(caught.value)
    assert isinstance(caught.value, PermanentJobError)  # the job fails with this message; no retry


def test_a_missing_field_is_named():
    wire = prepared().to_message()
    del wire["duration"]
    with pytest.raises(MalformedMessage, match="has no 'duration'"):
        Prepared.from_message(wire)
    with pytest.raises(MalformedMessage, match="is a list, not a JSON object"):
        Prepared.from_message([JOB])


def test_a_newer_schema_is_tried_again_not_misread():
    wire = dict(prepared().to_message(), schema=SCHEMA + 1)
    with pytest.raises(TransientJobError, match="upgrade the inference workers"):
        Prepared.from_message(wire)


def queued_job(**fields):
    """(the worker's runtime, a job of its database as the inference task finds one: taken
    from the queue, on its first attempt); `fields` set more of the row."""
    from models.jobs.record import Job, JobStatus, Stage, new_job_id
    from tasks.app import runtime

    rt = runtime()
    job_id = new_job_id()
    with rt.db.session() as session:
        session.add(
            Job(
                id=job_id,
                audio_ref="audio/none.flac",
                priority="normal",
                attempts=1,
                status=JobStatus.PROCESSING.value,
                stage=Stage.QUEUED.value,
                **fields,
            )
        )
    return rt, job_id


def test_the_inference_task_fails_a_job_whose_message_is_malformed(database):
    """Checked where it is consumed: the job fails with what is wrong, it is not retried;
    a message naming no job is dropped."""
    from models.jobs.operations import get_job
    from tasks import infer

    rt, job_id = queued_job()
    bad = dict(prepared(job_id=job_id).to_message(), windows="0-10")
    result = infer.apply(args=[bad], task_id=job_id, **signed("whisperq.infer", [bad]))  # as a worker runs it
    assert result.failed() and isinstance(result.result, MalformedMessage)
    job = get_job(rt, job_id)
    assert job.status == "FAILED" and "'windows' is '0-10'" in job.error and job.attempts == 1
    nameless = infer.apply(args=[{"windows": []}], **signed("whisperq.infer", [{"windows": []}]))
    assert nameless.state == "REJECTED" and "without a job_id was dropped" in str(nameless.result)


def test_a_message_for_a_model_this_deployment_does_not_serve_fails_its_job(database):
    """A message made under another WHISPERQ_MODELS (a rolling change of the registry): the job
    fails naming the models served, it is not retried."""
    from models.errors import PermanentJobError
    from models.jobs.operations import get_job
    from tasks import infer

    rt, job_id = queued_job(model="large-v9")
    message = prepared(job_id=job_id, model="large-v9").to_message()
    result = infer.apply(args=[message], task_id=job_id, **signed("whisperq.infer", [message]))
    assert result.failed() and isinstance(result.result, PermanentJobError)
    job = get_job(rt, job_id)
    assert job.status == "FAILED" and "model 'large-v9' is not served here; the models are: tiny.en, base" in job.error
