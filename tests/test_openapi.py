"""GET /openapi.json: a valid OpenAPI document that describes exactly the routes the app
has, and real responses (jobs in every state, transcripts, dead letters) that conform to it."""

from __future__ import annotations

import re

import pytest
import schemathesis
from helpers import make_job

DESCRIBED = ("/healthz", "/readyz", "/metrics", "/openapi.json")
ADMIN = {"Authorization": "Bearer test-admin-token"}


@pytest.fixture()
def document(client):
    resp = client.get("/openapi.json")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    return resp.get_json()


@pytest.fixture()
def app_schema(app):
    return schemathesis.openapi.from_wsgi("/openapi.json", app)


def test_the_document_is_valid_openapi(document, app_schema):
    assert document["openapi"] == "3.0.3"
    app_schema.validate()  # against the OpenAPI 3.0 meta-schema
    scheme = document["components"]["securitySchemes"]["bearerAuth"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")


def _routes(app) -> set[tuple[str, str]]:
    found = set()
    for rule in app.url_map.iter_rules():
        if not (rule.rule.startswith("/v1/") or rule.rule in DESCRIBED):
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        found |= {(path, method.lower()) for method in rule.methods - {"HEAD", "OPTIONS"}}
    return found


def test_every_route_is_described_and_every_description_is_a_route(app, document):
    described = {
        (path, method) for path, item in document["paths"].items() for method in item if method != "parameters"
    }
    routes = _routes(app)
    assert routes - described == set(), "routes missing from web/openapi.py"
    assert described - routes == set(), "web/openapi.py describes routes the app does not have"


def test_security_is_described_per_route(document):
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            security = operation.get("security", document["security"])
            if path.startswith("/v1/admin/") or path == "/v1/webhook-secret":  # a key is needed
                assert security == [{"bearerAuth": []}], path
                assert "401" in operation["responses"] and "403" in operation["responses"], path
            elif path.startswith("/v1/") or path == "/metrics":
                assert security == [{"bearerAuth": []}, {}], path  # a key, or none with anonymous use on
                assert "401" in operation["responses"], path
            else:
                assert security == [], path


def conforms(document, api_schema, path: str, method: str, resp) -> None:
    """The status is documented, with this content type, and the body matches its schema."""
    responses = document["paths"][path][method]["responses"]
    assert str(resp.status_code) in responses, (path, method, resp.status_code, resp.get_data(as_text=True))
    content = responses[str(resp.status_code)].get("content")
    if content:
        assert resp.mimetype in content, (path, method, resp.mimetype)
    api_schema[path][method.upper()].validate_response(resp)


def _job(rt, **kwargs):

    fields = dict(
        filename="call.mp3", duration=4.2, language=None, priority="normal", audio_url="http://127.0.0.1:9/call.mp3"
    )
    fields.update(kwargs)
    return make_job(rt, None, **fields).id


def test_real_responses_conform(app, client, document, app_schema):
    from models.jobs.deadletter import move_to_dead_letters
    from models.jobs.operations import complete_job

    rt = app.extensions["whisperq"]
    segments = [
        {
            "start": 0.0,
            "end": 1.5,
            "text": " The quick brown fox.",
            "words": [{"word": " The", "start": 0.0, "end": 0.4, "probability": 0.9}],
        },
        {"start": 1.5, "end": 4.2, "text": " Jumps."},
    ]
    done = _job(rt, word_timestamps=True)
    complete_job(
        rt, done, {"text": "The quick brown fox. Jumps.", "language": "en", "segments": segments, "duration": 4.2}
    )
    waiting = _job(rt, callback_url="http://127.0.0.1:9/hook", priority="high")
    failed = _job(rt)
    move_to_dead_letters(rt, failed, "whisperq.transcribe", "the audio could not be fetched", "Traceback ...")

    def check(path, method, url, status, **kw):
        resp = getattr(client, method)(url, **kw)
        assert resp.status_code == status, resp.get_data(as_text=True)
        conforms(document, app_schema, path, method, resp)
        return resp

    for job_id in (done, waiting, failed):
        check("/v1/jobs/{job_id}", "get", f"/v1/jobs/{job_id}", 200)
    page = check("/v1/jobs", "get", "/v1/jobs?limit=1", 200).get_json()
    assert page["next_cursor"]
    check("/v1/jobs", "get", f"/v1/jobs?limit=2&cursor={page['next_cursor']}", 200)
    for fmt in ("txt", "json", "srt", "vtt"):
        check("/v1/jobs/{job_id}/transcript", "get", f"/v1/jobs/{done}/transcript?format={fmt}&download=1", 200)
    check("/v1/jobs/{job_id}/transcript", "get", f"/v1/jobs/{waiting}/transcript", 409)
    check("/v1/jobs/{job_id}/transcript", "get", f"/v1/jobs/{done}/transcript?format=docx", 400)
    check(
        "/v1/jobs/{job_id}/transcript",
        "put",
        f"/v1/jobs/{done}/transcript",
        200,
        json={"text": "The quick brown fox jumps.", "segments": [{"start": 0, "end": 4.2, "text": "The quick…"}]},
    )
    check("/v1/jobs/{job_id}", "get", f"/v1/jobs/{done}", 200)  # with its correction
    check("/v1/jobs/{job_id}/transcript", "put", f"/v1/jobs/{waiting}/transcript", 409, json={"text": "x"})
    check("/v1/jobs/{job_id}/transcript", "put", f"/v1/jobs/{done}/transcript", 400, json={"text": 7})
    check(
        "/v1/jobs/{job_id}/transcript", "put", f"/v1/jobs/{done}/transcript", 415, data="x", content_type="text/plain"
    )
    check("/v1/jobs/{job_id}/cancel", "post", f"/v1/jobs/{done}/cancel", 409)
    check("/v1/jobs/{job_id}/cancel", "post", f"/v1/jobs/{waiting}/cancel", 200)
    check("/v1/jobs/{job_id}", "delete", f"/v1/jobs/{waiting}", 204)
    check("/v1/jobs/{job_id}", "get", f"/v1/jobs/{waiting}", 404)
    check("/v1/jobs", "post", "/v1/jobs", 415, data=b"x", content_type="text/plain")
    check("/v1/jobs", "post", "/v1/jobs", 400, json={"audio_url": "ftp://example.com/a.mp3"})

    check("/v1/admin/dead-letters", "get", "/v1/admin/dead-letters", 200, headers=ADMIN)
    check("/v1/admin/dead-letters/{job_id}", "get", f"/v1/admin/dead-letters/{failed}", 200, headers=ADMIN)
    check("/v1/admin/dead-letters/{job_id}", "get", f"/v1/admin/dead-letters/{failed}", 401)
    check("/v1/admin/dead-letters/{job_id}", "delete", f"/v1/admin/dead-letters/{failed}", 204, headers=ADMIN)

    check("/v1/models", "get", "/v1/models", 200)
    check("/v1/audio/transcriptions", "post", "/v1/audio/transcriptions", 400, data={"model": "whisper-1"})
    check("/healthz", "get", "/healthz", 200)
    check("/metrics", "get", "/metrics", 200)
    check("/metrics", "get", "/metrics", 200, headers={"Accept": "application/openmetrics-text"})
    ready = client.get("/readyz")
    conforms(document, app_schema, "/readyz", "get", ready)
