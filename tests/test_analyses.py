"""Analyses after the transcript (models.analysis), through real workers on real audio: the
transcript stored by the inference pool, each analysis run by its own pool, merged, and the
job COMPLETED then; one that fails for good leaves the transcript delivered; a killed analysis
worker's analysis is run again and stored once."""

from __future__ import annotations

import os
import uuid

import numpy as np
import psutil
import pytest
from api import submit_id, upload, wait_for_job
from conftest import start_worker, stop_worker
from helpers import flite, wait_until

from models.speech import audio

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PII = (
    "Please call me at four one five, five five five, zero one three two. My card is four one one one, one one one one."
)
VOICES = {
    "slt": "Good morning everyone, thank you for joining the weekly planning meeting today.",
    "rms": "Thanks. I finished the database migration yesterday and the tests are passing now.",
    "awb": "Great work. Next we need to review the release schedule for the coming month.",
}


def _flite(tmp_path, voice: str, text: str) -> np.ndarray:
    return audio.decode(flite(tmp_path, voice, text))


def _wav(tmp_path, samples: np.ndarray) -> bytes:
    import wave

    path = tmp_path / f"{uuid.uuid4().hex[:6]}.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(audio.SAMPLE_RATE)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return path.read_bytes()


def _conversation(tmp_path) -> tuple[bytes, list[tuple[str, float, float]]]:
    """slt, rms, awb, then slt again, with half a second between turns; (voice, start, end) of each."""
    gap = np.zeros(audio.SAMPLE_RATE // 2, dtype=np.float32)
    parts, turns, at = [], [], 0.0
    for voice in ("slt", "rms", "awb", "slt"):
        clip = _flite(tmp_path, voice, VOICES[voice])
        turns.append((voice, at, at + len(clip) / audio.SAMPLE_RATE))
        parts += [clip, gap]
        at += (len(clip) + len(gap)) / audio.SAMPLE_RATE
    return _wav(tmp_path, np.concatenate(parts)), turns


@pytest.fixture()
def analysis_pool(celery_app, tmp_path):
    """Starts analysis workers as the Procfile's analysis line does; stops them after the test."""
    from config.celeryconfig import ANALYSIS_QUEUE

    started = []

    def start():
        worker = start_worker(celery_app, tmp_path, f"analysis-{uuid.uuid4().hex[:6]}", ANALYSIS_QUEUE)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        stop_worker(worker)


def _need_speakers() -> None:
    """The speakers analysis is an extra: skipped where it is not installed, but a failure in CI."""
    if os.environ.get("REQUIRE_SERVICES") != "1":
        pytest.importorskip("resemblyzer")


def _run(app_rt, job_id: str, name: str):
    from models.jobs.record import JobAnalysis

    with app_rt.db.session() as session:
        row = session.get(JobAnalysis, (job_id, name))
        session.expunge(row)
        return row


def test_redaction_runs_before_the_transcript_is_stored_and_needs_no_analysis_pool(client, worker, tmp_path, app_rt):
    """No analysis pool runs here: redaction is applied where the transcript is stored, before
    it is (the words it hides are kept nowhere), and the job completes with it."""
    data = _wav(tmp_path, _flite(tmp_path, "slt", PII))
    job_id = submit_id(client, data=data, filename="call.wav", redact="pii", word_timestamps="true")
    job = wait_for_job(client, job_id, timeout=300)
    assert job["status"] == "COMPLETED", job
    result = job["result"]
    assert result["analyses"]["redact"]["status"] == "DONE"
    assert result["redacted"]["count"] >= 1, result
    text = result["text"]
    assert "[" in text and not any(run in text.replace(" ", "") for run in ("4155550132", "5550132", "41111111"))
    for seg in result["segments"]:
        for word in seg.get("words") or []:
            assert not any(ch.isdigit() for ch in word["word"]) or word["word"].startswith("["), seg
    # how sure the model was, on every segment, and the transcript's
    assert 0 < result["confidence"] <= 1 and result["language_probability"] == 1.0
    assert all({"avg_logprob", "no_speech_prob", "compression_ratio"} <= set(s) for s in result["segments"])
    txt = client.get(f"/v1/jobs/{job_id}/transcript?format=txt").get_data(as_text=True)
    assert "4155550132" not in txt.replace(" ", "").replace("-", "")
    assert _run(app_rt, job_id, "redact").runs == 1


def test_speakers_split_a_conversation_by_voice(client, worker, analysis_pool, tmp_path, app_rt):
    _need_speakers()
    analysis_pool()
    data, turns = _conversation(tmp_path)
    job_id = submit_id(client, data=data, filename="meeting.wav", speakers="true")
    job = wait_for_job(client, job_id, timeout=400)
    assert job["status"] == "COMPLETED", job
    result = job["result"]
    assert result["analyses"]["speakers"]["status"] == "DONE", result["analyses"]
    assert len(result["speakers"]) == 3, result["turns"]
    for seg in result["segments"]:
        assert seg["speaker"] in result["speakers"]
        assert all(w["speaker"] == seg["speaker"] for w in seg["words"])
    # each voice's words carry its own label: slt's two turns one, rms and awb others
    labels: dict[str, list[str]] = {}
    for seg in result["segments"]:
        for word in seg["words"]:
            middle = (word["start"] + word["end"]) / 2
            voice = next((v for v, start, end in turns if start <= middle <= end), None)
            if voice is not None:
                labels.setdefault(voice, []).append(word["speaker"])
    majority = {voice: max(set(said), key=said.count) for voice, said in labels.items()}
    assert len(set(majority.values())) == 3, majority
    agree = sum(said.count(majority[voice]) for voice, said in labels.items())
    assert agree >= 0.9 * sum(map(len, labels.values())), labels
    vtt = client.get(f"/v1/jobs/{job_id}/transcript?format=vtt").get_data(as_text=True)
    assert "<v Speaker A>" in vtt and "<v Speaker B>" in vtt
    txt = client.get(f"/v1/jobs/{job_id}/transcript?format=txt").get_data(as_text=True)
    assert txt.startswith("Speaker A: ")
    assert _run(app_rt, job_id, "speakers").runs == 1


def test_an_analysis_that_fails_for_good_leaves_the_transcript_delivered(
    client, worker, analysis_pool, tmp_path, app_rt
):
    _need_speakers()
    from models.storage import prepared_ref

    data = _wav(tmp_path, _flite(tmp_path, "slt", VOICES["slt"]))
    job_id = submit_id(client, data=data, filename="one.wav", speakers="2")
    # no analysis worker yet: the job waits in stage analysis, its prepared audio kept for it
    waiting = wait_until(
        lambda: (j := client.get(f"/v1/jobs/{job_id}").get_json())["stage"] == "analysis" and j,
        300,
        "the transcript stored, the analysis waiting",
    )
    assert waiting["status"] == "PROCESSING" and waiting["result"] is None
    app_rt.storage.delete(prepared_ref(job_id))  # what the analysis listens to is gone
    analysis_pool()
    job = wait_for_job(client, job_id, timeout=300)
    assert job["status"] == "COMPLETED", job
    speakers = job["result"]["analyses"]["speakers"]
    assert speakers["status"] == "FAILED" and "prepared audio is gone" in speakers["error"]
    assert "good morning" in job["result"]["text"].lower()
    assert "speaker" not in job["result"]["segments"][0]


def test_a_killed_analysis_worker_runs_the_analysis_again_and_stores_it_once(
    client, worker, analysis_pool, tmp_path, app_rt
):
    _need_speakers()
    data, _turns = _conversation(tmp_path)
    job_id = submit_id(client, data=data, filename="meeting.wav", speakers="true")
    pool = analysis_pool()
    wait_until(lambda: _run(app_rt, job_id, "speakers").status == "RUNNING", 300, "the analysis running")
    children = psutil.Process(pool.proc.pid).children(recursive=True)
    assert children, "the prefork worker has a child process"
    for child in children:  # the process running the task dies, as the OOM killer would kill it
        child.kill()
    job = wait_for_job(client, job_id, timeout=400)
    assert job["status"] == "COMPLETED", job
    row = _run(app_rt, job_id, "speakers")
    assert row.status == "DONE" and row.runs == 1 and row.attempts >= 2, (row.status, row.runs, row.attempts)


def test_delay_and_mqtt_style_options_ask_for_analyses_too(client, worker, analysis_pool, app_rt):
    from helpers import CLIPS

    from tasks import transcribe

    analysis_pool()
    r = transcribe.delay(str(CLIPS["fox.flac"]["path"]), redact="email,phone", hotwords="fox")
    answered = r.get(timeout=300)  # once the analyses are done: the merged result, as the API gives it
    job = wait_for_job(client, r.id, timeout=30)
    assert job["status"] == "COMPLETED" and job["hotwords"] == "fox"
    assert job["result"]["analyses"]["redact"]["status"] == "DONE"
    assert job["result"]["redacted"]["count"] == 0 and "fox" in job["result"]["text"].lower()
    assert answered["analyses"]["redact"]["status"] == "DONE" and answered["redacted"] == job["result"]["redacted"]
    assert answered["text"] == job["result"]["text"]


def test_delay_with_an_analysis_cancelled_before_it_runs_raises_the_cancel(client, worker, analysis_pool):
    """No analysis pool: the job waits in stage analysis; the caller's r.get() waits too, and
    once the job is cancelled the analysis's message, when a pool takes it, tells r.get()."""
    import celery.exceptions
    from helpers import CLIPS

    from tasks import transcribe

    _need_speakers()  # an analysis of the pool's (redaction runs before the transcript is stored)
    r = transcribe.delay(str(CLIPS["fox.flac"]["path"]), speakers="true")
    wait_until(lambda: client.get(f"/v1/jobs/{r.id}").get_json().get("stage") == "analysis", 300, "stage analysis")
    with pytest.raises(celery.exceptions.TimeoutError):
        r.get(timeout=1)  # the transcript alone is not the answer
    cancelled = client.post(f"/v1/jobs/{r.id}/cancel")
    assert cancelled.status_code == 200 and cancelled.get_json()["status"] == "CANCELLED", cancelled.get_json()
    analysis_pool()
    with pytest.raises(Exception, match="cancelled by the client"):
        r.get(timeout=120)


def test_a_job_asking_for_an_analysis_is_refused_with_what_to_send(client):
    resp = upload(client, redact="passwords")
    assert resp.status_code == 400
    assert "redact" in resp.get_json()["error"]["message"]
    resp = upload(client, speakers="lots")
    assert resp.status_code == 400 and "speakers" in resp.get_json()["error"]["message"]
    resp = upload(client, hotwords="x" * 600)
    assert resp.status_code == 400 and "hotwords" in resp.get_json()["error"]["message"]


def test_low_confidence_jobs_are_listed_for_review(client, app_rt):
    from models.jobs.operations import create_job
    from models.jobs.record import JobOptions

    made = []
    for confidence in (0.3, 0.9):
        job = create_job(app_rt, None, JobOptions(), audio_url="https://example.com/a.wav")
        with app_rt.db.session() as session:
            from models.jobs.record import Job

            session.get(Job, job.id).confidence = confidence
        made.append(job.id)
    listed = {j["job_id"] for j in client.get("/v1/jobs?max_confidence=0.5&limit=200").get_json()["jobs"]}
    assert made[0] in listed and made[1] not in listed
    assert client.get("/v1/jobs?max_confidence=2").status_code == 400


def test_json_batches_and_the_json_api_take_analyses_as_json_values(client, app_rt, published):
    from models.jobs.operations import get_job

    _need_speakers()
    urls = ["http://127.0.0.1:9/a.mp3", "http://127.0.0.1:9/b.mp3"]
    made = client.post(
        "/v1/batches", json={"audio_urls": urls, "speakers": {"min": 2, "max": 4}, "redact": ["email", "phone"]}
    )
    assert made.status_code == 202, made.get_json()
    one = client.post(
        "/v1/jobs", json={"audio_url": urls[0], "speakers": 3, "hotwords": ["Siobhan", "Saoirse"], "redact": True}
    )
    assert one.status_code == 202, one.get_json()
    for job in made.get_json()["jobs"]:
        row = get_job(app_rt, job["job_id"])
        assert row.analyses == {
            "redact": {"kinds": ["EMAIL_ADDRESS", "PHONE_NUMBER"]},
            "speakers": {"min_speakers": 2, "max_speakers": 4},
        }, row.analyses
        assert row.word_timestamps  # speakers are told word by word
    row = get_job(app_rt, one.get_json()["job_id"])
    assert row.analyses["speakers"] == {"speakers": 3} and row.hotwords == "Siobhan, Saoirse"
    assert set(row.analyses) == {"speakers", "redact"}
    refused = client.post("/v1/batches", json={"audio_urls": urls, "speakers": "many"})
    assert refused.status_code == 400 and "speakers" in refused.get_json()["error"]["message"]


def test_an_analysis_not_installed_is_refused_saying_how_to_add_it(client, monkeypatch):
    from models.analysis import speakers

    monkeypatch.setattr(speakers, "missing", lambda: "install it with `pip install -e '.[speakers]'`")
    resp = upload(client, speakers="true")
    assert resp.status_code == 400
    assert "speakers is not installed on this deployment" in resp.get_json()["error"]["message"]
    assert "pip install" in resp.get_json()["error"]["message"]
    assert client.get("/readyz").get_json()["analyses"]["installed"] == ["redact"]


def test_the_openai_endpoint_answers_diarized_json(client, worker, analysis_pool, tmp_path):
    import io

    _need_speakers()
    analysis_pool()
    data, _turns = _conversation(tmp_path)
    resp = client.post(
        "/v1/audio/transcriptions",
        data={"model": "whisper-1", "response_format": "diarized_json", "file": (io.BytesIO(data), "meeting.wav")},
        content_type="multipart/form-data",
    )
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert body["task"] == "transcribe" and body["text"]
    assert {s["type"] for s in body["segments"]} == {"transcript.text.segment"}
    assert len({s["speaker"] for s in body["segments"]}) == 3, body["segments"]


def test_each_analysis_is_sent_with_time_limits_that_grow_with_its_audio(settings, published):
    """The analysis pool enforces Celery's limits like the others (prefork): each message
    carries its hard and soft limit, from the job's audio, or the longest audio allowed."""
    import dataclasses

    from tasks.app import celery_for
    from tasks.broker import publish_analyses

    app = celery_for(dataclasses.replace(settings, broker_url="memory://", result_backend="cache+memory://"))
    publish_analyses(app, "job-1", ["speakers", "redact"], "normal", 600.0)
    publish_analyses(app, "job-2", ["speakers"], "low", None)
    limits = [(h["id"], tuple(h["timelimit"])) for h, _ in published]
    hard = settings.analysis_time_limit(600.0)
    longest = settings.analysis_time_limit(None)
    assert limits == [
        ("job-1.speakers", (hard, hard * 0.8)),
        ("job-1.redact", (hard, hard * 0.8)),
        ("job-2.speakers", (longest, longest * 0.8)),
    ]
    assert hard == 900.0 and longest > hard
