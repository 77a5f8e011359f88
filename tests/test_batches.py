"""Batches: POST /v1/batches (URLs as JSON, or files as multipart) validates the whole batch
before anything is stored, its jobs are ordinary jobs of the key, GET /v1/batches/<id> counts
and lists them, and exactly one signed `batch.completed` webhook is sent when the last of them
finishes, even when two workers finish the last two at the same moment."""

from __future__ import annotations

import dataclasses
import io
import json
import threading

import pytest
from api import bearer
from helpers import CLIPS, Receiver, stored_files, wait_until
from sqlalchemy import func, select

FOX = CLIPS["fox.flac"]["path"].read_bytes()
REPORT = CLIPS["report.opus"]["path"].read_bytes()
AUDIO = {
    "/fox.flac": (200, {"Content-Type": "audio/flac"}, FOX),
    "/report.opus": (200, {"Content-Type": "audio/ogg"}, REPORT),
}


@pytest.fixture()
def secure(settings, database, celery_app):
    """An app that needs a key, with the default queue budget and URL estimate: a batch of
    twenty URLs fits in a key's share."""
    from web import create_app

    return create_app({"SETTINGS": dataclasses.replace(settings, allow_anonymous=False), "TESTING": True})


def make_app(settings, **changes):
    from web import create_app

    values = {"allow_anonymous": False, "url_audio_estimate_seconds": 60.0, **changes}
    return create_app({"SETTINGS": dataclasses.replace(settings, **values), "TESTING": True})


@pytest.fixture()
def keys(secure):
    from models.access.apikeys import create_key

    rt = secure.extensions["whisperq"]
    return {
        name: create_key(rt, f"{name}-batch-test", tier)
        for name, tier in (("alice", "premium"), ("bob", "standard"), ("nightly", "batch"))
    }


def counts(database) -> tuple[int, int]:
    from models.jobs.batches import Batch
    from models.jobs.record import Job

    with database.session() as s:
        return (s.scalar(select(func.count()).select_from(Job)), s.scalar(select(func.count()).select_from(Batch)))


def wait_for_batch(client, batch_id: str, headers: dict, timeout: float = 300.0) -> dict:
    def finished():
        body = client.get(f"/v1/batches/{batch_id}?limit=200", headers=headers).get_json()
        return body["done"] and body["finished_at"] and body  # its finish is recorded as its last job's commit is

    return wait_until(finished, timeout, f"batch {batch_id} did not finish")


def test_the_listing_pages_and_another_key_sees_nothing(secure, keys, monkeypatch):
    from tasks.broker import CeleryBroker

    # Kept from the workers: a job they took would be running, not cancelled at once, below.
    monkeypatch.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: None)
    client = secure.test_client()
    alice, bob = keys["alice"], keys["bob"]
    urls = [f"http://127.0.0.1:9/a{n}.mp3" for n in range(5)]
    made = client.post(
        "/v1/batches",
        json={"items": [{"audio_url": u, "prompt": f"item {n}"} for n, u in enumerate(urls)], "priority": "low"},
        headers=bearer(alice[1]),
    ).get_json()
    batch_id = made["batch_id"]
    seen, url = [], f"/v1/batches/{batch_id}?limit=2"
    while url:
        page = client.get(url, headers=bearer(alice[1])).get_json()
        assert len(page["jobs"]) <= 2 and page["total"] == 5
        seen += page["jobs"]
        url = page["next_url"] and page["next_url"].split("localhost", 1)[-1]
    assert len({j["job_id"] for j in seen}) == 5 and {j["audio_url"] for j in seen} == set(urls)
    job_id = seen[0]["job_id"]
    assert client.get(f"/v1/jobs/{job_id}", headers=bearer(alice[1])).get_json()["priority"] == "low"
    # Another key: as if neither existed.
    for path in (f"/v1/batches/{batch_id}", f"/v1/jobs/{job_id}"):
        assert client.get(path, headers=bearer(bob[1])).status_code == 404
    assert client.post(f"/v1/batches/{batch_id}/cancel", headers=bearer(bob[1])).status_code == 404
    # The owner cancels it; a deleted job stays counted, listed as deleted.
    assert client.delete(f"/v1/jobs/{seen[1]['job_id']}", headers=bearer(alice[1])).status_code == 204
    cancelled = client.post(f"/v1/batches/{batch_id}/cancel", headers=bearer(alice[1]))
    assert cancelled.status_code == 200
    body = cancelled.get_json()
    assert body["done"] and body["counts"]["CANCELLED"] == 5 and body["finished_at"]
    deleted = [j for j in body["jobs"] if j["deleted"]]
    assert [j["job_id"] for j in deleted] == [seen[1]["job_id"]] and deleted[0]["status_url"] is None
    assert client.post(f"/v1/batches/{batch_id}/cancel", headers=bearer(alice[1])).status_code == 409


