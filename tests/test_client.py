"""What a client sees, with real workers and real audio: webhooks to a local receiver,
progress and estimates, cancel, delete, listing, submission by URL, word timestamps."""

import itertools
import threading
import time
from datetime import datetime

import pytest
from api import FINAL, bearer, submit, upload, wait_for_job
from helpers import (
    CLIPS,
    PIPELINE_MARGIN,
    Receiver,
    long_recording,
    normalise,
    pipeline_wer,
    stored_files,
    wait_until,
    word_error_rate,
    write_wav,
)

pytestmark = pytest.mark.integration


def scripted(statuses: list[int]):
    """A receiver route answering with these statuses in turn, then 200."""
    lock, left = threading.Lock(), list(statuses)

    def route(handler, _receiver):
        with lock:
            status = left.pop(0) if left else 200
        handler.send_response(status)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return route


def deliveries(client, job_id: str) -> list[dict]:
    return client.get(f"/v1/jobs/{job_id}").get_json().get("webhook_deliveries", [])


# --- webhooks ---------------------------------------------------------------------------


def test_a_webhook_retried_after_two_500s_is_delivered_once_signed(client, worker, settings):
    from models.delivery import webhooks

    with Receiver({"/hook": scripted([500, 500])}) as receiver:
        job = submit(client, callback_url=receiver.url("/hook"))
        assert wait_for_job(client, job["job_id"], statuses=FINAL)["status"] == "COMPLETED"
        [delivery] = wait_until(
            lambda: [d for d in deliveries(client, job["job_id"]) if d["status"] != "pending"],
            60,
            "the webhook was not delivered",
        )
    assert delivery["status"] == "delivered" and delivery["event"] == "job.completed"
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 200]
    assert all(a["at"] for a in delivery["attempts"])
    assert len(receiver.requests) == 3
    _method, _path, headers, body = receiver.requests[-1]
    webhooks.verify(settings.webhook_signing_secret(), headers, body)  # raises if the signature is wrong
    assert headers["webhook-id"] == delivery["id"]
    import json

    event = json.loads(body)
    assert event["type"] == "job.completed" and event["data"]["job_id"] == job["job_id"]
    assert word_error_rate(CLIPS["fox.flac"]["text"], event["data"]["result"]["text"]) <= 0.2
    assert event["data"]["transcript_url"].endswith(f"/v1/jobs/{job['job_id']}/transcript?format=json")
    with pytest.raises(ValueError):
        webhooks.verify(settings.webhook_signing_secret(), headers, body.replace(b"job.completed", b"job.failed"))


def test_each_keys_webhooks_are_signed_with_its_own_secret(worker, settings, database, celery_app):
    """Two tenants, one receiver each: a job's webhook verifies with its key's secret and with
    no other (not the other key's, not the deployment's), and names its owner. After a
    rotation the old and the new secret both verify, until the overlap ends."""
    import dataclasses
    import json

    from models.access.apikeys import create_key
    from models.delivery import webhooks
    from web import create_app

    app = create_app({"SETTINGS": dataclasses.replace(settings, allow_anonymous=False), "TESTING": True})
    client, rt = app.test_client(), app.extensions["whisperq"]
    made = {name: create_key(rt, f"{name}-hooks", "standard") for name in ("alice", "bob")}
    secrets = {name: record.webhook_secret for name, (record, _token) in made.items()}

    def run_job(name: str) -> tuple[dict, bytes]:
        record, token = made[name]
        with Receiver({"/hook": (200, {}, b"")}) as receiver:
            resp = upload(client, filename="a.flac", token=token, callback_url=receiver.url("/hook"))
            assert resp.status_code == 202, resp.get_json()
            wait_until(lambda: receiver.requests, 120, f"{name}'s webhook did not come")
        _method, _path, headers, body = receiver.requests[0]
        assert json.loads(body)["data"]["owner"] == record.id
        return headers, body

    for name, other in (("alice", "bob"), ("bob", "alice")):
        headers, body = run_job(name)
        webhooks.verify(secrets[name], headers, body)
        for wrong in (secrets[other], settings.webhook_signing_secret()):
            with pytest.raises(ValueError, match="no webhook-signature matches"):
                webhooks.verify(wrong, headers, body)

    rotated = client.post("/v1/webhook-secret", headers=bearer(made["alice"][1])).get_json()
    headers, body = run_job("alice")
    assert len(headers["webhook-signature"].split()) == 2
    for good in (rotated["webhook_secret"], secrets["alice"]):  # a receiver on either verifies
        webhooks.verify(good, headers, body)
    with pytest.raises(ValueError):
        webhooks.verify(secrets["bob"], headers, body)


