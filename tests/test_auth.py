"""API keys, tiers and isolation: each key sees its own jobs only, a revoked key is
refused, a tier caps the priority, and the web page signs in with a session cookie
whose changes need the CSRF token."""

from __future__ import annotations

import dataclasses
import re

import pytest
from api import bearer, upload


@pytest.fixture()
def secure(settings, database, celery_app):
    """An app that needs a key: anonymous use off, as outside `make run`."""
    from web import create_app

    changes = {"allow_anonymous": False, "metrics_token": "metrics-secret"}
    if not (settings.broker_url or "").startswith("redis"):
        changes["redis_url"] = "redis://127.0.0.1:6379/14"  # tier rate limits count in Redis
    app = create_app({"SETTINGS": dataclasses.replace(settings, **changes), "TESTING": True})
    return app


@pytest.fixture()
def keys(secure):
    from models.access.apikeys import create_key

    rt = secure.extensions["whisperq"]
    made = {}
    for name, tier, admin in (
        ("alice", "premium", False),
        ("bob", "standard", False),
        ("nightly", "batch", False),
        ("ops", "standard", True),
    ):
        made[name] = create_key(rt, f"{name}-test", tier, admin=admin)[1]
    return made


def test_no_key_bad_key_and_revoked_key_get_401(secure, keys):
    from models.access.apikeys import revoke_key

    client = secure.test_client()
    resp = client.get("/v1/jobs")
    assert resp.status_code == 401
    assert "Authorization: Bearer" in resp.json["error"]["message"]
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/v1/jobs", headers={"Authorization": "Basic YWxpY2U6eA=="}).status_code == 401
    unknown = client.get("/v1/jobs", headers=bearer("wq_" + "x" * 43))
    assert unknown.status_code == 401 and "unknown API key" in unknown.json["error"]["message"]
    assert client.get("/v1/jobs", headers=bearer(keys["bob"])).status_code == 200

    revoke_key(secure.extensions["whisperq"], keys["bob"][:12])
    revoked = client.get("/v1/jobs", headers=bearer(keys["bob"]))
    assert revoked.status_code == 401
    assert "revoked" in revoked.json["error"]["message"]
    assert upload(client, token=keys["bob"]).status_code == 401
    # The OpenAI-compatible endpoint refuses it in OpenAI's shape.
    openai = upload(client, filename="f.flac", token=keys["bob"], path="/v1/audio/transcriptions", model="whisper-1")
    assert openai.status_code == 401 and openai.json["error"]["type"] == "authentication_error"


def test_a_key_cannot_read_cancel_delete_or_list_another_keys_jobs(secure, keys):
    client = secure.test_client()
    created = upload(client, token=keys["alice"])
    assert created.status_code == 202, created.json
    job_id = created.json["job_id"]
    bob = bearer(keys["bob"])
    for method, path in (
        ("get", f"/v1/jobs/{job_id}"),
        ("get", f"/v1/jobs/{job_id}/transcript"),
        ("post", f"/v1/jobs/{job_id}/cancel"),
        ("delete", f"/v1/jobs/{job_id}"),
    ):
        resp = getattr(client, method)(path, headers=bob)
        assert resp.status_code == 404, (method, path, resp.status_code)
        assert resp.json["error"]["message"] == f"no job with id {job_id!r}"  # as for an id that never was
    listed = client.get("/v1/jobs?limit=200", headers=bob).json["jobs"]
    assert job_id not in {j["job_id"] for j in listed}
    assert job_id in {j["job_id"] for j in client.get("/v1/jobs?limit=200", headers=bearer(keys["alice"])).json["jobs"]}
    # The job is untouched by bob's attempts, and visible to its owner and to admins.
    assert client.get(f"/v1/jobs/{job_id}", headers=bearer(keys["alice"])).json["status"] in (
        "PENDING",
        "PROCESSING",
        "COMPLETED",
    )
    assert client.get(f"/v1/jobs/{job_id}", headers=bearer(keys["ops"])).status_code == 200
    assert client.get(f"/v1/jobs/{job_id}", headers=bearer("test-admin-token")).status_code == 200
    assert job_id in {j["job_id"] for j in client.get("/v1/jobs?limit=200", headers=bearer(keys["ops"])).json["jobs"]}
    assert client.delete(f"/v1/jobs/{job_id}", headers=bearer(keys["alice"])).status_code == 204


