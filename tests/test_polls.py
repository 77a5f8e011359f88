"""Status polls: an unchanged job is answered from memory (web.statuscache) without letting one
key read another's job, a client polling faster than Retry-After is told to slow down
(web.pollrate), and `?wait=N` without If-None-Match waits for a change."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from api import bearer
from helpers import free_port, make_job, wait_until
from sqlalchemy import event, text


def build(settings, **changes):
    from web import create_app

    return create_app({"SETTINGS": dataclasses.replace(settings, **changes), "TESTING": True})


@pytest.fixture()
def secure(settings, database):
    """Keys needed (anonymous use off); the poll limit off unless a test turns it on."""
    return build(settings, allow_anonymous=False, poll_limit=False)


@pytest.fixture()
def keys(secure):
    from models.access.apikeys import create_key

    rt = secure.extensions["whisperq"]
    return {name: create_key(rt, f"{name}-polls", "standard", admin=name == "ops") for name in ("alice", "bob", "ops")}


def pending(rt, owner=None):
    return make_job(rt, None, filename="a.mp3", duration=11.0, language=None, priority="normal", owner=owner)


@pytest.fixture()
def queries(secure):
    """The SQL statements run by this thread (the test client's requests), not by the reader."""
    seen: list[str] = []
    me = threading.get_ident()

    def record(_conn, _cursor, statement, *_args):
        if threading.get_ident() == me:
            seen.append(statement)

    engine = secure.extensions["whisperq"].db.engine
    event.listen(engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine, "before_cursor_execute", record)


def test_an_unchanged_job_is_answered_from_memory(secure, keys, queries):
    rt = secure.extensions["whisperq"]
    alice = bearer(keys["alice"][1])
    job = pending(rt, keys["alice"][0].id)
    client = secure.test_client()
    first = client.get(f"/v1/jobs/{job.id}", headers=alice)
    assert first.status_code == 200 and first.json["status"] == "PENDING"
    assert any("api_keys" in q for q in queries) and any("jobs.id = " in q for q in queries)  # built once

    queries.clear()
    again = client.get(f"/v1/jobs/{job.id}", headers={**alice, "If-None-Match": first.headers["ETag"]})
    same = client.get(f"/v1/jobs/{job.id}", headers=alice)
    assert again.status_code == 304 and again.data == b"" and again.headers["ETag"] == first.headers["ETag"]
    assert again.headers["Retry-After"] == first.headers["Retry-After"]
    assert same.status_code == 200 and same.json == first.json and same.headers["ETag"] == first.headers["ETag"]
    # Neither the key nor the job was read again (at most the queue's snapshot, once a second).
    assert not [q for q in queries if "api_keys" in q or "jobs.id = " in q], queries


def test_the_cache_answers_no_other_key(secure, keys):
    rt = secure.extensions["whisperq"]
    job = pending(rt, keys["alice"][0].id)
    client = secure.test_client()
    mine = client.get(f"/v1/jobs/{job.id}", headers=bearer(keys["alice"][1]))
    assert mine.status_code == 200
    for tag in ({}, {"If-None-Match": mine.headers["ETag"]}):  # the job is cached now
        other = client.get(f"/v1/jobs/{job.id}", headers={**bearer(keys["bob"][1]), **tag})
        assert other.status_code == 404 and other.json["error"]["message"] == f"no job with id {job.id!r}"
        assert job.id not in other.get_data(as_text=True).replace(f"no job with id {job.id!r}", "")
        assert client.get(f"/v1/jobs/{job.id}", headers=tag).status_code == 401  # no key at all
    assert client.get(f"/v1/jobs/{job.id}", headers=bearer(keys["ops"][1])).status_code == 200  # an admin key


def test_a_revoked_key_and_a_change_in_this_process_show_at_once(secure, keys):
    from models.access.apikeys import revoke_key
    from models.jobs.operations import cancel_job

    rt = secure.extensions["whisperq"]
    alice = bearer(keys["alice"][1])
    job = pending(rt, keys["alice"][0].id)
    client = secure.test_client()
    tag = client.get(f"/v1/jobs/{job.id}", headers=alice).headers["ETag"]
    cancel_job(rt, job.id)
    now = client.get(f"/v1/jobs/{job.id}", headers={**alice, "If-None-Match": tag})
    assert now.status_code == 200 and now.json["status"] == "CANCELLED"
    revoke_key(rt, keys["alice"][0].id)
    assert client.get(f"/v1/jobs/{job.id}", headers=alice).status_code == 401


def test_a_change_made_elsewhere_shows_within_a_step(secure, keys):
    """A worker (another process) changes the row: no flush here tells the cache, the reader does."""
    rt = secure.extensions["whisperq"]
    alice = bearer(keys["alice"][1])
    job = pending(rt, keys["alice"][0].id)
    client = secure.test_client()
    assert client.get(f"/v1/jobs/{job.id}", headers=alice).json["status"] == "PENDING"
    with rt.db.engine.begin() as conn:  # as another process would: around this process's sessions
        conn.execute(text("UPDATE jobs SET status = 'PROCESSING', stage = 'infer' WHERE id = :id"), {"id": job.id})
    wait_until(
        lambda: client.get(f"/v1/jobs/{job.id}", headers=alice).json["status"] == "PROCESSING",
        10,
        "the cached PENDING answer was not replaced",
    )


def test_a_poller_faster_than_retry_after_gets_429(settings, database):
    from web.pollrate import GRACE

    app = build(settings, poll_limit=True)
    rt = app.extensions["whisperq"]
    job, other = pending(rt), pending(rt)
    client = app.test_client()
    answers = [client.get(f"/v1/jobs/{job.id}") for _ in range(GRACE + 1)]
    assert [a.status_code for a in answers] == [200] * GRACE + [429]
    slow_down = answers[-1]
    assert slow_down.headers["Retry-After"] == answers[0].headers["Retry-After"]
    error = slow_down.json["error"]
    assert error["code"] == "rate_limited"
    assert f"every {answers[0].headers['Retry-After']} s" in error["message"] and "?wait=" in error["message"]
    assert client.get(f"/v1/jobs/{other.id}").status_code == 200  # per job
    assert client.get(f"/v1/jobs/{job.id}", environ_base={"REMOTE_ADDR": "10.1.2.3"}).status_code == 200  # per client


@pytest.mark.parametrize(
    ("stage", "field", "seconds", "expected"),
    [
        ("infer", "estimated_finish_at", 20, 10),  # transcribed: half the way to its finish, not every second
        ("infer", "estimated_finish_at", -5, 1),  # late: every second
        ("infer", None, None, 1),  # no estimate while transcribed: progress moves window by window
        ("prepare", "estimated_start_at", 12, 6),
        ("prepare", "estimated_finish_at", 12, 5),  # waiting: its start counts, not its finish
        (None, "estimated_start_at", 600, 30),  # at most 30 s
        (None, None, None, 5),
    ],
)
def test_retry_after_is_half_the_wait_to_the_next_estimated_moment(stage, field, seconds, expected):
    """While it is transcribed, as while it waits, polls close in on the moment the estimates
    name: a long recording transcribed for minutes was polled every second."""
    from datetime import UTC, datetime, timedelta

    from models.jobs.record import Job
    from web.api import poll_after

    body = {}
    if field:
        # a second more, as the time it is read at has moved on by then
        at = datetime.now(UTC) + timedelta(seconds=seconds + (1 if seconds > 0 else 0))
        body[field] = at.isoformat().replace("+00:00", "Z")
    assert poll_after(Job(id="j", audio_ref="a", priority="normal", stage=stage), body) == expected


def test_a_too_early_poll_is_held_until_its_next_read_was_due():
    """The 429 waits (under gevent) for when the read would have been allowed: a client that
    ignores Retry-After is paced all the same, at no cost to the web while it waits."""
    from web.pollrate import GRACE, HOLD, PollRate, PollTooFast

    held: list[float] = []
    pace = PollRate(hold=held.append)
    for _ in range(GRACE):
        pace.take("addr:10.0.0.1", "job", "s1", 8)
    assert held == []
    with pytest.raises(PollTooFast) as refused:
        pace.take("addr:10.0.0.1", "job", "s1", 8)
    assert refused.value.retry_after == 8 and len(held) == 1 and 7.0 < held[0] <= 8.0
    with pytest.raises(PollTooFast):
        pace.take("addr:10.0.0.1", "job", "s1", 60)  # never longer than HOLD
    assert held[1] == HOLD
    pace.take("addr:10.0.0.2", "job", "s1", 8)  # another client's bucket
    assert len(held) == 2


def test_only_reads_that_bring_nothing_new_are_counted():
    """Grace spent, a read answered with a state this client has not been answered with is
    let through at once (the job moved); the same state again is refused; a hold that ends
    because the job changed lets the read through."""
    from web.pollrate import GRACE, PollRate, PollTooFast

    pace = PollRate(hold=lambda seconds: None)
    for _ in range(GRACE):
        pace.take("addr:10.0.0.1", "job", "s1", 8)
        pace.answered("addr:10.0.0.1", "job", "s1")
    with pytest.raises(PollTooFast):
        pace.take("addr:10.0.0.1", "job", "s1", 8)
    assert pace.take("addr:10.0.0.1", "job", "s2", 8) is False  # news: not counted, not held
    pace.answered("addr:10.0.0.1", "job", "s2")
    with pytest.raises(PollTooFast):
        pace.take("addr:10.0.0.1", "job", "s2", 8)
    woken = PollRate(hold=lambda seconds: True)
    for _ in range(GRACE):
        woken.take("addr:10.0.0.1", "job", "s1", 8)
    assert woken.take("addr:10.0.0.1", "job", "s1", 8) is True  # held, and the job changed meanwhile


def test_a_held_poll_is_answered_when_the_job_changes(settings, database, monkeypatch):
    """Under gevent a too-early poll waits for its due time or for a change of the job,
    whichever comes first: a change answers it with the job as it is now, not a 429."""
    from models.jobs.record import Job
    from web import pollrate
    from web.api import _watch
    from web.pollrate import GRACE

    monkeypatch.setattr(pollrate, "cooperative", lambda: True)  # holds as under gevent (here a thread waits)
    app = build(settings, poll_limit=True)
    rt = app.extensions["whisperq"]
    job = pending(rt)
    client = app.test_client()
    assert [client.get(f"/v1/jobs/{job.id}").status_code for _ in range(GRACE)] == [200] * GRACE
    answer: dict = {}
    asking = threading.Thread(target=lambda: answer.update(resp=client.get(f"/v1/jobs/{job.id}")))
    asking.start()
    wait_until(lambda: (id(rt), job.id) in _watch._waiting, 10, "the too-early poll was not held")
    with rt.db.session(write=True) as session:
        session.get(Job, job.id).start("w")
    asking.join(20)
    assert not asking.is_alive(), "the hold did not end with the change"
    assert answer["resp"].status_code == 200 and answer["resp"].json["status"] == "PROCESSING"


def test_a_long_poll_loop_with_a_stale_etag_is_paced(settings, database):
    """A client that keeps sending the ETag it saw first with ?wait= is answered at once each
    time (the job changed since), with nothing new after the first: paced like any poll,
    not a loop without pause."""
    from models.jobs.record import Job
    from web.pollrate import GRACE

    app = build(settings, poll_limit=True)
    rt = app.extensions["whisperq"]
    job = pending(rt)
    client = app.test_client()
    stale = client.get(f"/v1/jobs/{job.id}").headers["ETag"]
    with rt.db.session(write=True) as session:
        session.get(Job, job.id).progress_seconds = 1.0
    codes = [
        client.get(f"/v1/jobs/{job.id}?wait=30", headers={"If-None-Match": stale}).status_code for _ in range(GRACE + 1)
    ]
    assert codes[0] == 200 and codes[-1] == 429, codes


@pytest.mark.timeout(120)
def test_the_gevent_web_holds_a_too_early_poll(settings, database):
    """gunicorn's gevent worker, as the Procfile runs it: the first 429 comes no earlier than
    the bucket's first read plus the job's Retry-After, though it was asked for at once."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import requests

    from web.pollrate import GRACE

    rt = build(settings, poll_limit=True).extensions["whisperq"]
    job = pending(rt)
    port = free_port()
    root = Path(__file__).resolve().parent.parent
    web = subprocess.Popen(
        [
            *(str(Path(sys.executable).parent / "gunicorn"), "--bind", f"127.0.0.1:{port}", "--workers", "1"),
            *("--worker-class", "web.server.JSONErrorGeventWorker", "web.wsgi:app"),
        ],
        cwd=root,
        env={**os.environ, "WHISPERQ_POLL_LIMIT": "true"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def up() -> bool:
            assert web.poll() is None, web.stderr.read() if web.stderr else "gunicorn exited"
            try:
                return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code in (200, 503)
            except requests.ConnectionError:
                return False

        wait_until(up, 60, "the gevent web answered")
        url = f"http://127.0.0.1:{port}/v1/jobs/{job.id}"
        first_at = time.monotonic()
        answers = [requests.get(url, timeout=30) for _ in range(GRACE)]
        assert [a.status_code for a in answers] == [200] * GRACE, [a.text for a in answers]
        interval = int(answers[0].headers["Retry-After"])
        asked_at = time.monotonic()
        refused = requests.get(url, timeout=30)
        answered_at = time.monotonic()
        assert refused.status_code == 429 and refused.headers["Retry-After"] == str(interval), refused.text
        assert asked_at - first_at < interval, "the reads of grace took longer than the interval: nothing to hold"
        assert answered_at - first_at >= interval - 0.05, (answered_at - first_at, interval)
    finally:
        web.terminate()
        web.wait(30)


def test_a_long_poll_that_waits_is_not_counted(settings, database):
    from web.pollrate import GRACE

    app = build(settings, poll_limit=True)
    rt = app.extensions["whisperq"]
    job = pending(rt)
    client = app.test_client()
    tag = client.get(f"/v1/jobs/{job.id}").headers["ETag"]
    for _ in range(GRACE + 1):
        assert client.get(f"/v1/jobs/{job.id}?wait=1", headers={"If-None-Match": tag}).status_code == 304


def test_a_long_poll_told_of_each_change_is_never_paced(settings, database):
    """A job that changes faster than its Retry-After (prepared, queued, transcribed window by
    window, done): each long-poll holding the last ETag is answered at once with the change,
    however many come, never 429 (which would leave the client waiting out a Retry-After)."""
    from models.jobs.record import Job
    from web.pollrate import GRACE

    app = build(settings, poll_limit=True)
    rt = app.extensions["whisperq"]
    job = pending(rt)
    client = app.test_client()
    tag = client.get(f"/v1/jobs/{job.id}").headers["ETag"]
    for step in range(1, GRACE + 4):
        with rt.db.session(write=True) as session:  # as the pools move it on
            session.get(Job, job.id).progress_seconds = float(step)
        answer = client.get(f"/v1/jobs/{job.id}?wait=30", headers={"If-None-Match": tag})
        assert answer.status_code == 200, (step, answer.status_code, answer.get_json())
        assert answer.headers["ETag"] != tag
        tag = answer.headers["ETag"]


def test_wait_without_if_none_match_waits_for_a_change(settings, database):
    from models.jobs.operations import cancel_job
    from web.api import _watch

    app = build(settings, poll_limit=False)
    rt = app.extensions["whisperq"]
    job = pending(rt)
    client = app.test_client()
    answer: dict = {}

    def ask():
        answer["resp"] = client.get(f"/v1/jobs/{job.id}?wait=30")

    asking = threading.Thread(target=ask)
    asking.start()
    wait_until(lambda: (id(rt), job.id) in _watch._waiting, 10, "the request did not wait")
    cancel_job(rt, job.id)
    asking.join(20)
    assert not asking.is_alive(), "the wait did not end with the change"
    assert answer["resp"].status_code == 200 and answer["resp"].json["status"] == "CANCELLED"


def test_wait_without_if_none_match_times_out_with_the_unchanged_body(settings, database):
    app = build(settings, poll_limit=False)
    job = pending(app.extensions["whisperq"])
    client = app.test_client()
    now = client.get(f"/v1/jobs/{job.id}")
    started = time.monotonic()
    later = client.get(f"/v1/jobs/{job.id}?wait=1")
    assert time.monotonic() - started >= 1.0
    assert later.status_code == 200 and later.headers["ETag"] == now.headers["ETag"]
    assert later.json["status"] == "PENDING" and later.json["job_id"] == job.id