def test_a_long_poll_answers_when_the_job_changes(client, worker):
    """GET ?wait=30 with the ETag last seen: each answer is a change (a new ETag), and the
    client learns of COMPLETED in a handful of requests instead of polling every second."""
    job = submit(client, "report.opus")
    seen, tag, requests_made = [], None, 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        resp = client.get(f"/v1/jobs/{job['job_id']}?wait=30", headers={"If-None-Match": tag} if tag else {})
        requests_made += 1
        if resp.status_code == 304:
            continue
        assert resp.status_code == 200 and resp.headers["ETag"] != tag
        tag, body = resp.headers["ETag"], resp.get_json()
        seen.append((body["status"], body["stage"], body["progress"]))
        if body["status"] == "COMPLETED":
            break
    assert seen[-1][0] == "COMPLETED", seen
    assert requests_made == len(seen) <= 12, seen  # one answer per change, none empty-handed
    assert client.get(f"/v1/jobs/{job['job_id']}?wait=61").status_code == 400


def test_a_410_stops_the_retries(client, worker):
    with Receiver({"/gone": (410, {}, b"gone")}) as receiver:
        job = submit(client, callback_url=receiver.url("/gone"))
        wait_for_job(client, job["job_id"], statuses=FINAL)
        [delivery] = wait_until(
            lambda: [d for d in deliveries(client, job["job_id"]) if d["status"] != "pending"],
            60,
            "the webhook was not tried",
        )
    # No later attempt can come: a delivery is tried only while its row is pending, and the
    # job's only row (recorded with its final status) is settled.
    assert delivery["status"] == "failed" and [a["status_code"] for a in delivery["attempts"]] == [410]
    assert len(receiver.requests) == 1


def test_a_callback_to_a_private_address_is_refused_at_submit(client, settings):
    for url in (
        "http://10.0.0.7/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/x",
        "ftp://example.com/hook",
    ):
        if url.startswith("http://[::1]"):
            continue  # loopback is allowed to the tests' receivers (WHISPERQ_WEBHOOK_ALLOW, WHISPERQ_FETCH_ALLOW)
        resp = upload(client, filename="a.flac", callback_url=url)
        assert resp.status_code == 400, (url, resp.get_json())
        assert "callback_url" in resp.get_json()["error"]["message"]


def test_a_job_run_twice_sends_one_webhook(client, worker, celery_app):
    from models.jobs.operations import get_job
    from models.runtime import get_runtime
    from tasks.broker import publish_transcribe

    with Receiver({"/hook": (200, {}, b"")}) as receiver:
        with worker.paused(celery_app):
            job = submit(client, callback_url=receiver.url("/hook"))
            publish_transcribe(celery_app, get_job(get_runtime(), job["job_id"]))  # delivered twice
        assert wait_for_job(client, job["job_id"], statuses=FINAL)["status"] == "COMPLETED"
        worker.handled(job["job_id"], deliveries=2)  # the second run has had its chance
        [delivery] = wait_until(
            lambda: [d for d in deliveries(client, job["job_id"]) if d["status"] != "pending"], 60, "no webhook came"
        )
    assert delivery["status"] == "delivered"
    assert len(receiver.requests) == 1
    assert len(deliveries(client, job["job_id"])) == 1


# --- cancel, delete, listing --------------------------------------------------------------


