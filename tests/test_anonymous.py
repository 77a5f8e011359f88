"""Anonymous use (what `make run` serves) on a workstation: a browser on another site can
neither reach the API through a rebound DNS name nor submit or change jobs for its visitor;
anonymous jobs are capped at normal priority."""

from __future__ import annotations

import dataclasses

import pytest
from api import upload


@pytest.fixture()
def workstation(settings, database, published):
    """The app as `make run` configures it: anonymous use, loopback, the default cap."""
    from web import create_app

    changed = dataclasses.replace(
        settings,
        allow_anonymous=True,
        host="127.0.0.1",
        allowed_hosts=None,
        public_url=None,
        anonymous_max_priority="normal",
    )
    return create_app({"SETTINGS": changed, "TESTING": True}).test_client()


def test_a_host_this_server_does_not_serve_is_refused(workstation, published):
    """DNS rebinding: evil.example resolves to 127.0.0.1, and the browser sends its name."""
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.nip.io:8000"):
        read = workstation.get("/v1/jobs", headers={"Host": host})
        assert read.status_code == 403 and "does not serve the host" in read.get_json()["error"]["message"], host
        assert upload(workstation, headers={"Host": host}).status_code == 403
        assert workstation.get("/", headers={"Host": host}).status_code == 403
    assert not published
    for host in ("localhost:8000", "127.0.0.1:8000", "[::1]:8000", "localhost"):
        assert workstation.get("/v1/jobs", headers={"Host": host}).status_code == 200, host
    # Health checks answer whatever name a probe uses.
    assert workstation.get("/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200


def test_allowed_hosts_and_the_public_url_are_served(settings, database):
    from web import create_app

    named = dataclasses.replace(settings, host="0.0.0.0", allowed_hosts=("stt.example.org",), public_url=None)
    client = create_app({"SETTINGS": named, "TESTING": True}).test_client()
    assert client.get("/v1/jobs", headers={"Host": "stt.example.org"}).status_code == 200
    assert client.get("/v1/jobs", headers={"Host": "other.example.org"}).status_code == 403
    public = dataclasses.replace(settings, host="127.0.0.1", allowed_hosts=None, public_url="https://stt.example.org")
    client = create_app({"SETTINGS": public, "TESTING": True}).test_client()
    assert client.get("/v1/jobs", headers={"Host": "stt.example.org"}).status_code == 200
    anywhere = dataclasses.replace(settings, host="0.0.0.0", allowed_hosts=None, public_url=None)
    client = create_app({"SETTINGS": anywhere, "TESTING": True}).test_client()
    assert client.get("/v1/jobs", headers={"Host": "whatever.internal"}).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.example"},
        {"Origin": "http://localhost:9999"},
        {"Origin": "null"},
    ],
)
def test_an_anonymous_change_from_another_site_is_refused(workstation, published, headers):
    resp = upload(workstation, headers=headers)
    message = resp.get_json()["error"]["message"]
    assert resp.status_code == 403 and ("another site" in message or "no origin" in message), message
    resp = workstation.post("/v1/jobs", json={"audio_url": "https://example.com/a.mp3"}, headers=headers)
    assert resp.status_code == 403
    assert not published


@pytest.mark.parametrize(
    "headers",
    [
        {},  # curl, a script, a service
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},  # typed into the address bar
        {"Origin": "http://localhost"},
    ],
)
def test_an_anonymous_change_from_this_site_or_no_site_is_taken(workstation, headers):
    assert upload(workstation, headers=headers).status_code == 202


def test_a_key_may_submit_from_anywhere(settings, database, published):
    """A key is no ambient credential a browser adds by itself: no origin check for it."""
    from models.access.apikeys import create_key
    from web import create_app

    app = create_app(
        {
            "SETTINGS": dataclasses.replace(
                settings, allow_anonymous=False, host="127.0.0.1", allowed_hosts=None, public_url=None
            ),
            "TESTING": True,
        }
    )
    _record, key = create_key(app.extensions["whisperq"], "origins", "standard")
    resp = upload(app.test_client(), token=key, headers={"Origin": "https://app.example"})
    assert resp.status_code == 202, resp.get_json()


def test_anonymous_jobs_get_at_most_normal_priority(workstation, published):
    refused = upload(workstation, priority="high")
    assert refused.status_code == 403
    assert "anonymous use may ask for priority normal or low" in refused.get_json()["error"]["message"]
    assert upload(workstation, priority="normal").status_code == 202
    assert upload(workstation).get_json()["priority"] == "normal"
    page = workstation.get("/").get_data(as_text=True)
    assert 'value="normal"' in page and 'value="high"' not in page
    assert len(published) == 2
