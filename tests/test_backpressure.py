"""The front door under load: the queue budget with its high-priority reserve, the disk
floor, per-client rate limits in Redis, and readiness."""

import dataclasses
import time
import uuid

import pytest
from api import upload
from helpers import need_service, stored_files, wait_until


@pytest.fixture()
def no_cache(monkeypatch):
    from models.access import admission

    monkeypatch.setattr(admission, "_CACHE_SECONDS", 0.0)


def app_with(settings, **changes):
    from web import create_app

    return create_app({"SETTINGS": dataclasses.replace(settings, **changes), "TESTING": True})


@pytest.mark.integration
@pytest.mark.brokers
def test_past_the_budget_429_with_retry_after_high_keeps_a_reserve_and_it_reopens_after_the_drain(
    settings, database, worker, celery_app, no_cache
):
    from models.access.admission import backlog
    from models.runtime import get_runtime

    with worker.paused(celery_app):
        # What the pools took before the pause moves out of the backlog as it runs: let it.
        wait_until(lambda: not worker.held(celery_app), 120, "the pools still run jobs taken before the pause")
        base = backlog(get_runtime()).jobs  # whatever else waits in this database
        # Room for three more normal jobs, and one more high one in the reserve.
        budget = base + 4
        client = app_with(
            settings, queue_budget_jobs=budget, high_reserve=0.5 / budget, queue_budget_seconds=10**9
        ).test_client()
        accepted = [upload(client, priority="normal") for _ in range(3)]
        assert [r.status_code for r in accepted] == [202] * 3
        full = upload(client, priority="normal")
        assert full.status_code == 429, full.get_json()
        body = full.get_json()["error"]
        assert body["code"] == "queue_full" and "try again in" in body["message"] and "priority high" in body["message"]
        assert 1 <= int(full.headers["Retry-After"]) <= 3600
        assert upload(client, priority="high").status_code == 202  # the reserve
        assert upload(client, priority="high").status_code == 429  # past the whole budget
        assert upload(client, priority="low").status_code == 429
    # The pools drain the queue; the door opens again.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        resp = upload(client, priority="normal")
        if resp.status_code == 202:
            break
        assert resp.status_code == 429
        time.sleep(1)  # paces the client's tries, as a client told 429 does: the loop waits for a 202
    assert resp.status_code == 202


def test_below_the_disk_floor_503_and_nothing_is_stored(settings, database, published):
    client = app_with(settings, disk_floor_mb=10**9).test_client()
    before = stored_files(settings)
    resp = upload(client, priority="normal")
    assert resp.status_code == 503 and resp.get_json()["error"]["code"] == "disk_full"
    assert "disk space" in resp.get_json()["error"]["message"] and resp.headers["Retry-After"]
    assert stored_files(settings) == before and published == []
    ready = client.get("/readyz")
    assert ready.status_code == 503 and "WHISPERQ_DISK_FLOOR_MB" in ready.get_json()["checks"]["disk"]


def redis_for_limits(settings) -> str:
    if (settings.broker_url or "").startswith("redis"):
        return settings.broker_url
    url = "redis://127.0.0.1:6379/14"
    import redis

    try:
        redis.Redis.from_url(url, socket_timeout=2).ping()
    except Exception as exc:
        need_service(f"no Redis for the rate limiter at {url}: {exc}")
    return url


def test_per_client_rate_limit_with_ratelimit_headers(settings, database, published):
    app = app_with(settings, rate_limit="3/minute", redis_url=redis_for_limits(settings))
    me, other = (app.test_client() for _ in range(2))
    me.environ_base["REMOTE_ADDR"] = f"127.0.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250 + 1}"
    other.environ_base["REMOTE_ADDR"] = "127.0.255.254"
    answers = [upload(me, priority="normal", token=uuid.uuid4().hex) for _ in range(3)]
    assert [r.status_code for r in answers] == [202] * 3
    assert [r.headers["RateLimit-Remaining"] for r in answers] == ["2", "1", "0"]
    assert answers[0].headers["RateLimit-Limit"] == "3" and answers[0].headers["RateLimit-Policy"] == "3;w=60"
    # A new random bearer each time is still the same anonymous client: its address's count.
    refused = upload(me, priority="normal", token=uuid.uuid4().hex)
    assert refused.status_code == 429 and refused.get_json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused.headers["Retry-After"]) <= 60 and refused.headers["RateLimit-Remaining"] == "0"
    assert len(published) == 3  # the refused one was not enqueued
    assert upload(other, priority="normal").status_code == 202  # another address has its own count