def test_the_tier_bounds_the_batch_priority(secure, keys, database, published):
    client = secure.test_client()
    before = counts(database)
    body = {"audio_urls": ["http://127.0.0.1:9/a.mp3", "http://127.0.0.1:9/b.mp3"]}
    refused = client.post("/v1/batches", json={**body, "priority": "high"}, headers=bearer(keys["nightly"][1]))
    assert refused.status_code == 403 and "tier (batch)" in refused.get_json()["error"]["message"]
    assert (
        client.post("/v1/batches", json={**body, "priority": "high"}, headers=bearer(keys["bob"][1])).status_code == 403
    )
    assert counts(database) == before and published == []
    made = client.post("/v1/batches", json=body, headers=bearer(keys["nightly"][1])).get_json()  # the tier's own
    for job in made["jobs"]:
        assert (
            client.get(f"/v1/jobs/{job['job_id']}", headers=bearer(keys["nightly"][1])).get_json()["priority"] == "low"
        )
    assert len(published) == 2
    client.post(f"/v1/batches/{made['batch_id']}/cancel", headers=bearer(keys["nightly"][1]))


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"audio_urls": ["http://127.0.0.1:9/a.mp3", "http://10.1.2.3/b.mp3"]}, 400, "audio_urls[1]"),
        ({"audio_urls": ["http://127.0.0.1:9/a.mp3", "ftp://example.com/b.mp3"]}, 400, "audio_urls[1]"),
        (
            {
                "items": [
                    {"audio_url": "http://127.0.0.1:9/a.mp3"},
                    {"audio_url": "http://127.0.0.1:9/b.mp3", "language": "klingon"},
                ]
            },
            400,
            "items[1]: language",
        ),
        (
            {"items": [{"audio_url": "http://127.0.0.1:9/a.mp3", "priority": "high"}]},
            400,
            "the priority is the batch's",
        ),
        ({"audio_urls": ["http://127.0.0.1:9/a.mp3"], "temperature": 3}, 400, "temperature"),
        ({"audio_urls": ["http://127.0.0.1:9/a.mp3"], "callback_url": "http://169.254.169.254/x"}, 400, "callback_url"),
        ({"audio_urls": [f"http://127.0.0.1:9/{n}.mp3" for n in range(4)]}, 400, "WHISPERQ_MAX_BATCH_ITEMS"),
        ({"audio_urls": []}, 400, "empty"),
        ({"audio_urls": ["http://127.0.0.1:9/a.mp3"], "items": []}, 400, "not both"),
        ({"audio_url": "http://127.0.0.1:9/a.mp3"}, 400, "unknown field"),
    ],
)
def test_a_bad_item_refuses_the_whole_batch_and_leaves_nothing(settings, database, published, body, status, words):
    from models.access.apikeys import create_key

    app = make_app(settings, max_batch_items=3)
    key = create_key(app.extensions["whisperq"], "refused-batch", "standard")
    files, before = stored_files(settings), counts(database)
    resp = app.test_client().post("/v1/batches", json=body, headers=bearer(key[1]))
    assert resp.status_code == status, resp.get_json()
    assert words in resp.get_json()["error"]["message"]
    assert counts(database) == before and stored_files(settings) == files and published == []


