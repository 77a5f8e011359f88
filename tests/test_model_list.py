"""GET /v1/models: every caller sees the models and aliases it may name; only an admin sees how
aliases split their jobs (A/B weights) and which models are shadowed."""

import os

import pytest
from api import bearer

from config import Settings


@pytest.fixture()
def routed_app(settings, database):
    from web import create_app

    s = Settings.from_env(
        {
            **os.environ,
            "WHISPERQ_ALIASES": "default=tiny.en:90|base:10",
            "WHISPERQ_DEFAULT_MODEL": "default",
            "WHISPERQ_SHADOW": "tiny.en=base:20",
        }
    )
    return create_app({"SETTINGS": s, "TESTING": True})


def _models(client, token=None):
    resp = client.get("/v1/models", headers=bearer(token))
    assert resp.status_code == 200, resp.get_json()
    return {m["id"]: m for m in resp.get_json()["data"]}


def test_an_admin_sees_the_weights_and_the_shadow(routed_app):
    rt = routed_app.extensions["whisperq"]
    data = _models(routed_app.test_client(), rt.settings.admin_token)
    assert data["default"]["variants"] == [{"id": "tiny.en", "weight": 90}, {"id": "base", "weight": 10}]
    assert data["tiny.en"]["shadow"] == {"candidate": "base", "percent": 20} and data["base"]["shadow"] is None


def test_other_callers_get_the_list_without_weights_or_shadows(routed_app):
    from models.access.apikeys import create_key

    rt = routed_app.extensions["whisperq"]
    key = create_key(rt, "model-list-test", "premium")[1]
    for token in (None, key):  # anonymous, a key that is no admin's
        data = _models(routed_app.test_client(), token)
        assert list(data) == ["whisper-1", "tiny.en", "base", "next", "default"]
        assert data["default"]["default"] is True and data["whisper-1"]["alias_of"] == "default"
        assert not any("variants" in m or "shadow" in m for m in data.values()), data
