"""Schemathesis fuzzes every operation in /openapi.json against the app, in process.

No input may give a 5xx, and every answer must conform to the document: a documented
status code, a documented content type, a body that matches its schema, and the
documented headers. Valid and invalid inputs both (mode "all"): examples built from the
schemas, the coverage phase's boundary and negative cases, then a few dozen random ones
per operation. The seed is fixed, so a run is the same run every time; it takes about
20 s on two cores.

The app runs with anonymous use on (tests/conftest.py); the admin operations get the
admin token. The broker is the real one: an accepted submission is published.
"""

from __future__ import annotations

import pytest
import schemathesis
from helpers import make_job

SEED = 20260608
CONFIG = {
    "seed": SEED,
    "generation": {
        "mode": "all",
        "max-examples": 40,
        "database": "none",
        # Anonymous use is on: a made-up bearer key would only ever get 401.
        "with-security-parameters": False,
    },
    "phases": {"stateful": {"enabled": False}},
    # Schema-valid is not enough to be accepted: random bytes are not audio, a made-up host
    # does not resolve, a cursor is opaque. Every other check runs.
    "checks": {
        "positive_data_acceptance": {"enabled": False},
        # Invalid data may also be refused as too large: more than 16 multipart parts is 413
        # before any field is read (web/__init__.py MAX_FORM_PARTS), which is a rejection too.
        "negative_data_rejection": {
            "expected-statuses": [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5xx"]
        },
    },
}
ADMIN = {"Authorization": "Bearer test-admin-token"}  # WHISPERQ_ADMIN_TOKEN in tests/conftest.py


@pytest.fixture()
def api_schema(settings, database, celery_app, request, monkeypatch):
    # schemathesis 4.32's from_fixture renames the test item per operation through
    # `_nodeid`, which pytest 9 no longer has (it keeps the id in `_id`): give it one.
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid
    # Half the job ids are real, so the answers about real jobs (in every state) are
    # checked too, not only 404s. Each operation that changes a job gets jobs of its own:
    # the operations run one after another, and a deleted job stays deleted.
    # One model: a second one no worker serves is refused with 503 by design (tests/test_model_choice.py).
    import dataclasses

    import web.api
    from web import create_app

    # A long-poll (?wait=N) holds its answer until the job changes or N seconds pass, and the
    # fuzzer asks for up to 60 s: the bound is still checked (1..60, else 400), but the wait is
    # cut to nothing, so the answer's shape is fuzzed, not its patience (tests/test_polls.py).
    checked = web.api._wait_seconds
    monkeypatch.setattr(web.api, "_wait_seconds", lambda value: min(checked(value), 0))

    one = dataclasses.replace(settings, models=settings.models[:1], default_model=settings.models[0].name)
    app = create_app({"SETTINGS": one, "TESTING": True})
    jobs = real_jobs(app.extensions["whisperq"])
    config = schemathesis.Config.from_dict(
        {
            **CONFIG,
            "dictionaries": {name: {"values": ids} for name, ids in jobs.items()},
            "operations": [
                {
                    "include-operation-id": operation,
                    "parameters": {"path.job_id": {"dictionary": name, "probability": 0.5}},
                }
                for operation, name in (
                    ("getJob", "read"),
                    ("getTranscript", "read"),
                    ("cancelJob", "cancel"),
                    ("deleteJob", "delete"),
                    ("getDeadLetter", "dead"),
                    ("replayDeadLetter", "replay"),
                    ("purgeDeadLetter", "purge"),
                    ("correctTranscript", "correct"),
                )
            ],
        }
    )
    return schemathesis.openapi.from_wsgi("/openapi.json", app, config=config)


def real_jobs(rt) -> dict[str, list[str]]:
    from models.jobs.deadletter import move_to_dead_letters
    from models.jobs.operations import complete_job

    def job(**kwargs) -> str:
        fields = dict(
            filename="call.mp3", duration=4.2, language=None, priority="normal", audio_url="http://127.0.0.1:9/call.mp3"
        )
        return make_job(rt, None, **{**fields, **kwargs}).id

    def waiting() -> list[str]:
        return [job(priority=p, callback_url="http://127.0.0.1:9/hook") for p in ("high", "normal", "low")]

    def dead() -> list[str]:
        ids = [job(), job()]
        for job_id in ids:
            move_to_dead_letters(rt, job_id, "whisperq.transcribe", "the audio could not be fetched", "Traceback ...")
        return ids

    def completed() -> str:
        job_id = job(word_timestamps=True)
        complete_job(
            rt,
            job_id,
            {
                "text": "The quick brown fox.",
                "language": "en",
                "duration": 4.2,
                "segments": [
                    {
                        "start": 0.0,
                        "end": 2.0,
                        "text": " The quick",
                        "words": [
                            {"word": " The", "start": 0.0, "end": 0.5, "probability": 0.9},
                            {"word": " quick", "start": 0.5, "end": 2.0, "probability": 0.8},
                        ],
                    },
                    {"start": 2.0, "end": 4.2, "text": " brown fox."},
                ],
            },
        )
        return job_id

    return {
        "read": [completed(), *waiting()],
        "cancel": [completed(), *waiting()],
        "delete": [completed(), *waiting()],
        "dead": dead(),
        "replay": dead(),
        "purge": dead(),
        "correct": [completed(), completed(), *waiting()],
    }


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
def test_api_conforms_and_never_errors(case):
    # Sent as the caller's own header, so the ignored_auth check knows the credentials are
    # real: it then sends the request without them, and with a made-up key, expecting 401.
    headers = ADMIN if case.path.startswith("/v1/admin/") else None
    case.call_and_validate(headers=headers)


def test_what_fuzzing_found_stays_fixed(client, app, monkeypatch):
    import base64
    import json

    from models.jobs.deadletter import move_to_dead_letters

    # "²".isdigit() is true, but int("²") raises: a 500 before.
    assert client.get("/v1/jobs?limit=%C2%B2").status_code == 400
    assert client.get("/v1/admin/dead-letters?limit=%C2%B2", headers=ADMIN).status_code == 400
    # A cursor with a time without its zone cannot be compared with the stored times.
    naive = base64.urlsafe_b64encode(json.dumps(["2020-01-01T00:00:00", "x"]).encode()).decode()
    assert client.get(f"/v1/jobs?cursor={naive}").status_code == 400
    # A 405 names the methods that are allowed (RFC 9110).
    assert "GET" in client.delete("/v1/jobs").headers["Allow"]

    rt = app.extensions["whisperq"]
    ids = [
        make_job(
            rt,
            None,
            filename="a.mp3",
            duration=None,
            language=None,
            priority="normal",
            audio_url="http://127.0.0.1:9/a.mp3",
        ).id
        for _ in range(2)
    ]
    for job_id in ids:
        move_to_dead_letters(rt, job_id, "whisperq.transcribe", "the audio could not be fetched", None)
    # A job by URL that never got its audio is replayed (it fetches it again): a 500 before.
    resp = client.post(f"/v1/admin/dead-letters/{ids[0]}/replay", headers=ADMIN)
    assert resp.status_code == 202, resp.get_json()
    # A broker that is away is a 503 with Retry-After, and the job stays dead-lettered.
    from tasks.broker import CeleryBroker

    def unreachable(*args, **kwargs):
        raise ConnectionError("broker away")

    monkeypatch.setattr(CeleryBroker, "publish_job", unreachable)
    resp = client.post(f"/v1/admin/dead-letters/{ids[1]}/replay", headers=ADMIN)
    assert resp.status_code == 503 and resp.headers["Retry-After"]
    assert client.get(f"/v1/admin/dead-letters/{ids[1]}", headers=ADMIN).status_code == 200