def test_a_batch_that_does_not_fit_the_queue_or_the_quota_is_refused_whole(settings, database, published):
    from models.access.apikeys import create_key

    urls = [f"http://127.0.0.1:9/{n}.mp3" for n in range(5)]
    # Each URL job counts at 60 s. A key's share of a 400 s budget is 200 s: sent one by one,
    # the fifth would find 240 s of the key's waiting and be refused; so the batch is, whole.
    app = make_app(settings, queue_budget_seconds=400.0)
    key = create_key(app.extensions["whisperq"], "big-batch", "premium")
    before = counts(database)
    full = app.test_client().post("/v1/batches", json={"audio_urls": urls}, headers=bearer(key[1]))
    assert full.status_code == 429 and full.get_json()["error"]["code"] == "queue_full" and full.headers["Retry-After"]
    assert counts(database) == before and published == []
    # A monthly quota of 3 minutes holds three 60 s URL jobs, not five.
    app = make_app(settings, quota_hours_standard=0.05)
    key = create_key(app.extensions["whisperq"], "quota-batch", "standard")
    over = app.test_client().post("/v1/batches", json={"audio_urls": urls}, headers=bearer(key[1]))
    assert over.status_code == 429 and over.get_json()["error"]["code"] == "quota_exceeded"
    assert counts(database) == before and published == []


def test_idempotency_key_returns_the_same_batch(secure, keys, database, published):
    client = secure.test_client()
    headers = {**bearer(keys["bob"][1]), "Idempotency-Key": "nightly-run-1"}
    body = {"audio_urls": ["http://127.0.0.1:9/a.mp3", "http://127.0.0.1:9/b.mp3"]}
    first = client.post("/v1/batches", json=body, headers=headers)
    again = client.post("/v1/batches", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (202, 200)
    assert first.get_json()["batch_id"] == again.get_json()["batch_id"] and len(published) == 2
    other = client.post("/v1/batches", json={"audio_urls": ["http://127.0.0.1:9/c.mp3"]}, headers=headers)
    assert other.status_code == 409
    client.post(f"/v1/batches/{first.get_json()['batch_id']}/cancel", headers=bearer(keys["bob"][1]))


def test_the_last_two_jobs_finishing_at_once_record_one_delivery(settings, database):
    """Two threads finish a batch's last two jobs at the same moment, many times over: each
    batch gets exactly one batch.completed delivery, and a late duplicate adds none."""
    from models.delivery.notify import WebhookDelivery
    from models.jobs.batches import Batch, create_batch
    from models.jobs.operations import complete_job, fail_job
    from models.runtime import Runtime

    rt = Runtime(settings)  # no publisher: the rows are what is checked
    data = {"text": "hello", "language": "en", "segments": [], "duration": 1.0}
    item = {
        "audio_url": "http://127.0.0.1:9/a.mp3",
        "filename": "a.mp3",
        "language": "en",
        "priority": "normal",
        "task": "transcribe",
        "callback_url": None,
        "word_timestamps": False,
        "prompt": None,
        "temperature": None,
    }
    for _round in range(8):
        batch, jobs = create_batch(
            rt, [dict(item) for _ in range(4)], owner=None, callback_url="http://127.0.0.1:9/hook"
        )
        complete_job(rt, jobs[0].id, data)
        fail_job(rt, jobs[1].id, "the audio could not be fetched")
        start = threading.Barrier(2)
        errors = []

        def finish(job_id, start=start, errors=errors):
            try:
                start.wait()
                complete_job(rt, job_id, data)
            except Exception as exc:  # pragma: no cover - shown by the assertion
                errors.append(exc)

        threads = [threading.Thread(target=finish, args=(job.id,)) for job in jobs[2:]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        complete_job(rt, jobs[3].id, data)  # a duplicate delivery of the last job's message
        with database.session() as s:
            rows = s.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == batch.id)).all()
            assert [r.event for r in rows] == ["batch.completed"]
            assert s.get(Batch, batch.id).finished_at is not None


