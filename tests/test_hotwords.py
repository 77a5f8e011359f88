"""Words to listen for: `hotwords` per job and per key, checked at the door, carried to the
engine, and heard: a rare name tiny.en misspells is written right with it (real audio, the
bundled engine)."""

from __future__ import annotations

import dataclasses

import pytest
from api import bearer, upload
from helpers import flite

from models.speech import audio

pytestmark = pytest.mark.timeout(300)


def _spoken(tmp_path, text: str):
    return audio.decode(flite(tmp_path, "slt", text))


def test_a_rare_name_is_heard_with_hotwords_and_not_without(bundled_engine, tmp_path):
    from models.speech.windows import split_windows

    samples = _spoken(tmp_path, "The invoice for Xochitl was sent to Oaxaca.")
    windows = split_windows(samples)
    chunks, places = [w.samples(samples) for w in windows], [w.time_map() for w in windows]

    def heard(hotwords):
        segments = bundled_engine.transcribe_batch(chunks, places, "en", hotwords=hotwords)
        return " ".join(s.text for found in segments for s in found)

    without, with_them = heard(None), heard("Xochitl, Oaxaca")
    assert "Xochitl" not in without and "Oaxaca" not in without, without
    assert "Xochitl" in with_them and "Oaxaca" in with_them, with_them


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("Xochitl, Oaxaca", "Xochitl, Oaxaca"),
        (" Kubernetes ,, Grafana ", "Kubernetes, Grafana"),
        ("", None),
    ],
)
def test_hotwords_are_checked_and_kept_as_one_string(given, stored):
    from models.pipeline.options import parse_hotwords

    assert parse_hotwords(given) == stored
    assert parse_hotwords(["Xochitl", "Oaxaca"]) == "Xochitl, Oaxaca"


@pytest.mark.parametrize("bad", ["x" * 501, ["ok", 3], 7, "tab\there"])
def test_bad_hotwords_are_refused_saying_what_to_send(bad):
    from models.errors import InvalidRequest
    from models.pipeline.options import parse_hotwords

    with pytest.raises(InvalidRequest, match="hotwords"):
        parse_hotwords(bad)


def test_a_keys_hotwords_apply_to_its_jobs_that_name_none(settings, database, celery_app):
    from models.access.apikeys import create_key, set_hotwords
    from models.jobs.operations import get_job
    from web import create_app

    changes = {"allow_anonymous": False}
    if not (settings.broker_url or "").startswith("redis"):
        changes["redis_url"] = "redis://127.0.0.1:6379/14"  # tier rate limits count in Redis
    app = create_app({"SETTINGS": dataclasses.replace(settings, **changes), "TESTING": True})
    rt = app.extensions["whisperq"]
    record, token = create_key(rt, "names-test", "standard")
    set_hotwords(rt, record.id, "Siobhan, Saoirse")
    client = app.test_client()
    default = upload(client, token=token)
    own = upload(client, token=token, hotwords="Niamh")
    assert default.status_code == own.status_code == 202, (default.get_json(), own.get_json())
    assert get_job(rt, default.get_json()["job_id"]).hotwords == "Siobhan, Saoirse"
    assert get_job(rt, own.get_json()["job_id"]).hotwords == "Niamh"
    assert client.get(f"/v1/jobs/{own.get_json()['job_id']}", headers=bearer(token)).get_json()["hotwords"] == "Niamh"
