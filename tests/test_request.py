"""A job's options, declared once (models/pipeline/request.py): every list of them in the code
and every published description of them is that declaration's, or agrees with it."""

from __future__ import annotations

import dataclasses
import json
import re
import uuid

import pytest
from helpers import ROOT


def test_the_raw_message_schema_and_the_options_page_are_what_the_declaration_writes(tmp_path):
    from models.pipeline import request

    assert request.main(["--check", str(ROOT)]) == 0, (
        "docs/messages/transcribe.v1.schema.json or docs/options.md is stale: run `python -m models.pipeline.request`"
    )
    (tmp_path / "docs" / "messages").mkdir(parents=True)
    (tmp_path / request.SCHEMA_PATH).write_text("{}")
    assert request.main(["--check", str(tmp_path)]) == 1
    assert request.main([str(tmp_path)]) == 0 and request.main(["--check", str(tmp_path)]) == 0


def test_a_raw_message_may_carry_every_option_the_docs_list():
    """What docs/producers.md lists a producer may send, the published schema lets through (it
    refused hotwords, speakers and redact), and nothing it does not declare."""
    import jsonschema
    from test_producers import message

    from models.pipeline.request import FIELDS, OWNERSHIP, message_schema, names_for

    docs = (ROOT / "docs" / "producers.md").read_text()
    listed = set(re.findall(r"`(\w+)`", docs))
    assert set(names_for("raw")) == set(FIELDS) and set(FIELDS) | set(OWNERSHIP) <= listed
    values = {
        "language": "en",
        "priority": "high",
        "task": "transcribe",
        "model": "tiny.en",
        "word_timestamps": True,
        "speakers": "2-4",
        "redact": "pii",
        "hotwords": ["Siobhan", "Kubernetes"],
        "prompt": "A meeting.",
        "temperature": 0.2,
        "callback_url": "https://hooks.example.com/done",
        "collect": False,
        "api_key": None,
    }
    assert set(values) - {"api_key"} == set(FIELDS)
    message(str(uuid.uuid4()), "/srv/audio/call.wav", **values)  # validates against the file's schema
    schema = message_schema()
    for other in ({"speakers": True}, {"speakers": 3}, {"speakers": {"min": 2, "max": 4}}, {"redact": ["email"]}):
        jsonschema.validate(message(str(uuid.uuid4()), "/a.wav", **other), schema)
    for wrong in ({"speakers": 0}, {"redact": 7}, {"hotwords": [3]}, {"diarize": True}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**message(str(uuid.uuid4()), "/a.wav"), "body": [["/a.wav"], wrong, {}]}, schema)


def test_every_way_in_takes_the_options_the_declaration_gives_it():
    from models.jobs.record import Job, JobOptions
    from models.pipeline import request
    from tasks import transcription
    from web import batches, uploads

    names = request.FIELDS
    assert transcription.OPTIONS == request.names_for("delay") == names  # transcribe.delay()'s keywords
    assert set(batches.SHARED) == set(request.names_for("batch")) - {"callback_url"}  # each item's
    assert set(batches.ITEM) == {"audio_url", *request.names_for("batch")} - {"priority"}  # one priority a batch
    assert set(request.names_for("openai")) == {"language", "prompt", "temperature", "hotwords", "speakers", "redact"}
    assert set(uploads.RERUN_KEPT) <= {c.key for c in Job.__table__.columns}  # kept from the original's row
    # The parsed options are the declared ones, the analyses (speakers, redact) gathered in one.
    parsed = {f.name for f in dataclasses.fields(JobOptions)}
    assert parsed == (set(names) - {"speakers", "redact"}) | {"analyses"}
    with pytest.raises(Exception, match="unknown field"):
        uploads.check_fields({"diarize": "true"}, {})
    uploads.check_fields(dict.fromkeys(names, ""), {})


def test_the_openapi_document_describes_the_declared_options(client):
    from models.pipeline.request import FIELDS, names_for, option

    schemas = client.get("/openapi.json").get_json()["components"]["schemas"]
    for body in ("Upload", "UrlSubmission", "Rerun"):
        properties = schemas[body]["properties"]
        assert set(FIELDS) <= set(properties), (body, set(FIELDS) - set(properties))
        for name in FIELDS:
            assert properties[name]["description"].startswith(option(name).help[:40]), (body, name)
    assert set(names_for("openai")) <= set(schemas["TranscriptionRequest"]["properties"])


def test_the_upload_page_offers_each_option_the_declaration_puts_on_it(client):
    from models.pipeline.request import page_options

    page = client.get("/").get_data(as_text=True)
    for o in page_options():
        if o.control == "task" and 'value="de"' not in page:  # English-only models: nothing to translate with
            assert f'name="{o.name}"' not in page
            continue
        assert f'name="{o.name}"' in page, o.name
        if o.control == "checkbox":
            assert re.search(rf'<input type="checkbox" id="opt-{o.name}" name="{o.name}" value="{o.check}"', page)
    for name in ("callback_url", "temperature", "collect"):  # the API's alone
        assert f'name="{name}"' not in page


def test_the_page_keeps_the_options_asked_for_when_it_shows_an_error(client):
    page = client.post(
        "/", data={"speakers": "true", "redact": "pii", "hotwords": "Siobhan", "word_timestamps": "true"}
    ).get_data(as_text=True)
    assert 'id="more-options" open' in page
    for name in ("speakers", "redact", "word_timestamps"):
        assert re.search(rf'name="{name}" value="\w+" checked', page), name
    assert 'value="Siobhan"' in page


def test_job_options_round_trip_through_json():
    """The options the door parsed are what a message or a fingerprint carries: JSON values."""
    from models.jobs.record import JobOptions

    opts = JobOptions(language="en", hotwords="a, b", analyses={"speakers": {}})
    assert json.loads(json.dumps(opts.fields())) == opts.fields()