def test_a_batch_finishes_once_and_its_payload_lists_every_job(settings, database):
    from models.delivery.notify import _batch_payload
    from models.jobs.batches import create_batch, get_batch
    from models.jobs.operations import cancel_job, complete_job, delete_job
    from models.runtime import Runtime

    rt = Runtime(settings)
    item = {"audio_url": "http://127.0.0.1:9/a.mp3", "language": None, "priority": "normal"}
    batch, jobs = create_batch(rt, [dict(item) for _ in range(3)], owner=None, callback_url=None)
    complete_job(rt, jobs[0].id, {"text": "hi", "language": "en", "segments": [], "duration": 1.0})
    delete_job(rt, jobs[1].id)  # waiting: cancelled, its row kept
    assert not get_batch(rt, batch.id).done
    cancel_job(rt, jobs[2].id)
    found = get_batch(rt, batch.id)
    assert found.done and found.counts == {"COMPLETED": 1, "CANCELLED": 2} and found.batch.finished_at
    with database.session() as s:
        payload, owner = _batch_payload(s, batch.id, lambda job_id: f"/t/{job_id}")
    listed = {j["job_id"]: j for j in payload["data"]["jobs"]}
    assert listed[jobs[0].id]["transcript_url"] == f"/t/{jobs[0].id}" and listed[jobs[1].id]["deleted"]
    assert payload["data"]["counts"] == {"COMPLETED": 1, "CANCELLED": 2} and owner is None


def test_a_replayed_job_reopens_its_batch_which_tells_again_when_it_ends(settings, database):
    from models.delivery.notify import WebhookDelivery
    from models.jobs.batches import create_batch, get_batch
    from models.jobs.deadletter import move_to_dead_letters, take_for_replay
    from models.jobs.operations import complete_job
    from models.runtime import Runtime

    rt = Runtime(settings)
    data = {"text": "hello", "language": "en", "segments": [], "duration": 1.0}
    item = {"audio_url": "http://127.0.0.1:9/a.mp3", "language": None, "priority": "normal"}
    batch, jobs = create_batch(rt, [dict(item) for _ in range(2)], owner=None, callback_url="http://127.0.0.1:9/hook")
    complete_job(rt, jobs[0].id, data)
    move_to_dead_letters(rt, jobs[1].id, "whisperq.transcribe", "the worker died three times", None)
    first = get_batch(rt, batch.id)
    assert first.done and first.counts == {"COMPLETED": 1, "FAILED": 1} and first.batch.finished_at

    take_for_replay(rt, jobs[1].id)
    reopened = get_batch(rt, batch.id)
    assert not reopened.done and reopened.to_dict()["status"] == "PROCESSING" and reopened.batch.finished_at is None
    complete_job(rt, jobs[1].id, data)
    again = get_batch(rt, batch.id)
    assert again.done and again.counts == {"COMPLETED": 2} and again.batch.finished_at
    with database.session() as s:
        rows = s.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id == batch.id)).all()
    assert [r.event for r in rows] == ["batch.completed"] * 2  # one for each time it finished


