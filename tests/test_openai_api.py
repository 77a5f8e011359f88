"""The OpenAI-compatible endpoint, driven by the official `openai` client against a real
HTTP server, real workers and real audio."""

import pytest
from helpers import CLIPS, LiveServer, word_error_rate

pytestmark = pytest.mark.integration


@pytest.fixture()
def openai_client(live_server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=f"{live_server}/v1", api_key="any-key", max_retries=0, timeout=120)


def transcribe(client, name: str = "report.opus", **options):
    with CLIPS[name]["path"].open("rb") as fh:
        return client.audio.transcriptions.create(model="whisper-1", file=(name, fh), **options)


def test_each_response_format(openai_client, worker):
    clip = CLIPS["report.opus"]
    as_json = transcribe(openai_client)
    assert word_error_rate(clip["text"], as_json.text) <= 0.2

    text = transcribe(openai_client, response_format="text")
    assert isinstance(text, str) and word_error_rate(clip["text"], text) <= 0.2

    srt = transcribe(openai_client, response_format="srt")
    assert srt.lstrip().startswith("1\n") and " --> " in srt and "," in srt.split(" --> ")[0]

    vtt = transcribe(openai_client, response_format="vtt")
    assert vtt.startswith("WEBVTT") and " --> " in vtt

    verbose = transcribe(openai_client, response_format="verbose_json", timestamp_granularities=["word", "segment"])
    assert verbose.duration == pytest.approx(9.4, abs=0.2) and verbose.language == "en"
    assert verbose.segments and 0.0 <= verbose.segments[0].start < 0.5  # where the first word starts
    assert len(verbose.words) >= 10 and all(w.start <= w.end for w in verbose.words)
    assert word_error_rate(clip["text"], " ".join(w.word for w in verbose.words)) <= 0.2
    # how sure the model was, segment by segment, as OpenAI's verbose_json says it
    for segment in verbose.segments:
        assert segment.avg_logprob < 0 and 0 <= segment.no_speech_prob <= 1 and segment.compression_ratio > 0
        assert segment.temperature == 0.0


def test_a_prompt_and_temperature_are_accepted(openai_client, worker):
    result = transcribe(openai_client, "fox.flac", prompt="A sentence about a fox.", temperature=0.0, language="en")
    assert word_error_rate(CLIPS["fox.flac"]["text"], result.text) <= 0.2


def test_an_invalid_file_raises_bad_request(openai_client):
    import openai

    with pytest.raises(openai.BadRequestError) as raised:
        openai_client.audio.transcriptions.create(model="whisper-1", file=("notes.wav", b"this is not audio"))
    assert raised.value.status_code == 400
    error = raised.value.body
    assert error["type"] == "invalid_request_error" and "decoded" in error["message"] and error["param"] == "file"
    with pytest.raises(openai.BadRequestError, match="does not exist"):
        openai_client.audio.transcriptions.create(
            model="no-such-model", file=("a.flac", CLIPS["fox.flac"]["path"].read_bytes())
        )
    with pytest.raises(openai.BadRequestError, match="response_format"):
        transcribe(openai_client, response_format="docx")


def test_models_lists_the_served_models(openai_client):
    """OpenAI's name first (the default model), then the suite's registry (conftest)."""
    assert [m.id for m in openai_client.models.list()] == ["whisper-1", "tiny.en", "base", "next"]


def test_past_the_wait_it_answers_202_with_the_job(client, settings, database, worker, celery_app):
    import dataclasses

    import requests

    from web import create_app

    app = create_app({"SETTINGS": dataclasses.replace(settings, sync_wait_seconds=0.0), "TESTING": True})
    with LiveServer(app) as server, worker.paused(celery_app):
        resp = requests.post(
            f"{server.url}/v1/audio/transcriptions",
            files={"file": ("fox.flac", CLIPS["fox.flac"]["path"].read_bytes())},
            data={"model": "whisper-1"},
            timeout=30,
        )
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert resp.headers["Location"] == body["status_url"] and body["id"] in body["status_url"]
    job = client.get(f"/v1/jobs/{body['id']}")
    assert job.status_code == 200 and job.get_json()["priority"] == "high"