def test_a_queued_job_cancelled_never_runs(client, worker, celery_app):
    with Receiver({"/hook": (200, {}, b"")}) as receiver:
        with worker.paused(celery_app):
            job = submit(client, callback_url=receiver.url("/hook"))
            resp = client.post(f"/v1/jobs/{job['job_id']}/cancel")
            assert resp.status_code == 200 and resp.get_json()["status"] == "CANCELLED"
        worker.handled(job["job_id"], deliveries=1)  # the workers have taken its message, and dropped it
        after = client.get(f"/v1/jobs/{job['job_id']}").get_json()
        assert after["status"] == "CANCELLED" and after["attempts"] == 0 and after["result"] is None
        wait_until(lambda: receiver.requests, 30, "no job.cancelled webhook came")
    import json

    assert json.loads(receiver.requests[0][3])["type"] == "job.cancelled"
    assert client.post(f"/v1/jobs/{job['job_id']}/cancel").status_code == 409  # already finished


@pytest.mark.timeout(900)  # waits up to 300 s for the job (setup.cfg's default is 300)
def test_a_running_job_cancelled_stops_at_a_window_boundary_and_keeps_its_part(client, worker, tmp_path):
    samples, text = long_recording(repeats=24)  # about six minutes: windows in several batches
    path = write_wav(tmp_path / "long.wav", samples)
    job = submit(client, "long.wav", data=path.read_bytes())
    wait_until(
        lambda: client.get(f"/v1/jobs/{job['job_id']}").get_json()["progress"] > 0, 300, "no progress was reported"
    )
    resp = client.post(f"/v1/jobs/{job['job_id']}/cancel")
    assert resp.status_code in (200, 202), resp.get_json()
    done = wait_for_job(client, job["job_id"], timeout=300, statuses=FINAL)
    assert done["status"] == "CANCELLED", done["status"]
    assert done["result"]["partial"] is True and done["result"]["segments"]
    assert 0 < done["progress"] < 1
    last = max(s["end"] for s in done["result"]["segments"])
    assert last < done["audio_duration"] - 30  # it stopped well before the end
    # The part kept loses no words: it reads as the recording's start does (the same
    # passage over and over), as well as faster-whisper's own pipeline reads the passage.
    said = normalise(done["result"]["text"])
    reference = " ".join(normalise(text)[: len(said)])
    four, four_text = long_recording(repeats=4)
    assert (
        word_error_rate(reference, " ".join(said))
        <= pipeline_wer("long_recording(4)", four, four_text) + PIPELINE_MARGIN
    )
    resp = client.get(f"/v1/jobs/{job['job_id']}/transcript?format=txt")
    assert resp.status_code == 200 and resp.get_data(as_text=True).strip()


def test_delete_removes_the_audio_and_the_transcript_for_good(client, worker, settings):
    job = submit(client)
    assert wait_for_job(client, job["job_id"], statuses=FINAL)["status"] == "COMPLETED"
    mine = {
        f
        for f in stored_files(settings) | {str(p) for p in (settings.data_dir / "prepared").rglob("*")}
        if job["job_id"] in f
    }
    assert mine, "the upload should be on disk before the delete"
    assert client.delete(f"/v1/jobs/{job['job_id']}").status_code == 204
    assert all(not __import__("os").path.exists(f) for f in mine)
    assert not [p for p in settings.data_dir.rglob(f"*{job['job_id']}*")]
    assert client.get(f"/v1/jobs/{job['job_id']}").status_code == 404
    assert client.get(f"/v1/jobs/{job['job_id']}/transcript").status_code == 404
    assert client.delete(f"/v1/jobs/{job['job_id']}").status_code == 404


def test_listing_is_newest_first_with_cursor_pages(client, worker, celery_app):
    with worker.paused(celery_app):
        made = [submit(client, priority="low")["job_id"] for _ in range(5)]
    seen, url = [], "/v1/jobs?limit=2"
    while url:
        page = client.get(url).get_json()
        assert len(page["jobs"]) <= 2
        seen += [j["job_id"] for j in page["jobs"]]
        url = page["next_url"] and "/v1/jobs?" + page["next_url"].split("?", 1)[1]
        if set(made) <= set(seen):
            break
    assert [j for j in seen if j in made] == list(reversed(made))
    assert len(seen) == len(set(seen))
    completed = client.get("/v1/jobs?status=completed&limit=200").get_json()["jobs"]
    assert all(j["status"] == "COMPLETED" for j in completed)
    for bad in ("limit=0", "limit=201", "limit=x", "status=DONE", "cursor=garbage"):
        resp = client.get(f"/v1/jobs?{bad}")
        assert resp.status_code == 400 and resp.get_json()["error"]["message"], bad