def test_retention_clears_a_finished_batchs_callback_and_delivery_and_keeps_its_counts(settings, private_db, tmp_path):
    from datetime import timedelta

    from sqlalchemy import update

    from models.delivery.notify import WebhookDelivery
    from models.jobs.batches import Batch, create_batch, get_batch
    from models.jobs.operations import complete_job
    from models.jobs.record import Job, utcnow
    from models.maintenance.retention import run_retention
    from models.runtime import Runtime

    rt = Runtime(
        dataclasses.replace(
            settings, database_url=private_db, data_dir=tmp_path / "data", result_retention_seconds=7 * 86400.0
        )
    )
    rt.db.upgrade()
    item = {"audio_url": "http://127.0.0.1:9/a.mp3", "language": None, "priority": "normal"}
    old, old_jobs = create_batch(rt, [dict(item)], owner=None, callback_url="http://127.0.0.1:9/hook")
    recent, recent_jobs = create_batch(rt, [dict(item)], owner=None, callback_url="http://127.0.0.1:9/hook")
    for job in old_jobs + recent_jobs:
        complete_job(rt, job.id, {"text": "hi", "language": "en", "segments": [], "duration": 1.0})
    week_ago = utcnow() - timedelta(days=8)
    with rt.db.session() as s:
        s.execute(update(Batch).where(Batch.id == old.id).values(finished_at=week_ago))
        s.execute(update(Job).where(Job.batch_id == old.id).values(finished_at=week_ago))
    counts = run_retention(rt)
    assert counts["results_purged"] == 1 and counts["webhook_deliveries_deleted"] == 1
    with rt.db.session() as s:
        left = {r.job_id for r in s.scalars(select(WebhookDelivery)).all()}
        assert left == {recent.id} and s.get(Batch, old.id).callback_url is None
    kept = get_batch(rt, old.id)
    assert kept.done and kept.counts == {"COMPLETED": 1}
    rt.db.dispose()


def post_files(client, files, key, **fields):
    """A multipart batch: each (name, bytes) in a field 'file', the options as fields."""
    from werkzeug.datastructures import MultiDict

    form = MultiDict([("file", (io.BytesIO(data), name)) for name, data in files] + list(fields.items()))
    return client.post("/v1/batches", data=form, content_type="multipart/form-data", headers=bearer(key[1]))


def test_a_batch_of_files_stores_each_as_an_upload_with_the_shared_options(secure, keys, database, published):
    from models.jobs.operations import get_job
    from models.speech import audio

    client, rt = secure.test_client(), secure.extensions["whisperq"]
    files, before = stored_files(rt.settings), counts(database)
    resp = post_files(
        client,
        [("fox.flac", FOX), ("report.opus", REPORT), ("fox-again.flac", FOX)],
        keys["bob"],
        language="en",
        prompt="a weather report",
        word_timestamps="true",
        priority="low",
        callback_url="http://127.0.0.1:9/hook",
    )
    assert resp.status_code == 202, resp.get_json()
    body = resp.get_json()
    assert body["total"] == 3 and body["callback_url"] == "http://127.0.0.1:9/hook" and len(published) == 3
    assert [j["filename"] for j in sorted(body["jobs"], key=lambda j: j["filename"])] == [
        "fox-again.flac",
        "fox.flac",
        "report.opus",
    ]
    # The jobs go to the real broker, where the session's workers (if an earlier test started
    # them) may already be preparing them: what is checked here is what the door made.
    lengths = {
        "fox.flac": audio.probe(io.BytesIO(FOX)).duration,
        "report.opus": audio.probe(io.BytesIO(REPORT)).duration,
    }
    refs = set()
    for listed in body["jobs"]:
        job = get_job(rt, listed["job_id"])
        assert (job.batch_id, job.language, job.prompt, job.priority, job.word_timestamps, job.audio_url) == (
            body["batch_id"],
            "en",
            "a weather report",
            "low",
            True,
            None,
        )
        # The door stores the container's length; preparation, the decoded one (Opus drops its
        # 6.5 ms pre-skip): either will do.
        assert job.audio_duration == pytest.approx(lengths[job.filename.replace("-again", "")], abs=0.01)
        assert rt.storage.exists(job.audio_ref)
        refs.add(str(rt.settings.data_dir / job.audio_ref))
    assert counts(database) == (before[0] + 3, before[1] + 1)
    made = stored_files(rt.settings) - files
    assert len(refs) == 3 and refs <= made
    assert not [f for f in made if f.startswith(str(rt.settings.data_dir / "tmp"))]  # no upload spool left behind
    client.post(f"/v1/batches/{body['batch_id']}/cancel", headers=bearer(keys["bob"][1]))