def test_tier_caps_priority_with_a_message(secure, keys, database):
    from models.jobs.record import Job

    client = secure.test_client()
    refused = upload(client, token=keys["nightly"], priority="high")
    assert refused.status_code == 403
    message = refused.json["error"]["message"]
    assert "tier (batch)" in message and "priority low" in message and "not high" in message
    assert upload(client, token=keys["nightly"], priority="normal").status_code == 403
    assert upload(client, token=keys["bob"], priority="high").status_code == 403
    default = upload(client, token=keys["nightly"])  # no priority asked: the tier's own
    assert default.status_code == 202 and default.json["priority"] == "low"
    assert upload(client, token=keys["bob"]).json["priority"] == "normal"
    assert upload(client, token=keys["alice"], priority="high").json["priority"] == "high"
    with database.session() as s:
        assert s.get(Job, default.json["job_id"]).owner is not None
    by_url = client.post(
        "/v1/jobs",
        json={"audio_url": "https://example.com/a.flac", "priority": "high"},
        headers=bearer(keys["nightly"]),
    )
    assert by_url.status_code == 403


def test_tier_rate_limit(settings, database, celery_app):
    from models.access.apikeys import create_key
    from web import create_app

    changes = {"allow_anonymous": False, "rate_limit_batch": "2/minute"}
    if not (settings.broker_url or "").startswith("redis"):
        changes["redis_url"] = "redis://127.0.0.1:6379/14"
    app = create_app({"SETTINGS": dataclasses.replace(settings, **changes), "TESTING": True})
    token = create_key(app.extensions["whisperq"], "limited", "batch")[1]
    client = app.test_client()
    first = upload(client, token=token)
    assert first.status_code == 202 and first.headers["RateLimit-Limit"] == "2"
    assert upload(client, token=token).status_code == 202
    third = upload(client, token=token)
    assert third.status_code == 429 and "Retry-After" in third.headers


def test_idempotency_keys_are_per_api_key(secure, keys):
    client = secure.test_client()
    a = upload(client, token=keys["alice"], headers={"Idempotency-Key": "order-7"})
    b = upload(client, token=keys["bob"], headers={"Idempotency-Key": "order-7"})
    assert a.status_code == 202 and b.status_code == 202
    assert a.json["job_id"] != b.json["job_id"]
    again = upload(client, token=keys["bob"], headers={"Idempotency-Key": "order-7"})
    assert again.status_code == 200 and again.json["job_id"] == b.json["job_id"]


def test_admin_api_needs_an_admin_key(secure, keys):
    client = secure.test_client()
    assert client.get("/v1/admin/dead-letters").status_code == 401
    refused = client.get("/v1/admin/dead-letters", headers=bearer(keys["alice"]))
    assert refused.status_code == 403 and "admin key" in refused.json["error"]["message"]
    assert client.get("/v1/admin/dead-letters", headers=bearer(keys["ops"])).status_code == 200
    assert client.get("/v1/admin/dead-letters", headers=bearer("test-admin-token")).status_code == 200


def test_metrics_token(secure, keys):
    client = secure.test_client()
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=bearer(keys["alice"])).status_code == 401
    assert client.get("/metrics", headers=bearer("metrics-secret")).status_code == 200
    assert client.get("/metrics", headers=bearer(keys["ops"])).status_code == 200
    assert client.get("/healthz").status_code == 200  # health checks stay open for probes