def test_the_rate_limiter_counts_in_windows(monkeypatch):
    import fakeredis

    from models.access import admission

    clock = [1_000_000.0]
    monkeypatch.setattr(admission.time, "time", lambda: clock[0])
    limiter = admission.RateLimiter(fakeredis.FakeRedis(), limit=2, window=60)
    limiter.hit("a"), limiter.hit("a")
    with pytest.raises(admission.RateLimited) as refused:
        limiter.hit("a")
    assert refused.value.retry_after == 20  # 1,000,000 s is 40 s into its minute
    assert limiter.hit("b")["RateLimit-Remaining"] == "1"
    clock[0] += 20
    assert limiter.hit("a")["RateLimit-Remaining"] == "1"  # a new window


@pytest.mark.integration
@pytest.mark.brokers
def test_readyz_goes_503_with_the_broker_stopped_and_recovers(broker_stack):
    seen, client = {}, broker_stack.client

    def while_down():
        resp = client.get("/readyz")
        seen["status"], seen["checks"] = resp.status_code, resp.get_json()["checks"]

    broker_stack.restart(down=1.0, during=while_down)
    assert seen["status"] == 503 and seen["checks"]["broker"].startswith("unreachable"), seen
    assert seen["checks"]["database"] == "ok"
    wait_until(lambda: client.get("/readyz").status_code == 200, 60, "/readyz did not recover")


def test_readyz_wants_a_live_inference_worker_after_the_grace(client, monkeypatch):
    from web import health

    monkeypatch.setattr(health, "_started", time.monotonic() - health.STARTUP_GRACE - 1)
    monkeypatch.setattr("models.jobs.workers.alive", lambda rt, pool=None, now=None: [])
    resp = client.get("/readyz")
    assert resp.status_code == 503 and resp.get_json()["checks"]["inference_workers"].startswith("none alive")


def test_one_key_cannot_fill_the_queue_and_url_jobs_count_at_the_estimate_until_fetched(
    settings, tmp_path, monkeypatch, no_cache
):
    """WHISPERQ_QUEUE_KEY_SHARE: a key past its share of the budget gets 429 while another key
    and anonymous use still get in; a URL job, its length unknown until fetched, counts at
    WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS, then at its real length. Its own database, so the
    backlog is only this test's."""
    from models.access.apikeys import create_key
    from tasks.broker import CeleryBroker

    sent = []
    monkeypatch.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: sent.append(job.id))
    app = app_with(
        settings,
        database_url=f"sqlite:///{tmp_path / 'door.db'}",
        queue_budget_jobs=10,
        queue_budget_seconds=10**6,
        high_reserve=0.0,
        queue_key_share=0.3,
        max_audio_seconds=3600.0,
    )
    rt = app.extensions["whisperq"]
    flood, other = (create_key(rt, name, "premium")[1] for name in ("flood", "other"))
    client = app.test_client()

    assert [upload(client, priority="normal", token=flood).status_code for _ in range(3)] == [202] * 3
    refused = upload(client, priority="normal", token=flood)
    assert refused.status_code == 429, refused.get_json()
    message = refused.get_json()["error"]["message"]
    assert "this API key has 3 jobs" in message and "WHISPERQ_QUEUE_KEY_SHARE" in message
    assert int(refused.headers["Retry-After"]) >= 1
    assert upload(client, priority="high", token=flood).status_code == 429  # the share holds for every priority
    assert upload(client, priority="normal", token=other).status_code == 202  # others still get in
    assert (
        upload(client, priority="normal").status_code == 202
    )  # and anonymous use, bounded by its per-address rate instead
    assert len(sent) == 5

    # By URL: 1800 s each until fetched (not the 3600 s they may be), against a budget of 3 h.
    urls = app_with(
        settings,
        database_url=f"sqlite:///{tmp_path / 'urls.db'}",
        queue_budget_jobs=1000,
        queue_budget_seconds=3 * 3600.0,
        high_reserve=0.0,
        max_audio_seconds=3600.0,
        url_audio_estimate_seconds=1800.0,
    )
    tight = urls.test_client()
    answers = [tight.post("/v1/jobs", json={"audio_url": f"http://127.0.0.1:9/{n}.flac"}) for n in range(7)]
    assert [a.status_code for a in answers] == [202] * 6 + [429], [a.get_json() for a in answers]
    assert "6 jobs with 10800 s of audio are waiting" in answers[-1].get_json()["error"]["message"]
    # Fetched, each counts at its real length: two short ones leave room for another.
    from sqlalchemy import update

    from models.jobs.record import Job

    with urls.extensions["whisperq"].db.session() as session:
        session.execute(
            update(Job).where(Job.id.in_([a.get_json()["job_id"] for a in answers[:2]])).values(audio_duration=60.0)
        )
    assert tight.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/next.flac"}).status_code == 202