BIG = REPORT + b"\0" * (1024 * 1024)  # an Ogg file with a tail: over the 1 MB a batch may carry here


@pytest.mark.parametrize(
    "files, fields, status, words",
    [
        ([("fox.flac", FOX), ("notes.txt", b"these are not audio bytes" * 40)], {}, 415, "file[1] ('notes.txt')"),
        ([("fox.flac", FOX), ("empty.flac", b"")], {}, 400, "file[1] ('empty.flac'): the uploaded file is empty"),
        ([("fox.flac", FOX)] * 4, {}, 400, "WHISPERQ_MAX_BATCH_ITEMS"),
        ([], {"language": "en"}, 400, "no audio file"),
        ([("fox.flac", FOX)], {"audio_urls": "http://127.0.0.1:9/a.mp3"}, 400, "unknown field"),
        ([("fox.flac", FOX)], {"language": "klingon"}, 400, "language"),
        ([("fox.flac", FOX)], {"callback_url": "http://169.254.169.254/x"}, 400, "callback_url"),
        ([("fox.flac", FOX), ("big.opus", BIG)], {}, 413, "WHISPERQ_MAX_BATCH_UPLOAD_MB"),
        (
            [("fox.flac", FOX), ("long.flac", "90 s")],
            {},
            413,
            "file[1] ('long.flac'): the audio is longer than the limit",
        ),
    ],
)
def test_a_bad_file_refuses_the_whole_batch_and_leaves_nothing(
    settings, database, published, tmp_path, files, fields, status, words
):
    from test_web_limits import flac

    from models.access.apikeys import create_key

    files = [(name, flac(tmp_path / name, 90).read_bytes() if data == "90 s" else data) for name, data in files]
    app = make_app(settings, max_batch_items=3, max_batch_upload_mb=1, max_audio_seconds=60.0)
    key = create_key(app.extensions["whisperq"], "refused-files", "standard")
    stored, before = stored_files(settings), counts(database)
    resp = post_files(app.test_client(), files, key, **fields)
    assert resp.status_code == status, resp.get_json()
    assert words in resp.get_json()["error"]["message"], resp.get_json()
    assert counts(database) == before and stored_files(settings) == stored and published == []


def test_a_batch_of_files_counts_at_their_lengths_against_the_quota(settings, database, published):
    from models.access.apikeys import create_key
    from models.speech import audio

    fox = audio.probe(io.BytesIO(FOX)).duration
    app = make_app(settings, quota_hours_standard=2.5 * fox / 3600)
    key = create_key(app.extensions["whisperq"], "quota-files", "standard")
    stored, before = stored_files(settings), counts(database)
    over = post_files(app.test_client(), [(f"fox{n}.flac", FOX) for n in range(3)], key)
    assert over.status_code == 429 and over.get_json()["error"]["code"] == "quota_exceeded", over.get_json()
    assert over.get_json()["error"]["quota"]["requested_audio_seconds"] == pytest.approx(3 * fox, abs=0.01)
    assert counts(database) == before and stored_files(settings) == stored and published == []
    fits = post_files(app.test_client(), [(f"fox{n}.flac", FOX) for n in range(2)], key)
    assert fits.status_code == 202 and len(published) == 2