def _csrf(html: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', html).group(1)


def test_web_page_signs_in_with_a_key_and_needs_the_csrf_token(secure, keys):
    from models.access.apikeys import revoke_key

    client = secure.test_client()
    first = client.get("/")
    assert first.status_code == 302 and "/login" in first.headers["Location"]
    page = client.get("/login?next=/")
    token = _csrf(page.get_data(as_text=True))
    wrong = client.post("/login", data={"key": "wq_nope", "csrf_token": token})
    assert wrong.status_code == 401 and "Unknown API key" in wrong.get_data(as_text=True)
    assert client.post("/login", data={"key": keys["bob"]}).status_code == 403  # no token
    signed = client.post("/login", data={"key": keys["bob"], "csrf_token": token, "next": "https://evil.example/"})
    assert signed.status_code == 303 and signed.headers["Location"] == "/"  # never off-site
    cookie = client.get_cookie("whisperq_session")
    assert cookie is not None and cookie.http_only and cookie.same_site == "Lax"

    form = client.get("/")
    assert form.status_code == 200 and "Signed in as bob-test" in form.get_data(as_text=True)
    token = _csrf(form.get_data(as_text=True))
    assert token != _csrf(page.get_data(as_text=True))  # signing in starts a new session
    no_token = upload(client, path="/")
    assert no_token.status_code == 403
    posted = upload(client, path="/", csrf_token=token)
    assert posted.status_code == 303, posted.get_data(as_text=True)[:500]
    job_id = posted.headers["Location"].rsplit("/", 1)[-1]
    # The API through the cookie: reading is fine, a change needs the header.
    assert client.get(f"/v1/jobs/{job_id}").status_code == 200
    assert client.post(f"/v1/jobs/{job_id}/cancel").status_code == 403
    assert client.post(f"/v1/jobs/{job_id}/cancel", headers={"X-CSRF-Token": token}).status_code in (200, 202, 409)
    # Another key's job page is not found; the owner's is there.
    other = secure.test_client()
    assert other.get(f"/v1/jobs/{job_id}", headers=bearer(keys["alice"])).status_code == 404
    assert client.get(f"/jobs/{job_id}").status_code == 200

    revoke_key(secure.extensions["whisperq"], keys["bob"][:12])
    after = client.get("/")
    assert after.status_code == 302 and "/login" in after.headers["Location"]
    assert client.get(f"/v1/jobs/{job_id}").status_code == 401


def test_anonymous_use_sees_anonymous_jobs_only(client, secure, keys):
    mine = upload(secure.test_client(), token=keys["alice"]).json["job_id"]
    assert client.get(f"/v1/jobs/{mine}").status_code == 404  # anonymous (the `client` app allows it)
    assert client.get(f"/v1/jobs/{mine}", headers=bearer(keys["alice"])).status_code == 200
    # A key that is sent must be good, even where anonymous use is allowed.
    assert client.get("/v1/jobs", headers=bearer("wq_wrong")).status_code == 401
    # The "key" OpenAI's SDKs must send is no claim to be anyone: still anonymous.
    assert client.get(f"/v1/jobs/{mine}", headers=bearer("unused")).status_code == 404


def test_keys_command(secure):
    from click.testing import CliRunner

    from web.cli import cli

    runner = CliRunner()
    made = runner.invoke(cli, ["keys", "create", "--name", "cli-made", "--tier", "batch"])
    assert made.exit_code == 0, made.output
    token = made.stdout.strip().splitlines()[0]
    assert token.startswith("wq_") and len(token) > 40
    listed = runner.invoke(cli, ["keys", "list"])
    assert "cli-made" in listed.output and token not in listed.output and token[:10] in listed.output
    client = secure.test_client()
    assert client.get("/v1/jobs", headers=bearer(token)).status_code == 200
    assert runner.invoke(cli, ["keys", "revoke", token[:10]]).exit_code == 0
    assert client.get("/v1/jobs", headers=bearer(token)).status_code == 401
    bad = runner.invoke(cli, ["keys", "create", "--name", "x", "--tier", "gold"])
    assert bad.exit_code != 0 and "premium" in bad.output
    assert runner.invoke(cli, ["keys", "revoke", "no-such-key"]).exit_code != 0


def test_each_key_has_its_own_webhook_secret_shown_once_and_rotatable(secure, database):
    """`keys create` shows the key's webhook secret once; it is stored sealed to the key's row;
    rotating gives a new one while the old one signs beside it for the overlap."""
    from click.testing import CliRunner
    from sqlalchemy import text

    from models.access.apikeys import find_key, webhook_secrets_for
    from web.cli import cli

    rt = secure.extensions["whisperq"]
    runner = CliRunner()
    made = runner.invoke(cli, ["keys", "create", "--name", "hooks-made", "--tier", "standard"])
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    [secret] = re.findall(r"whsec_[A-Za-z0-9+/=]+", made.stderr)
    key = find_key(rt, token[:10])
    assert webhook_secrets_for(rt, key.id) == [secret]
    with database.session() as s:
        raw = s.execute(text("SELECT webhook_secret FROM api_keys WHERE id = :id"), {"id": key.id}).scalar_one()
    assert raw.startswith("wqe2:") and secret[6:20] not in raw
    listed = runner.invoke(cli, ["keys", "list", "--json"])
    assert secret not in listed.output

    rotated = runner.invoke(cli, ["keys", "rotate-webhook-secret", token[:10]])
    assert rotated.exit_code == 0, rotated.output
    new = rotated.stdout.strip()
    assert new.startswith("whsec_") and new != secret and "the old one also signs until" in rotated.stderr
    assert webhook_secrets_for(rt, key.id) == [new, secret]
    now = runner.invoke(cli, ["keys", "rotate-webhook-secret", key.id, "--overlap", "0"])
    assert now.exit_code == 0 and "the old one no longer signs" in now.stderr
    assert webhook_secrets_for(rt, key.id) == [now.stdout.strip()]
    bad = runner.invoke(cli, ["keys", "rotate-webhook-secret", key.id, "--overlap", "soon"])
    assert bad.exit_code != 0 and "--overlap" in bad.output

    # The key's holder can rotate it too, and reads it once; without a key there is none to rotate.
    client = secure.test_client()
    resp = client.post("/v1/webhook-secret", headers=bearer(token))
    assert resp.status_code == 200 and resp.headers["Cache-Control"] == "no-store"
    body = resp.get_json()
    assert body["key_id"] == key.id and body["webhook_secret"].startswith("whsec_")
    assert webhook_secrets_for(rt, key.id)[0] == body["webhook_secret"]
    assert client.post("/v1/webhook-secret").status_code == 401


def test_only_hashes_are_stored(secure, keys, database):
    from sqlalchemy import text

    with database.session() as s:
        rows = [tuple(str(v) for v in row) for row in s.execute(text("select * from api_keys")).all()]
    flat = " ".join(" ".join(r) for r in rows)
    for token in keys.values():
        assert token not in flat and token[:10] in flat


def test_a_tier_has_its_own_longest_audio(settings, database, published):
    """WHISPERQ_MAX_AUDIO_SECONDS_<TIER>: a batch key here may send 5 s, a premium key more."""
    import dataclasses

    from models.access.apikeys import create_key
    from web import create_app

    app = create_app(
        {"SETTINGS": dataclasses.replace(settings, allow_anonymous=False, max_audio_seconds_batch=5.0), "TESTING": True}
    )
    rt = app.extensions["whisperq"]
    (_b, batch), (_p, premium) = create_key(rt, "short", "batch"), create_key(rt, "long", "premium")
    client = app.test_client()

    def send(key):
        return upload(client, "report.opus", filename="r.opus", token=key)

    refused = send(batch)
    assert refused.status_code == 413 and "limit of 5 s" in refused.get_json()["error"]["message"]
    assert send(premium).status_code == 202
