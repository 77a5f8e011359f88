"""Priority, batching and failure isolation through real pools on the real broker."""

import itertools

import pytest
from api import submit_id, upload, wait_for_job
from helpers import (
    CLIPS,
    LONG_FORM,
    PIPELINE_MARGIN,
    long_form,
    long_recording,
    pipeline_wer,
    wait_until,
    word_error_rate,
    write_wav,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.brokers,
    pytest.mark.timeout(900),
]  # waits of up to 600 s for a backlog of jobs


def test_a_high_job_overtakes_a_backlog_of_low_ones(client, worker, celery_app):
    with worker.paused(celery_app):
        lows = [submit_id(client, "fox.flac", priority="low") for _ in range(40)]
        high = submit_id(client, "fox.flac", priority="high")
    jobs = {job_id: wait_for_job(client, job_id, timeout=600) for job_id in [*lows, high]}
    assert all(j["status"] == "COMPLETED" for j in jobs.values())
    high_done = jobs[high]["finished_at"]
    after = sum(1 for job_id in lows if jobs[job_id]["finished_at"] > high_done)
    assert after >= 30, f"only {after} of 40 low jobs finished after the high one"


def test_jobs_queued_together_are_batched_and_read_as_they_do_alone(client, worker, celery_app):
    from models.speech import audio
    from models.speech.engines import FasterWhisperEngine, bundled_model_path

    names = ["fox.flac", "report.opus"] * 4
    prepared = worker.prepared(celery_app)
    # Hold inference until all eight are prepared, so they wait in its queue together.
    with worker.paused(celery_app, pools=("inference",)):
        ids = [submit_id(client, name, language="en") for name in names]
        wait_until(lambda: worker.prepared(celery_app) >= prepared + len(ids), 120, "the jobs were not all prepared")
    jobs = [wait_for_job(client, job_id, timeout=300) for job_id in ids]
    assert all(j["status"] == "COMPLETED" for j in jobs), jobs
    sizes = worker.batch_sizes(ids)
    assert sizes and max(sizes) > 1, f"batch sizes seen: {sizes}"

    reference = FasterWhisperEngine(bundled_model_path(), device="cpu")
    alone = {
        name: reference.transcribe(audio.decode(CLIPS[name]["path"]), language="en", batch_size=1).to_dict()
        for name in set(names)
    }
    for name, job in zip(names, jobs, strict=True):
        assert job["result"]["text"] == alone[name]["text"]
        assert job["result"]["segments"] == alone[name]["segments"]


def test_a_burst_runs_full_batches(client, worker, celery_app):
    """Jobs waiting for inference fill every batch: the next batch forms while the running
    ones run (the pool holds a batch more than it runs at once), so after the first ones
    (which start as soon as a window waits) every batch but the last is full, and was
    waiting when a batcher thread became free."""
    wait_for_job(client, submit_id(client, "fox.flac"))  # the batcher exists once a job has run
    start = worker.batcher_stats(celery_app)
    full, parallel = start["max_batch"], start["parallel"]
    prepared = worker.prepared(celery_app)
    with worker.paused(celery_app, pools=("inference",)):
        ids = [submit_id(client, "fox.flac", language="en") for _ in range(6 * parallel * full)]
        wait_until(lambda: worker.prepared(celery_app) >= prepared + len(ids), 120, "the jobs were not all prepared")
    jobs = [wait_for_job(client, job_id, timeout=300) for job_id in ids]
    assert all(j["status"] == "COMPLETED" for j in jobs), jobs
    end = worker.batcher_stats(celery_app)
    ran = end["batches"] - start["batches"]
    sizes, ready = end["recent_sizes"][-ran:], end["recent_ready"][-ran:]
    assert worker.batch_sizes(ids) == sizes  # the batches since the start ran these jobs and no other
    middle = slice(parallel, -parallel)  # the first batches start as soon as windows wait; the last have what is left
    assert sum(sizes) == len(ids) and sizes[middle] and all(size == full for size in sizes[middle]), sizes
    # While batches ran the next filled (not for the last few: fewer jobs were left).
    assert all(ready[parallel : -(parallel + 1)]), list(zip(sizes, ready, strict=True))


def test_a_failing_job_fails_alone(client, worker, celery_app, tmp_path):
    from models.errors import PermanentJobError
    from tasks import transcribe
    from tasks.transcription import JobDeadLettered

    bad = tmp_path / "broken.flac"
    bad.write_bytes(b"fLaC" + bytes(500))
    with worker.paused(celery_app):
        good = [submit_id(client, "fox.flac") for _ in range(3)]
        failing = transcribe.delay(str(bad))
        missing = transcribe.delay(str(tmp_path / "gone.flac"))
        good += [submit_id(client, "report.opus") for _ in range(3)]
    jobs = [wait_for_job(client, job_id) for job_id in good]
    assert [j["status"] for j in jobs] == ["COMPLETED"] * 6
    # Audio that cannot be decoded fails at once; a missing file is retried until its attempts
    # are spent, then dead-lettered (the rejection is the task's failure).
    for r, error in ((failing, PermanentJobError), (missing, JobDeadLettered)):
        with pytest.raises(error):
            r.get(timeout=60)
        assert client.get(f"/v1/jobs/{r.id}").get_json()["status"] == "FAILED"


def test_long_audio_joins_batches_as_windows(client, worker, tmp_path):
    samples, text = long_recording()
    path = write_wav(tmp_path / "long.wav", samples)
    resp = upload(client, "long.wav", data=path.read_bytes())
    assert resp.status_code == 202, resp.get_json()
    job = wait_for_job(client, resp.get_json()["job_id"], timeout=300)
    assert job["status"] == "COMPLETED", job
    assert job["audio_duration"] == pytest.approx(len(samples) / 16000, abs=0.05)
    assert job["result"]["segments"][-1]["end"] > 30
    assert (
        word_error_rate(text, job["result"]["text"])
        <= pipeline_wer("long_recording(3)", samples, text) + PIPELINE_MARGIN
    )


def test_long_recordings_sharing_batches_keep_every_word(client, worker, celery_app, tmp_path):
    """Several long-form jobs at once, their windows in the same batches: each as good as
    faster-whisper's own batched pipeline on it, its cues inside the recording and in order."""
    uploads = {
        "harbour": ("harbour.opus", LONG_FORM["harbour"]["path"].read_bytes()),
        "pauses": ("pauses.opus", LONG_FORM["pauses"]["path"].read_bytes()),
        "long_recording(4)": ("long.wav", write_wav(tmp_path / "long.wav", long_recording(4)[0]).read_bytes()),
    }
    with worker.paused(celery_app):
        jobs = {}
        for name, (filename, data) in uploads.items():
            resp = upload(client, filename, data=data)
            assert resp.status_code == 202, resp.get_json()
            jobs[name] = resp.get_json()["job_id"]
    for name, job_id in jobs.items():
        job = wait_for_job(client, job_id, timeout=600)
        assert job["status"] == "COMPLETED", job
        samples, text = long_form(name)
        assert word_error_rate(text, job["result"]["text"]) <= pipeline_wer(name, samples, text) + PIPELINE_MARGIN, name
        segments = job["result"]["segments"]
        assert all(0 <= s["start"] <= s["end"] <= job["audio_duration"] for s in segments)
        assert all(a["end"] <= b["start"] + 1e-6 for a, b in itertools.pairwise(segments))
    assert max(worker.batch_sizes(jobs.values())) > 1