# Last in this file: the other tests' jobs wait in the queue where no worker runs yet.
@pytest.mark.integration
def test_twenty_real_jobs_complete_and_one_signed_webhook_lists_them(secure, keys, worker):
    from models.access.apikeys import webhook_secrets_for
    from models.delivery import webhooks

    rt, client = secure.extensions["whisperq"], secure.test_client()
    alice = keys["alice"]
    with Receiver({**AUDIO, "/hook": (200, {}, b"")}) as receiver:
        urls = [receiver.url("/fox.flac" if n % 2 else "/report.opus") + f"?n={n}" for n in range(20)]
        resp = client.post(
            "/v1/batches",
            json={"audio_urls": urls, "language": "en", "callback_url": receiver.url("/hook")},
            headers=bearer(alice[1]),
        )
        assert resp.status_code == 202, resp.get_json()
        body = resp.get_json()
        batch_id = body["batch_id"]
        assert resp.headers["Location"] == body["status_url"] and body["status_url"].endswith(f"/v1/batches/{batch_id}")
        assert body["total"] == 20 and len(body["jobs"]) == 20 and body["done"] is False

        done = wait_for_batch(client, batch_id, bearer(alice[1]))
        assert done["counts"]["COMPLETED"] == 20 and done["status"] == "COMPLETED" and done["finished_at"]
        for job in done["jobs"]:  # each an ordinary job of the key
            one = client.get(f"/v1/jobs/{job['job_id']}", headers=bearer(alice[1])).get_json()
            assert one["status"] == "COMPLETED" and one["batch_id"] == batch_id and one["result"]["text"]

        # Every webhook there will be has its row by now (each is recorded by the commit that
        # finished its job or batch, and all have finished): one, for the batch, and settled;
        # a row is tried only while it is pending, so no later request can come.
        deliveries = wait_until(
            lambda: (
                (
                    rows := client.get(f"/v1/batches/{batch_id}", headers=bearer(alice[1])).get_json()[
                        "webhook_deliveries"
                    ]
                )
                and all(d["status"] != "pending" for d in rows)
                and rows
            ),
            30,
            "the batch's webhook was not delivered",
        )
        assert [d["status"] for d in deliveries] == ["delivered"]
        assert all(
            not client.get(f"/v1/jobs/{job['job_id']}", headers=bearer(alice[1])).get_json().get("webhook_deliveries")
            for job in done["jobs"]
        )  # no per-job webhooks
        hooks = [r for r in receiver.requests if r[1] == "/hook"]
        assert len(hooks) == 1, [json.loads(r[3])["type"] for r in hooks]
    _method, _path, headers, raw = hooks[0]
    webhooks.verify(webhook_secrets_for(rt, alice[0].id)[0], dict(headers.items()), raw)
    event = json.loads(raw)
    assert event["type"] == "batch.completed" and event["data"]["batch_id"] == batch_id
    assert event["data"]["owner"] == alice[0].id and event["data"]["counts"] == {"COMPLETED": 20}
    listed = {j["job_id"]: j for j in event["data"]["jobs"]}
    assert set(listed) == {j["job_id"] for j in done["jobs"]}
    assert all(
        j["status"] == "COMPLETED" and j["transcript_url"].endswith(f"/v1/jobs/{i}/transcript?format=json")
        for i, j in listed.items()
    )


@pytest.mark.integration
def test_a_batch_of_files_is_transcribed(secure, keys, worker):
    from helpers import normalise

    client, bob = secure.test_client(), keys["bob"]
    resp = post_files(client, [("fox.flac", FOX), ("report.opus", REPORT)], bob, language="en")
    assert resp.status_code == 202, resp.get_json()
    done = wait_for_batch(client, resp.get_json()["batch_id"], bearer(bob[1]))
    assert done["counts"]["COMPLETED"] == 2, done
    texts = {}
    for job in done["jobs"]:
        texts[job["filename"]] = client.get(
            job["transcript_url"].split("localhost", 1)[-1] + "?format=txt", headers=bearer(bob[1])
        ).get_data(as_text=True)
    for name in ("fox.flac", "report.opus"):
        said, heard = normalise(CLIPS[name]["text"]), normalise(texts[name])
        assert len(set(said) - set(heard)) <= 1, (name, texts[name])
