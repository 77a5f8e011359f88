"""Usage per API key and UTC day, and monthly audio quotas per tier: counted exactly for a
known set of jobs (made through the API with real audio, taken through every ending with
the models' own functions), each key seeing only its own, admins any or all, the CLI, the
metrics, the door refusing what does not fit (nothing stored, nothing enqueued) even under a
race, and the month boundary with "now" passed in."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from datetime import UTC, date, datetime, timedelta

import pytest
from api import bearer, upload
from helpers import CLIPS, make_job, stored_files
from sqlalchemy import func, select, update

FOX = CLIPS["fox.flac"]["path"].read_bytes()
FOX_SECONDS = 4.3  # its header's length, what the door measures
MAX_AUDIO = 3600.0
URL_ESTIMATE = 900.0  # what a job by URL holds until it is fetched


@dataclasses.dataclass
class Door:
    app: object
    rt: object
    client: object
    published: list
    keys: dict  # name -> (key id, token)

    def token(self, name: str) -> str:
        return self.keys[name][1]

    def id(self, name: str) -> str:
        return self.keys[name][0]

    def usage(self, token: str, query: str = ""):
        return self.client.get(f"/v1/usage{query}", headers=bearer(token))


def door_for(settings, tmp_path, monkeypatch, name: str = "usage", **changes) -> Door:
    """An app that needs keys, on a database of its own (so "every key" is this test's keys
    only), whose jobs are recorded but not sent to a worker: the tests end them themselves."""
    from models.access.apikeys import create_key
    from tasks.broker import CeleryBroker
    from web import create_app

    published: list = []
    monkeypatch.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: published.append(job.id))
    values = dict(
        database_url=f"sqlite:///{tmp_path / f'{name}.db'}",
        allow_anonymous=False,
        rate_limit_premium=None,
        rate_limit_standard=None,
        rate_limit_batch=None,
        max_audio_seconds=MAX_AUDIO,
        url_audio_estimate_seconds=URL_ESTIMATE,
        queue_budget_jobs=10**6,
        queue_budget_seconds=10**9,
        queue_key_share=1.0,
        models=settings.models[:1],
        default_model=settings.models[0].name,
    )
    app = create_app({"SETTINGS": dataclasses.replace(settings, **{**values, **changes}), "TESTING": True})
    rt = app.extensions["whisperq"]
    keys = {}
    for who, tier, admin in (("alice", "standard", False), ("bob", "batch", False), ("ops", "premium", True)):
        record, token = create_key(rt, who, tier, admin=admin)
        keys[who] = (record.id, token)
    return Door(app, rt, app.test_client(), published, keys)


@pytest.fixture()
def door(settings, tmp_path, monkeypatch, database):
    return door_for(settings, tmp_path, monkeypatch)


def job_count(rt) -> int:
    from models.jobs.record import Job

    with rt.db.session() as session:
        return session.scalar(select(func.count()).select_from(Job))


def end_jobs(rt, ids: dict) -> None:
    """Take the jobs through every ending a job can have."""
    from models.jobs.operations import begin_inference, cancel_running, complete_job, fail_job, record_progress
    from models.jobs.record import Job

    complete_job(
        rt, ids["completed"], {"text": "The quick brown fox.", "language": "en", "segments": [], "duration": 4.312}
    )  # billed as decoded, not as the header said
    complete_job(
        rt, ids["deleted"], {"text": "The quick brown fox.", "language": "en", "segments": [], "duration": FOX_SECONDS}
    )
    fail_job(rt, ids["failed"], "the audio could not be decoded")
    with rt.db.session() as session:
        session.get(Job, ids["expired"]).expire()
    # Transcribed up to 2 s, then cancelled at that window's end: the part done is billed.
    assert begin_inference(rt, ids["partly"], "w@test", "w1", "host-a:1", 60)[1] is None
    record_progress(rt, ids["partly"], 2.0)
    cancel_running(
        rt,
        ids["partly"],
        {
            "text": "The quick",
            "language": "en",
            "duration": FOX_SECONDS,
            "segments": [{"start": 0.0, "end": 2.0, "text": " The quick"}],
        },
    )


def test_usage_is_counted_exactly_for_a_known_set_of_jobs(door):
    """Of nine submissions: two completed (one then deleted: still billed), one cancelled
    after 2 s were transcribed (2 s billed), one failed, one expired, one cancelled while
    waiting (not billed), one waiting and one by URL (in flight, the URL at
    WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS), one re-run (a job of its own), and one repeated
    Idempotency-Key (no new job)."""
    alice, client = door.token("alice"), door.client
    names = ("completed", "deleted", "partly", "failed", "expired", "cancelled", "waiting")
    ids = {}
    for name in names:
        resp = upload(client, token=alice)
        assert resp.status_code == 202, resp.get_json()
        ids[name] = resp.get_json()["job_id"]
    again = [upload(client, token=alice).get_json()["job_id"]]
    again += [upload(client, token=alice, headers={"Idempotency-Key": "same"}).get_json()["job_id"] for _ in range(2)]
    assert again[1] == again[2]  # one job for the two requests
    ids["waiting_too"], ids["idempotent"] = again[0], again[1]
    by_url = client.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/call.flac"}, headers=bearer(alice))
    assert by_url.status_code == 202, by_url.get_json()
    assert client.post(f"/v1/jobs/{ids['cancelled']}/cancel", headers=bearer(alice)).status_code == 200
    rerun = client.post(f"/v1/jobs/{ids['waiting']}/rerun", json={}, headers=bearer(alice))
    assert rerun.status_code == 202, rerun.get_json()
    end_jobs(door.rt, ids)
    assert client.delete(f"/v1/jobs/{ids['deleted']}", headers=bearer(alice)).status_code == 204
    # bob's one job is his alone.
    assert upload(client, token=door.token("bob")).status_code == 202

    resp = door.usage(alice)
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    today = datetime.now(UTC).date()
    assert (body["from"], body["to"]) == (today.replace(day=1).isoformat(), today.isoformat())
    [mine] = body["keys"]
    assert (mine["key_id"], mine["name"], mine["tier"], mine["revoked"]) == (
        door.id("alice"),
        "alice",
        "standard",
        False,
    )
    expected = {
        "jobs": 3,
        "audio_seconds": round(4.312 + FOX_SECONDS + 2.0, 3),
        # waiting, waiting_too, idempotent, the re-run, and the URL job at the estimate
        "in_flight_jobs": 5,
        "in_flight_audio_seconds": round(4 * FOX_SECONDS + URL_ESTIMATE, 3),
        "unbilled_jobs": 3,
    }  # failed, expired, cancelled while waiting
    assert mine["total"] == expected
    assert mine["days"] == [dict(expected, date=today.isoformat())]
    assert mine["quota"] is None  # no quota configured
    assert len(door.published) == 12  # every accepted job was sent, the repeated request's once

    # The jobs end: the waiting ones complete, the URL one is fetched (9.4 s) and completes.
    from models.jobs.operations import complete_job
    from models.jobs.record import Job

    with door.rt.db.session() as session:
        session.execute(update(Job).where(Job.id == by_url.get_json()["job_id"]).values(audio_duration=9.392))
    for job_id in (
        ids["waiting"],
        ids["waiting_too"],
        ids["idempotent"],
        rerun.get_json()["job_id"],
        by_url.get_json()["job_id"],
    ):
        complete_job(door.rt, job_id, {"text": "x", "language": "en", "segments": [], "duration": None})
    total = door.usage(alice).get_json()["keys"][0]["total"]
    assert total == {
        "jobs": 8,
        "audio_seconds": round(4.312 + FOX_SECONDS + 2.0 + 4 * FOX_SECONDS + 9.392, 3),
        "in_flight_jobs": 0,
        "in_flight_audio_seconds": 0.0,
        "unbilled_jobs": 3,
    }


def test_a_key_sees_only_its_own_usage_and_admins_see_any_key_or_all(door):
    client = door.client
    for name, n in (("alice", 2), ("bob", 1)):
        for _ in range(n):
            assert upload(client, token=door.token(name)).status_code == 202
    bob = door.usage(door.token("bob")).get_json()["keys"]
    assert [(k["key_id"], k["total"]["in_flight_jobs"]) for k in bob] == [(door.id("bob"), 1)]
    # Another key's usage is "not found", exactly as a key that never was.
    theirs = door.usage(door.token("bob"), f"?key={door.id('alice')}")
    nobody = door.usage(door.token("bob"), "?key=no-such-key")
    assert theirs.status_code == nobody.status_code == 404
    assert theirs.get_json()["error"]["message"].replace(door.id("alice"), "X") == nobody.get_json()["error"][
        "message"
    ].replace("no-such-key", "X")
    assert door.usage(door.token("bob"), f"?key={door.id('bob')}").get_json()["keys"][0]["key_id"] == door.id("bob")
    assert client.get("/v1/usage").status_code == 401

    for admin in ("test-admin-token", door.token("ops")):
        every = door.usage(admin).get_json()["keys"]
        assert {k["key_id"]: k["total"]["in_flight_jobs"] for k in every} == {
            door.id("alice"): 2,
            door.id("bob"): 1,
            door.id("ops"): 0,
        }
        one = door.usage(admin, f"?key={door.token('alice')[:10]}").get_json()["keys"]  # the start of the key
        assert [k["key_id"] for k in one] == [door.id("alice")]
    assert door.usage("test-admin-token", "?key=no-such-key").status_code == 404


@pytest.mark.parametrize(
    "query, words",
    [
        ("?from=2026-13-01", "YYYY-MM-DD"),
        ("?from=yesterday", "YYYY-MM-DD"),
        ("?to=%C2%B2026-01-01", "YYYY-MM-DD"),
        ("?from=2026-03-02&to=2026-03-01", "before"),
        ("?from=2020-01-01&to=2026-01-01", "at most 366"),
        ("?from=9999-12-31&to=9999-12-31", "last day"),
    ],
)
def test_a_bad_range_is_400_saying_what_to_send(door, query, words):
    resp = door.usage(door.token("alice"), query)
    assert resp.status_code == 400 and words in resp.get_json()["error"]["message"], resp.get_json()


def test_the_cli_prints_usage_as_a_table_and_as_json(door, tmp_path):
    from click.testing import CliRunner

    from web.cli import cli

    for _ in range(2):
        upload(door.client, token=door.token("alice"))
    env = {"DATABASE_URL": door.rt.settings.database_url, "WHISPERQ_QUOTA_HOURS_STANDARD": "1"}
    runner = CliRunner()
    table = runner.invoke(cli, ["keys", "usage", door.id("alice")], env=env)
    assert table.exit_code == 0, table.output
    today = datetime.now(UTC).date().isoformat()
    assert door.id("alice") in table.output and "alice" in table.output and "standard" in table.output
    assert f"  {today}  " in table.output and "2 in flight (8.600 s)" in table.output
    assert "of 3600 s (1 h, tier standard); 3591.400 s left; resets" in table.output
    as_json = runner.invoke(cli, ["keys", "usage", "--json", "--from", today, "--to", today], env=env)
    assert as_json.exit_code == 0, as_json.output
    found = json.loads(as_json.output)
    assert (found["from"], found["to"]) == (today, today)
    assert {k["name"]: k["total"]["in_flight_jobs"] for k in found["keys"]} == {"alice": 2, "bob": 0, "ops": 0}
    assert next(k for k in found["keys"] if k["name"] == "alice")["quota"]["remaining_audio_seconds"] == 3591.4
    bad = runner.invoke(cli, ["keys", "usage", "no-such-key"], env=env)
    assert bad.exit_code != 0 and "no API key" in bad.output
    assert runner.invoke(cli, ["keys", "usage", "--from", "2026-02-30"], env=env).exit_code != 0


def test_the_metrics_show_this_months_usage_and_quota_per_key(settings, tmp_path, monkeypatch, database):
    from prometheus_client.parser import text_string_to_metric_families

    from models.jobs.operations import complete_job

    door = door_for(settings, tmp_path, monkeypatch, quota_hours_batch=2.0)
    jobs = [upload(door.client, token=door.token("alice")).get_json()["job_id"] for _ in range(3)]
    upload(door.client, token=door.token("bob"))
    for job_id in jobs[:2]:
        complete_job(door.rt, job_id, {"text": "x", "language": "en", "segments": [], "duration": None})
    resp = door.client.get("/metrics")
    assert resp.status_code == 200
    samples = {
        (s.name, s.labels["key"]): (s.value, s.labels)
        for family in text_string_to_metric_families(resp.get_data(as_text=True))
        for s in family.samples
        if s.name.startswith(("whisperq_usage", "whisperq_quota"))
    }
    alice, bob, ops = door.id("alice"), door.id("bob"), door.id("ops")
    assert samples[("whisperq_usage_audio_seconds", alice)] == (
        2 * FOX_SECONDS,
        {"key": alice, "name": "alice", "tier": "standard"},
    )
    assert samples[("whisperq_usage_jobs", alice)][0] == 2
    assert samples[("whisperq_usage_in_flight_audio_seconds", alice)][0] == FOX_SECONDS
    assert samples[("whisperq_usage_in_flight_audio_seconds", bob)][0] == FOX_SECONDS
    assert samples[("whisperq_usage_jobs", ops)][0] == 0  # a key with no jobs has its series too
    assert samples[("whisperq_quota_audio_seconds", bob)][0] == 7200.0  # batch has a quota, standard none
    assert ("whisperq_quota_audio_seconds", alice) not in samples


def test_over_the_quota_429_with_the_reset_time_and_nothing_stored_or_enqueued(
    settings, tmp_path, monkeypatch, database
):
    from models.jobs.operations import fail_job

    # Room for two uploads and a half: the third does not fit.
    door = door_for(settings, tmp_path, monkeypatch, quota_hours_standard=2.5 * FOX_SECONDS / 3600)
    alice, client = door.token("alice"), door.client
    first, second = (upload(client, token=alice) for _ in range(2))
    assert first.status_code == second.status_code == 202
    files, jobs, sent = stored_files(settings), job_count(door.rt), list(door.published)

    refused = upload(client, token=alice)
    assert refused.status_code == 429, refused.get_json()
    error = refused.get_json()["error"]
    now = datetime.now(UTC)
    resets = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
    assert error["code"] == "quota_exceeded"
    assert error["quota"] == {
        "tier": "standard",
        "audio_hours": 2.5 * FOX_SECONDS / 3600,
        "audio_seconds": 10.75,
        "month": now.strftime("%Y-%m"),
        "used_audio_seconds": 0.0,
        "in_flight_audio_seconds": 8.6,
        "remaining_audio_seconds": 2.15,
        "requested_audio_seconds": 4.3,
        "resets_at": resets.isoformat().replace("+00:00", "Z"),
    }
    assert "WHISPERQ_QUOTA_HOURS_STANDARD" in error["message"] and "resets at" in error["message"]
    assert abs(int(refused.headers["Retry-After"]) - (resets - now).total_seconds()) <= 5
    # By URL (counted at WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS until fetched), by re-run, and the OpenAI way: refused too.
    assert (
        client.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/a.flac"}, headers=bearer(alice)).status_code
        == 429
    )
    rerun = client.post(f"/v1/jobs/{first.get_json()['job_id']}/rerun", json={}, headers=bearer(alice))
    assert rerun.status_code == 429 and rerun.get_json()["error"]["code"] == "quota_exceeded"
    openai = upload(client, token=alice, path="/v1/audio/transcriptions", model="whisper-1")
    assert openai.status_code == 429, openai.get_json()
    assert openai.get_json()["error"]["type"] == "insufficient_quota" and openai.headers["Retry-After"]
    assert openai.get_json()["error"]["quota"]["remaining_audio_seconds"] == 2.15
    assert stored_files(settings) == files and job_count(door.rt) == jobs and door.published == sent
    # Other keys and tiers are not held to alice's quota.
    assert upload(client, token=door.token("bob")).status_code == 202

    # A failed job gives its seconds back: one more fits.
    fail_job(door.rt, first.get_json()["job_id"], "the audio could not be decoded")
    assert upload(client, token=alice).status_code == 202


def test_a_spent_quota_is_refused_before_the_upload_is_read_and_a_retry_still_gets_its_job(
    settings, tmp_path, monkeypatch, database
):
    door = door_for(settings, tmp_path, monkeypatch, quota_hours_standard=2 * FOX_SECONDS / 3600)
    alice, client = door.token("alice"), door.client
    headers = {**bearer(alice), "Idempotency-Key": "the-second"}
    assert upload(client, token=alice).status_code == 202
    second = upload(client, headers=headers)
    assert second.status_code == 202
    # Nothing is left: a body that is not even audio is refused for the quota, unread (not 415).
    spent = upload(client, token=alice, data=b"not audio at all")
    assert spent.status_code == 429 and spent.get_json()["error"]["quota"]["remaining_audio_seconds"] == 0.0
    assert spent.get_json()["error"]["quota"]["requested_audio_seconds"] is None
    # The client retries the second upload with its Idempotency-Key: it gets its job, not a 429.
    retried = upload(client, headers=headers)
    assert retried.status_code == 200 and retried.get_json()["job_id"] == second.get_json()["job_id"]


def test_two_uploads_racing_for_the_last_seconds_do_not_both_pass(settings, tmp_path, monkeypatch, database):
    """Both pass the check before storing (room for one), then both rows go in before either
    checks again: each counts the other, so neither passes (the safe side), both are told to
    try again in a second, and neither leaves anything behind. One alone then gets in."""
    from models.pipeline import intake as the_door

    door = door_for(settings, tmp_path, monkeypatch, quota_hours_standard=1.5 * FOX_SECONDS / 3600)
    real, together = the_door.create_job, threading.Barrier(2, timeout=30)

    def in_step(*args, **kwargs):
        together.wait()  # both have passed the first check
        job = real(*args, **kwargs)
        together.wait()  # both rows are in
        return job

    monkeypatch.setattr(the_door, "create_job", in_step)
    files, answers = stored_files(settings), []
    clients = [door.app.test_client() for _ in range(2)]
    threads = [
        threading.Thread(target=lambda c=c: answers.append(upload(c, token=door.token("alice")))) for c in clients
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(a.status_code for a in answers) == [429, 429], [a.get_json() for a in answers]
    for answer in answers:
        assert answer.headers["Retry-After"] == "1" and "same moment" in answer.get_json()["error"]["message"]
    assert stored_files(settings) == files and job_count(door.rt) == 0 and door.published == []
    monkeypatch.setattr(the_door, "create_job", real)
    assert upload(door.client, token=door.token("alice")).status_code == 202
    assert upload(door.client, token=door.token("alice")).status_code == 429


def test_many_racing_submissions_never_pass_the_quota(settings, tmp_path, monkeypatch, database):
    """Sixteen threads submit by the models' own functions at once, with room for five: at most
    five get in, every one refused is withdrawn, and one by one the rest of the room fills."""
    from models.access import quotas

    door = door_for(settings, tmp_path, monkeypatch, quota_hours_standard=5 * FOX_SECONDS / 3600)
    owner, start, admitted, refused = door.id("alice"), threading.Barrier(16, timeout=30), [], []

    def submit():
        start.wait()
        try:
            quotas.check(door.rt, owner, FOX_SECONDS)
            job = make_job(
                door.rt, None, filename="fox.flac", duration=FOX_SECONDS, language=None, priority="normal", owner=owner
            )
            quotas.confirm_or_withdraw(door.rt, job)
            admitted.append(job.id)
        except quotas.QuotaExceeded:
            refused.append(1)

    threads = [threading.Thread(target=submit) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(admitted) + len(refused) == 16 and len(admitted) <= 5
    assert job_count(door.rt) == len(admitted)  # the refused left no row
    start = threading.Barrier(1)
    while True:
        refused.clear()
        submit()
        if refused:
            break
    assert job_count(door.rt) == len(admitted) == 5


def test_the_month_boundary_with_now_passed_in(settings, tmp_path, monkeypatch, database):
    """A job a millisecond before midnight UTC on the last of January is January's; one at
    midnight is February's: per day, per month, and against each month's quota, which resets
    at the first of the next month (and at the new year in December)."""
    from models.access import quotas
    from models.access.billing import usage_report
    from models.access.usage import next_month
    from models.jobs.operations import complete_job
    from models.jobs.record import Job

    door = door_for(settings, tmp_path, monkeypatch, quota_hours_standard=6.0 / 3600)  # 6 s a month
    rt, owner = door.rt, door.id("alice")
    january = datetime(2026, 1, 31, 23, 59, 59, 999000, tzinfo=UTC)
    february = datetime(2026, 2, 1, tzinfo=UTC)

    def job_at(when: datetime, seconds: float, done: bool = True) -> str:
        job = make_job(rt, None, filename="a.flac", duration=seconds, language=None, priority="normal", owner=owner)
        with rt.db.session() as session:
            session.execute(update(Job).where(Job.id == job.id).values(created_at=when))
        if done:
            complete_job(rt, job.id, {"text": "x", "language": "en", "segments": [], "duration": None})
        return job.id

    job_at(january, 4.0)
    job_at(february, 1.5)
    job_at(february + timedelta(hours=5), 1.0, done=False)
    jan, feb = (
        usage_report(rt, first, last, owner=owner, now=now)["keys"][0]
        for first, last, now in (
            (date(2026, 1, 1), date(2026, 1, 31), january),
            (date(2026, 2, 1), date(2026, 2, 28), february),
        )
    )
    assert [(d["date"], d["jobs"], d["audio_seconds"]) for d in jan["days"]] == [("2026-01-31", 1, 4.0)]
    assert [(d["date"], d["jobs"], d["audio_seconds"], d["in_flight_audio_seconds"]) for d in feb["days"]] == [
        ("2026-02-01", 1, 1.5, 1.0)
    ]
    assert jan["quota"] == {
        "tier": "standard",
        "audio_hours": 6.0 / 3600,
        "audio_seconds": 6.0,
        "month": "2026-01",
        "used_audio_seconds": 4.0,
        "in_flight_audio_seconds": 0.0,
        "remaining_audio_seconds": 2.0,
        "resets_at": "2026-02-01T00:00:00Z",
    }
    assert (feb["quota"]["used_audio_seconds"], feb["quota"]["in_flight_audio_seconds"]) == (1.5, 1.0)
    # 4.3 s do not fit in January's last millisecond; they fit at midnight, with February's 3.5 s left.
    with pytest.raises(quotas.QuotaExceeded) as late:
        quotas.check(rt, owner, 4.3, now=january)
    assert late.value.retry_after == 1 and late.value.details["quota"]["resets_at"] == "2026-02-01T00:00:00Z"
    with pytest.raises(quotas.QuotaExceeded):
        quotas.check(rt, owner, 3.6, now=february)
    quotas.check(rt, owner, 3.5, now=february)
    before = february - timedelta(hours=1)
    with pytest.raises(quotas.QuotaExceeded) as hour:
        quotas.check(rt, owner, 2.5, now=before)
    assert hour.value.retry_after == 3600
    assert next_month(datetime(2026, 12, 31, 23, 0, tzinfo=UTC)) == datetime(2027, 1, 1, tzinfo=UTC)
    # The door's second check counts the job against the month it was made in.
    late_job = make_job(rt, None, filename="b.flac", duration=2.5, language=None, priority="normal", owner=owner)
    with rt.db.session() as session:
        session.execute(update(Job).where(Job.id == late_job.id).values(created_at=january))
    late_job.created_at = january
    with pytest.raises(quotas.QuotaExceeded):
        quotas.confirm_or_withdraw(rt, late_job, now=january)
    with rt.db.session() as session:
        assert session.get(Job, late_job.id) is None  # withdrawn


@pytest.mark.parametrize(
    "value, words", [("abc", "not a number of hours"), ("0", "above 0"), ("-2", "above 0"), ("inf", "above 0")]
)
def test_quota_settings_are_hours_or_off(tmp_path, value, words):
    from config import ConfigError, Settings

    base = {"WHISPERQ_DATA_DIR": str(tmp_path)}
    assert Settings.from_env(base).quota_hours_standard is None  # off by default
    on = Settings.from_env({**base, "WHISPERQ_QUOTA_HOURS_BATCH": "0.5", "WHISPERQ_QUOTA_HOURS_PREMIUM": "off"})
    assert (on.quota_hours_batch, on.quota_hours_premium) == (0.5, None)
    with pytest.raises(ConfigError) as err:
        Settings.from_env({**base, "WHISPERQ_QUOTA_HOURS_STANDARD": value})
    assert "WHISPERQ_QUOTA_HOURS_STANDARD" in str(err.value) and words in str(err.value)


@pytest.mark.integration
def test_a_transcribed_upload_is_billed_its_decoded_length(settings, database, worker, celery_app):
    """Through the real pools: the job's billed audio is the length the preparation pool decoded."""
    from api import wait_for_job

    from models.access.apikeys import create_key
    from web import create_app

    app = create_app(
        {"SETTINGS": dataclasses.replace(settings, allow_anonymous=False, rate_limit_standard=None), "TESTING": True}
    )
    record, token = create_key(app.extensions["whisperq"], "billed-e2e", "standard")
    client = app.test_client()
    client.environ_base["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    created = upload(client, token=None)
    assert created.status_code == 202, created.get_json()
    done = wait_for_job(client, created.get_json()["job_id"])
    assert done["status"] == "COMPLETED"
    [mine] = client.get("/v1/usage").get_json()["keys"]
    assert mine["key_id"] == record.id
    assert mine["total"] == {
        "jobs": 1,
        "audio_seconds": done["audio_duration"],
        "in_flight_jobs": 0,
        "in_flight_audio_seconds": 0.0,
        "unbilled_jobs": 0,
    }
    assert math.isclose(done["audio_duration"], FOX_SECONDS, abs_tol=0.1)


def test_usage_and_the_quota_refusal_conform_to_the_openapi_document(settings, tmp_path, monkeypatch, database):
    import schemathesis

    door = door_for(settings, tmp_path, monkeypatch, quota_hours_standard=FOX_SECONDS / 3600)
    api = schemathesis.openapi.from_wsgi("/openapi.json", door.app)
    assert upload(door.client, token=door.token("alice")).status_code == 202
    refused = upload(door.client, token=door.token("alice"))
    assert refused.status_code == 429
    api["/v1/jobs"]["POST"].validate_response(refused)
    for token in (door.token("alice"), "test-admin-token"):
        resp = door.usage(token)
        assert resp.status_code == 200
        api["/v1/usage"]["GET"].validate_response(resp)
    api["/v1/usage"]["GET"].validate_response(door.usage(door.token("bob"), "?from=x"))


def test_a_url_job_is_let_in_at_the_estimate_and_measured_at_its_fetch(settings, tmp_path, monkeypatch, database):
    """A job by URL holds WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS until the preparation pool
    fetches it. Longer than what its key's month has left, or than its tier's longest audio,
    it FAILS at the fetch saying which, billed nothing; one that fits is prepared as usual."""
    from helpers import Receiver
    from test_webhooks import make_settings

    from models.errors import PermanentJobError
    from models.jobs.operations import get_job
    from models.pipeline.preparation import prepare_job
    from models.speech import audio

    report = CLIPS["report.opus"]["path"]
    report_seconds = audio.probe(str(report)).duration
    assert report_seconds > 2 * FOX_SECONDS
    door = door_for(
        settings,
        tmp_path,
        monkeypatch,
        quota_hours_standard=(FOX_SECONDS + 1.0) / 3600,
        url_audio_estimate_seconds=1.0,
        max_audio_seconds_batch=FOX_SECONDS + 1.0,
        fetch_allow=make_settings(tmp_path).fetch_allow,
    )
    routes = {
        "/report.opus": (200, {"Content-Type": "audio/ogg"}, report.read_bytes()),
        "/fox.flac": (200, {"Content-Type": "audio/flac"}, FOX),
    }
    with Receiver(routes) as server:

        def by_url(who: str, path: str) -> str:
            resp = door.client.post("/v1/jobs", json={"audio_url": server.url(path)}, headers=bearer(door.token(who)))
            assert resp.status_code == 202, resp.get_json()  # at the door it counts as 1 s
            return resp.get_json()["job_id"]

        too_long_for_quota, too_long_for_tier = by_url("alice", "/report.opus"), by_url("bob", "/report.opus")
        held = door.usage(door.token("alice")).get_json()["keys"][0]["total"]
        assert (held["in_flight_jobs"], held["in_flight_audio_seconds"]) == (1, 1.0)
        with pytest.raises(PermanentJobError, match="monthly audio quota"):
            prepare_job(door.rt, too_long_for_quota, "")
        with pytest.raises(PermanentJobError, match=f"longer than the limit of {FOX_SECONDS + 1.0:.0f} s"):
            prepare_job(door.rt, too_long_for_tier, "")
        fits = by_url("alice", "/fox.flac")
        prepared = prepare_job(door.rt, fits, "")
    failed = get_job(door.rt, too_long_for_quota)
    assert failed.status == "FAILED" and f"is {report_seconds:.1f} s long" in failed.error, failed.error
    assert "5.3 s left" in failed.error and "nothing was billed" in failed.error
    assert get_job(door.rt, too_long_for_tier).status == "FAILED"
    assert prepared.duration == pytest.approx(FOX_SECONDS, abs=0.05)
    total = door.usage(door.token("alice")).get_json()["keys"][0]["total"]
    assert (total["jobs"], total["audio_seconds"], total["unbilled_jobs"]) == (0, 0.0, 1)
    assert total["in_flight_audio_seconds"] == pytest.approx(prepared.duration, abs=0.001)
