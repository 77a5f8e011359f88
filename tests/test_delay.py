"""`transcribe.delay()` takes every option the API takes, checked the same way before anything
is queued, and gives back the same result as the API's JSON."""

import json

import pytest
from api import bearer
from helpers import CLIPS, Receiver, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.brokers]

FOX = str(CLIPS["fox.flac"]["path"])


def _row(app, job_id: str):
    from models.jobs.operations import get_job

    return get_job(app.extensions["whisperq"], job_id)


def test_every_option_reaches_the_job_and_the_result_is_the_apis(app, client, worker):
    from tasks import transcribe

    r = transcribe.delay(
        FOX,
        language="en",
        priority="low",
        word_timestamps=True,
        prompt="The quick brown fox.",
        temperature=0.2,
        task="transcribe",
        model="tiny.en",
    )
    result = r.get(timeout=180)
    job = _row(app, r.id)
    assert (job.language, job.priority, job.prompt, job.temperature, job.word_timestamps, job.model) == (
        "en",
        "low",
        "The quick brown fox.",
        0.2,
        True,
        "tiny.en",
    )
    assert all(seg["words"] for seg in result["segments"]) and "fox" in result["text"].lower()
    assert result["model"]["name"] == "tiny.en" and result["model"]["temperature"] == 0.2
    assert client.get(f"/v1/jobs/{r.id}").get_json()["result"] == result
    assert client.get(f"/v1/jobs/{r.id}/transcript?format=json").get_json() == result


def test_a_callback_url_gets_the_signed_webhook(app, worker):
    from tasks import transcribe

    with Receiver({"/hook": (200, {}, b"ok")}) as receiver:
        r = transcribe.delay(FOX, language="en", callback_url=receiver.url("/hook"))
        r.get(timeout=180)
        wait_until(lambda: receiver.requests, 60, "no webhook came")
    method, _path, headers, body = receiver.requests[0]
    event = json.loads(body)
    assert method == "POST" and event["data"]["job_id"] == r.id and event["type"] == "job.completed", event
    assert headers["webhook-signature"].startswith("v1,")
    assert _row(app, r.id).callback_url == receiver.url("/hook")


def test_an_api_key_owns_the_job_and_its_tier_bounds_the_priority(app, client, worker, published):
    from models.access.apikeys import create_key
    from tasks import transcribe

    rt = app.extensions["whisperq"]
    record, key = create_key(rt, "delay-batch", "batch")
    _other, other = create_key(rt, "delay-other", "standard")
    with pytest.raises(PermissionError, match="tier \\(batch\\) may ask for priority low"):
        transcribe.delay(FOX, api_key=key, priority="high")
    with pytest.raises(PermissionError, match="unknown API key"):
        transcribe.delay(FOX, api_key="wq_not-a-key")
    assert published == []
    r = transcribe.delay(FOX, api_key=key, language="en")
    r.get(timeout=180)
    job = _row(app, r.id)
    assert job.owner == record.id and job.priority == "low"  # the tier's own when none is asked
    mine = client.get(f"/v1/jobs/{r.id}", headers=bearer(key))
    theirs = client.get(f"/v1/jobs/{r.id}", headers=bearer(other))
    assert mine.status_code == 200 and theirs.status_code == 404


@pytest.mark.parametrize(
    "options, error, words",
    [
        ({"temperature": 5}, ValueError, "temperature must be a number from 0 to 1"),
        ({"temperature": "hot"}, ValueError, "temperature must be a number from 0 to 1"),
        ({"prompt": "x" * 1001}, ValueError, "keep it to 1000"),
        ({"prompt": 42}, ValueError, "'prompt' must be a string"),
        ({"word_timestamps": "maybe"}, ValueError, "word_timestamps must be true or false"),
        ({"language": "klingon"}, ValueError, "not a Whisper language code"),
        ({"task": "translate"}, ValueError, "needs a multilingual model"),
        ({"model": "nope"}, ValueError, "nope"),
        ({"callback_url": "ftp://example.com/hook"}, ValueError, "callback_url"),
        ({"callback_url": "http://10.1.2.3/hook"}, ValueError, "callback_url"),
        ({"redact": "passwords"}, ValueError, "redact"),
        ({"speakers": "lots"}, ValueError, "speakers must be"),
        ({"hotwords": 5}, ValueError, "hotwords must be"),
        ({"speed": "fast"}, TypeError, "unknown option\\(s\\) speed"),
        ({"owner": "someone"}, TypeError, "api_key"),
    ],
)
def test_a_bad_option_is_refused_before_anything_is_queued(published, options, error, words):
    from tasks import transcribe

    with pytest.raises(error, match=words):
        transcribe.delay(FOX, **options)
    assert published == []


def test_a_key_whose_quota_has_no_room_is_refused_before_anything_is_queued(app, published, monkeypatch):
    import dataclasses

    from models.access.apikeys import create_key
    from models.runtime import Runtime
    from tasks import transcribe, transcription

    rt = app.extensions["whisperq"]
    _record, key = create_key(rt, "delay-quota", "batch")
    tight = Runtime(dataclasses.replace(rt.settings, quota_hours_batch=0.0001))  # 0.36 s a month
    monkeypatch.setattr(transcription, "runtime", lambda: tight)
    with pytest.raises(PermissionError, match="quota"):
        transcribe.delay(FOX, api_key=key)
    assert published == []


def test_racing_delay_calls_are_held_to_the_quota_once_decoded(settings, private_db):
    """Two delay() calls of one key that each fit when they were queued, but not together:
    the preparation pool measures each as it decodes it, the other counted, and the second
    FAILS saying so, billed nothing."""
    import dataclasses
    import uuid
    from pathlib import Path

    from models.access.apikeys import create_key
    from models.access.usage import month_figures
    from models.errors import PermanentJobError
    from models.jobs.operations import get_job
    from models.jobs.record import utcnow
    from models.pipeline.preparation import prepare_job
    from models.runtime import Runtime
    from models.speech import audio

    fox = audio.probe(FOX).duration
    rt = Runtime(
        dataclasses.replace(
            settings,
            database_url=private_db,
            quota_hours_batch=1.5 * fox / 3600,
            input_grants=((None, Path(FOX).parent),),
        )
    )
    rt.db.upgrade()
    record, token = create_key(rt, "delay-race", "batch")
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    prepared = prepare_job(rt, first, FOX, {"api_key": token, "language": "en"})
    assert prepared.duration == pytest.approx(fox, abs=0.05)
    with pytest.raises(PermanentJobError, match="monthly audio quota"):
        prepare_job(rt, second, FOX, {"api_key": token, "language": "en"})
    failed = get_job(rt, second)
    assert failed.status == "FAILED" and "monthly audio quota" in failed.error and failed.owner == record.id
    month = month_figures(rt, record.id, utcnow())
    assert month.in_flight_audio_seconds == pytest.approx(prepared.duration, abs=0.001) and month.audio_seconds == 0
    rt.db.dispose()
