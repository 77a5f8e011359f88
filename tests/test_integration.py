"""Real broker, real worker process, real model, real audio."""

import shutil

import pytest
from api import upload, wait_for_job
from helpers import CLIPS, wait_for_line, word_error_rate

pytestmark = [pytest.mark.integration, pytest.mark.brokers]


@pytest.mark.parametrize("name", ["fox.flac", "report.opus"])
def test_upload_comes_back_completed_with_the_right_words(client, worker, name):
    clip = CLIPS[name]
    resp = upload(client, name, language="en")
    assert resp.status_code == 202, resp.get_json()
    job = wait_for_job(client, resp.get_json()["job_id"])
    assert job["status"] == "COMPLETED", job
    assert job["attempts"] == 1 and job["error"] is None
    assert word_error_rate(clip["text"], job["result"]["text"]) <= 0.2, job["result"]["text"]
    segments = job["result"]["segments"]
    assert segments and all(0 <= s["start"] <= s["end"] <= job["audio_duration"] + 0.5 for s in segments)

    txt = client.get(f"/v1/jobs/{job['job_id']}/transcript?format=txt")
    assert txt.status_code == 200 and txt.mimetype == "text/plain"
    assert txt.get_data(as_text=True).strip() == job["result"]["text"]
    srt = client.get(f"/v1/jobs/{job['job_id']}/transcript?format=srt").get_data(as_text=True)
    assert srt.startswith("1\n00:00:0") and " --> " in srt
    vtt = client.get(f"/v1/jobs/{job['job_id']}/transcript?format=vtt").get_data(as_text=True)
    assert vtt.startswith("WEBVTT\n\n00:00:0")
    assert client.get(f"/v1/jobs/{job['job_id']}/transcript?format=json").get_json()["text"] == job["result"]["text"]


def test_transcribe_delay_returns_the_transcript_and_the_job_is_in_the_api(client, worker, settings, tmp_path):
    from tasks import transcribe

    path = tmp_path / "shared" / "report.opus"
    path.parent.mkdir()
    shutil.copy(CLIPS["report.opus"]["path"], path)
    r = transcribe.delay(str(path), language="en", priority="high")
    result = r.get(timeout=120)
    assert result["job_id"] == r.id
    assert word_error_rate(CLIPS["report.opus"]["text"], result["text"]) <= 0.2
    assert result["segments"] and result["duration"] == pytest.approx(9.385, abs=0.05)

    job = client.get(f"/v1/jobs/{r.id}").get_json()
    assert job["status"] == "COMPLETED" and job["priority"] == "high"
    assert job["result"] == result
    assert path.exists()  # the caller's file is read in place, never deleted


def test_delay_refuses_bad_arguments_before_publishing(published):
    from tasks import transcribe

    with pytest.raises(ValueError, match="absolute"):
        transcribe.delay("relative/clip.wav")
    with pytest.raises(ValueError, match="priority 'urgent'"):
        transcribe.delay("/tmp/x.wav", priority="urgent")
    with pytest.raises(TypeError, match="path"):
        transcribe.delay(None)
    assert published == []


def test_undecodable_audio_fails_the_job_with_a_reason(client, worker, tmp_path):
    from celery.exceptions import TimeoutError as CeleryTimeout

    from tasks import transcribe

    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF\x00\x00\x00\x00WAVEjunk" * 10)
    r = transcribe.delay(str(bad))
    with pytest.raises(Exception) as err:
        r.get(timeout=60)
    assert not isinstance(err.value, CeleryTimeout)
    assert "could not be decoded" in str(err.value)
    job = client.get(f"/v1/jobs/{r.id}").get_json()
    assert job["status"] == "FAILED" and "could not be decoded" in job["error"]
    assert client.get(f"/v1/jobs/{r.id}/transcript").status_code == 409


def test_a_long_silent_upload_fails_in_prepare_with_a_reason(client, worker, tmp_path):
    """The door decodes only the start of a file; silence past it is found in prepare."""
    import numpy as np
    from helpers import write_wav

    from models.speech.audio import DOOR_SECONDS

    quiet = write_wav(tmp_path / "quiet.wav", np.zeros(int(16000 * (DOOR_SECONDS + 3)), dtype=np.float32))
    resp = upload(client, "quiet.wav", data=quiet.read_bytes())
    assert resp.status_code == 202, resp.get_json()
    job = wait_for_job(client, resp.get_json()["job_id"])
    assert job["status"] == "FAILED" and "silent" in job["error"], job
    assert job["attempts"] == 1  # a permanent failure: not retried


def test_missing_file_fails_with_a_reason(client, worker, tmp_path):
    from tasks import transcribe

    r = transcribe.delay(str(tmp_path / "gone" / "clip.flac"))  # in an input directory, but not there
    with pytest.raises(Exception, match="does not exist"):
        r.get(timeout=60)
    assert client.get(f"/v1/jobs/{r.id}").get_json()["status"] == "FAILED"


def test_duplicate_delivery_of_a_completed_job_does_nothing(client, worker, celery_app):
    resp = upload(client)
    job = wait_for_job(client, resp.get_json()["job_id"])
    assert job["status"] == "COMPLETED"
    # The broker hands the same message out again (a redelivery after a lost ack): nothing runs,
    # and nothing is answered (the transcript stays in the job row, never in the result backend).
    again = celery_app.send_task(
        "whisperq.transcribe",
        args=[f"audio/{job['job_id'][:2]}/{job['job_id']}.flac"],
        kwargs={},
        task_id=job["job_id"],
    )
    wait_for_line(worker, f"job {job['job_id']} already COMPLETED; duplicate delivery ignored")
    assert again.state != "SUCCESS"
    after = client.get(f"/v1/jobs/{job['job_id']}").get_json()
    assert after["attempts"] == 1
    assert after["finished_at"] == job["finished_at"]
    assert after["result"] == job["result"]