# --- submit by URL ------------------------------------------------------------------------


def test_audio_by_url_is_fetched_by_the_preparation_pool(client, worker):
    clip = CLIPS["report.opus"]
    with Receiver({"/audio/report.opus": (200, {"Content-Type": "audio/ogg"}, clip["path"].read_bytes())}) as server:
        resp = client.post("/v1/jobs", json={"audio_url": server.url("/audio/report.opus"), "priority": "high"})
        assert resp.status_code == 202, resp.get_json()
        job = wait_for_job(client, resp.get_json()["job_id"], statuses=FINAL)
        missing = client.post("/v1/jobs", json={"audio_url": server.url("/audio/nothing.mp3")}).get_json()
        failed = wait_for_job(client, missing["job_id"], statuses=FINAL)
    assert job["status"] == "COMPLETED" and job["audio_duration"] == pytest.approx(9.4, abs=0.2)
    assert word_error_rate(clip["text"], job["result"]["text"]) <= 0.2
    assert failed["status"] == "FAILED" and "404" in failed["error"], failed["error"]
    assert failed["attempts"] == 1  # a 404 is not worth another try


def test_audio_url_to_a_private_address_is_refused(client):
    resp = client.post("/v1/jobs", json={"audio_url": "http://192.168.1.20/a.mp3"})
    assert resp.status_code == 400 and "audio_url" in resp.get_json()["error"]["message"]
    resp = client.post("/v1/jobs", json={"audio_url": "file:///etc/passwd"})
    assert resp.status_code == 400


# --- transcripts ----------------------------------------------------------------------------


def test_word_timestamps_on_request(client, worker):
    job = wait_for_job(client, submit(client, "report.opus", word_timestamps="true")["job_id"], statuses=FINAL)
    assert job["status"] == "COMPLETED" and job["word_timestamps"] is True
    words = [w for s in job["result"]["segments"] for w in s["words"]]
    assert len(words) >= 10
    assert all(w["start"] <= w["end"] for w in words)
    assert all(a["start"] <= b["start"] for a, b in itertools.pairwise(words))
    assert words[-1]["end"] <= job["audio_duration"] + 0.5
    plain = wait_for_job(client, submit(client, "report.opus")["job_id"], statuses=FINAL)
    assert all("words" not in s for s in plain["result"]["segments"])


# --- where is my job --------------------------------------------------------------------------


@pytest.mark.timeout(900)  # waits up to 300 s per job of the first batch (setup.cfg's default is 300)
def test_queue_position_progress_and_estimates(client, worker, celery_app):
    """Queue 20 jobs: their positions in order, a high one ahead of them, each with an estimated
    finish; then they all complete."""
    clips = ["fox.flac", "report.opus"]
    prepared = worker.prepared(celery_app)
    with worker.paused(celery_app, pools=("inference",)):
        jobs = [submit(client, clips[n % 2]) for n in range(20)]
        wait_until(lambda: worker.prepared(celery_app) >= prepared + len(jobs), 120, "the jobs were not all prepared")
    first = {j["job_id"]: j for j in jobs}
    assert [j["queue_position"] for j in jobs] == sorted(j["queue_position"] for j in jobs)
    assert jobs[-1]["queue_position"] >= 19 - 1
    assert all(j["estimated_finish_at"] for j in jobs)
    high = submit(client, "fox.flac", priority="high")
    assert high["queue_position"] < jobs[-1]["queue_position"]
    done = [wait_for_job(client, job_id, timeout=300, statuses=FINAL) for job_id in first]
    done.append(wait_for_job(client, high["job_id"], statuses=FINAL))
    assert all(j["status"] == "COMPLETED" and j["progress"] == 1.0 for j in done)

    def at(text: str) -> datetime:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))

    # How close the estimates come is another test's (test_estimates.py); here each job has one,
    # and it lies after the job was submitted.
    for job in first.values():
        assert at(job["estimated_finish_at"]) > at(job["created_at"]), job
