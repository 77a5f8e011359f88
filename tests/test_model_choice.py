"""Models by name: a registry from the configuration, chosen per job, routed to an inference
pool of their own, and named with their version in every result. The suite serves two
(conftest): tiny.en, the default, and the multilingual base of the base-model extra."""

import hashlib
import os
import re
from pathlib import Path

import pytest
from api import upload, wait_for_job
from helpers import CLIPS, wait_until, word_error_rate

from config import ConfigError, Settings

BASE_VERSION = "sha256:d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"


def settings_with(tmp_path, **env) -> Settings:
    base = {"WHISPERQ_DATA_DIR": str(tmp_path), "CELERY_BROKER_URL": "redis://127.0.0.1:6379/15"}
    return Settings.from_env({**base, **env})


# --- the registry -------------------------------------------------------------------------------


def test_the_registry_names_each_model_its_weights_and_options(tmp_path):
    s = settings_with(
        tmp_path,
        WHISPERQ_MODELS="tiny.en=bundled:tiny.en, base=bundled:base;beam=2;compute=int8",
        WHISPERQ_DEFAULT_MODEL="base",
    )
    assert [m.name for m in s.models] == ["tiny.en", "base"] and s.default_model == "base"
    assert s.model().name == "base" and s.model("whisper-1").name == "base" and s.model("tiny.en").beam_size == 5
    assert (s.model("base").beam_size, s.model("base").compute_type, s.model("base").engine) == (
        2,
        "int8",
        "faster-whisper",
    )
    with pytest.raises(LookupError, match=re.escape("model 'large' is not served here; the models are: tiny.en, base")):
        s.model("large")


def test_without_a_registry_the_one_model_of_before(tmp_path):
    plain = settings_with(tmp_path, WHISPERQ_MODELS="")
    assert [(m.name, m.weights) for m in plain.models] == [("tiny.en", "bundled:tiny.en")]
    model_dir = tmp_path / "My Model-v2"
    model_dir.mkdir()
    (model_dir / "model.bin").write_bytes(b"")
    own = settings_with(tmp_path, WHISPERQ_MODELS="", WHISPERQ_MODEL=str(model_dir))
    assert [(m.name, m.weights) for m in own.models] == [("my-model-v2", str(model_dir))]


@pytest.mark.parametrize(
    "value, words",
    [
        ("tiny.en", "is not NAME=WEIGHTS"),
        ("Tiny=bundled:tiny.en", "must be lowercase letters"),
        ("whisper-1=bundled:tiny.en", "not 'whisper-1'"),
        ("a=bundled:large-v3", "bundled weights are bundled:tiny.en, bundled:base"),
        ("a=models/tiny", "must be an absolute path"),
        ("a=/nonexistent/ct2", "neither a CTranslate2 model directory"),
        ("a=bundled:tiny.en;beam=99", "option 'beam=99' is not one of"),
        ("a=bundled:tiny.en, a=bundled:base", "the name 'a' is given twice"),
        (" , ", "names no model"),
    ],
)
def test_a_bad_registry_says_what_to_fix(tmp_path, value, words):
    with pytest.raises(ConfigError, match="WHISPERQ_MODELS") as caught:
        settings_with(tmp_path, WHISPERQ_MODELS=value)
    assert words in str(caught.value)


def test_the_default_model_must_be_one_served(tmp_path):
    with pytest.raises(
        ConfigError, match=re.escape("WHISPERQ_DEFAULT_MODEL='large' is not one of the models served: tiny.en")
    ):
        settings_with(tmp_path, WHISPERQ_MODELS="tiny.en=bundled:tiny.en", WHISPERQ_DEFAULT_MODEL="large")


def test_each_extra_model_has_its_own_inference_queue(tmp_path):
    from config.celeryconfig import celery_config, inference_queue, models_of, pool_of, queues_for

    s = settings_with(tmp_path, WHISPERQ_MODELS="tiny.en=bundled:tiny.en, base=bundled:base")
    assert inference_queue(s) == inference_queue(s, "tiny.en") == "whisperq.inference"
    assert inference_queue(s, "base") == "whisperq.inference.base"
    assert queues_for(s)["whisperq.inference.base"] == "inference.base"
    assert "whisperq.inference.base" in {q.name for q in celery_config(s)["task_queues"]}
    assert pool_of("whisperq.inference.base") == "inference" and pool_of("whisperq.prepare") == "prepare"
    assert models_of(s, ["whisperq.inference", "whisperq.inference.base", "whisperq.prepare"]) == ["base", "tiny.en"]


# --- weights and versions -----------------------------------------------------------------------


def test_a_models_version_is_its_weights_hash_kept_beside_the_data(tmp_path, monkeypatch):
    from models.registry import catalog
    from models.speech.engines import bundled_model_path

    s = settings_with(tmp_path, WHISPERQ_MODELS="tiny.en=bundled:tiny.en")
    expected = hashlib.sha256((Path(bundled_model_path()) / "model.bin").read_bytes()).hexdigest()
    monkeypatch.setattr(catalog, "_known", {})
    assert catalog.version_of(s.model(), s.data_dir) == f"sha256:{expected}"
    assert expected in (tmp_path / "models" / "versions.json").read_text()
    monkeypatch.setattr(catalog, "_known", {})
    monkeypatch.setattr(catalog, "_sha256", lambda path: pytest.fail("hashed again"))
    assert catalog.version_of(s.model(), s.data_dir) == f"sha256:{expected}"  # from versions.json


def test_the_base_model_is_joined_into_the_data_dir_and_checked(tmp_path):
    from models.registry import catalog

    target = catalog.assemble_base(tmp_path)
    assert hashlib.sha256((target / "model.bin").read_bytes()).hexdigest() == catalog.BASE_SHA256
    assert sorted(p.name for p in target.iterdir()) == [
        ".verified",
        "config.json",
        "model.bin",
        "tokenizer.json",
        "vocabulary.txt",
    ]
    assert catalog.assemble_base(tmp_path) == target  # once


def test_base_weights_that_are_not_the_expected_ones_are_refused(tmp_path, monkeypatch):
    from models.registry import catalog

    monkeypatch.setattr(catalog, "BASE_SHA256", "0" * 64)
    with pytest.raises(catalog.WeightsUnavailable, match="reinstall them"):
        catalog.assemble_base(tmp_path)
    assert not (tmp_path / "models" / "whisper-base" / "model.bin").exists()
    assert [p.name for p in (tmp_path / "models" / "whisper-base").iterdir()] == []


def _tiny_copy(where: Path) -> Path:
    from models.speech.engines import bundled_model_path

    where.mkdir()
    for f in Path(bundled_model_path()).iterdir():
        if f.is_file():
            (where / f.name).write_bytes(f.read_bytes())
    return where


def _tamper(model_bin: Path) -> None:
    """Change one byte, keeping the size and the modification time (what a hash cache keys on)."""
    stat = model_bin.stat()
    with model_bin.open("r+b") as fh:
        fh.seek(stat.st_size // 2)
        byte = fh.read(1)
        fh.seek(stat.st_size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(model_bin, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_swapped_weights_changed_on_disk_are_refused_and_the_previous_keep_serving(
    settings, database, tmp_path, monkeypatch, caplog
):
    import dataclasses

    from click.testing import CliRunner

    from models.registry import loader
    from models.registry.swaps import ActiveWeights, ModelWeights, WeightsChanged, swap, verify_weights
    from models.runtime import Runtime
    from web.cli import cli

    name = "next"  # tiny.en's weights under another name (conftest)
    loaded: list[str] = []

    def fake_load(_settings, spec=None):  # what the runtime would load, without loading it
        loaded.append(spec.weights)
        return f"engine of {spec.weights}"

    monkeypatch.setattr(loader, "load_engine", fake_load)
    with database.session() as session:
        session.query(ModelWeights).filter(ModelWeights.model == name).delete()
    rt = Runtime(settings)
    rt._parts[("swaps", "")] = ActiveWeights(settings, rt.db, every=0)
    try:
        good, bad = _tiny_copy(tmp_path / "good"), _tiny_copy(tmp_path / "bad")
        swap(settings, database, name, str(good))
        assert rt.engine_for(name) == f"engine of {good}"
        row = swap(settings, database, name, str(bad))
        _tamper(bad / "model.bin")
        with caplog.at_level("ERROR", logger="models.registry.swaps"):
            assert rt.engine_for(name) == f"engine of {good}"  # the engine before keeps serving
            assert rt.engine_for(name) == f"engine of {good}"
        assert loaded == [str(good)]  # the changed weights were never loaded
        refusals = [r.getMessage() for r in caplog.records if "swap refused" in r.getMessage()]
        assert len(refusals) == 1 and "changed on disk" in refusals[0] and f"keeps running {good}" in refusals[0]
        with pytest.raises(WeightsChanged, match=f"`whisperq models swap {name} {bad}` again"):
            verify_weights(dataclasses.replace(settings.model(name), weights=str(bad)), settings.data_dir, row.version)
        # a process that had nothing in force yet runs the configured weights
        assert ActiveWeights(settings, database, every=0).spec(name).weights == "bundled:tiny.en"
        listed = CliRunner().invoke(cli, ["models", "list"], catch_exceptions=False)
        assert f"the swap to {bad} is refused" in listed.output, listed.output
        # swapped again, the weights as they are now are recorded and taken up
        swap(settings, database, name, str(bad))
        assert rt.engine_for(name) == f"engine of {bad}" and loaded == [str(good), str(bad)]
    finally:
        with database.session() as session:
            session.query(ModelWeights).filter(ModelWeights.model == name).delete()


# --- the API ------------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_models_are_listed_with_version_languages_and_workers(client, worker):
    data = {m["id"]: m for m in client.get("/v1/models").get_json()["data"]}
    assert list(data) == ["whisper-1", "tiny.en", "base", "next"]
    assert data["tiny.en"]["version"].startswith("sha256:") and len(data["tiny.en"]["version"]) == 71
    assert (data["tiny.en"]["multilingual"], data["tiny.en"]["languages"], data["tiny.en"]["default"]) == (
        False,
        ["en"],
        True,
    )
    assert data["tiny.en"]["served"] is True  # the suite's inference pool
    assert (data["base"]["version"], data["base"]["multilingual"], data["base"]["default"]) == (
        BASE_VERSION,
        True,
        False,
    )
    assert "de" in data["base"]["languages"] and data["base"]["engine"] == "faster-whisper"
    assert data["whisper-1"]["alias_of"] == "tiny.en" and data["whisper-1"]["version"] == data["tiny.en"]["version"]


def test_an_unknown_model_is_400_naming_the_models(client):
    resp = upload(client, "fox.flac", model="large-v3")
    assert resp.status_code == 400
    assert "model 'large-v3' is not served here; the models are: tiny.en, base" in resp.get_json()["error"]["message"]


def test_an_english_only_model_refuses_another_language_and_translation(client):
    resp = upload(client, "fox.flac", model="tiny.en", language="de")
    assert resp.status_code == 400 and "the model 'tiny.en' is English-only" in resp.get_json()["error"]["message"]
    resp = upload(client, "fox.flac", task="translate")
    assert resp.status_code == 400 and "'tiny.en' is English-only" in resp.get_json()["error"]["message"]


def test_a_model_no_worker_serves_is_refused_and_nothing_kept(client, settings):
    from tasks import transcribe

    before = sorted(p.name for p in (settings.data_dir / "audio").rglob("*") if p.is_file())
    resp = upload(client, "fox.flac", model="base")
    assert resp.status_code == 503
    error = resp.get_json()["error"]
    assert error["code"] == "model_not_served" and "-Q whisperq.inference.base" in error["message"]
    assert sorted(p.name for p in (settings.data_dir / "audio").rglob("*") if p.is_file()) == before
    with pytest.raises(ValueError, match="model 'nope' is not served here"):
        transcribe.delay("/tmp/clip.wav", model="nope")


@pytest.mark.integration
@pytest.mark.timeout(900)  # waits up to 300 s per job (setup.cfg's default is 300)
def test_each_model_runs_in_its_own_pool_and_every_result_names_what_made_it(client, worker, celery_app, tmp_path):
    """A job for base goes to base's queue and its worker; a default job to the default pool. The
    two-language recording comes back in both languages, each part in its own."""
    from conftest import start_worker, stop_worker

    base = start_worker(
        celery_app, tmp_path, "inference-base", "whisperq.inference.base", pool="threads", concurrency=4
    )
    try:
        wait_until(
            lambda: {m["id"]: m for m in client.get("/v1/models").get_json()["data"]}["base"]["served"],
            30,
            "the base worker's heartbeat did not arrive",
        )
        mixed = upload(client, "bilingual.opus", model="base")
        plain = upload(client, "fox.flac", language="en")
        assert mixed.status_code == plain.status_code == 202, (mixed.get_json(), plain.get_json())
        assert mixed.get_json()["model"] == "base" and plain.get_json()["model"] == "tiny.en"

        job = wait_for_job(client, mixed.get_json()["job_id"], timeout=300)
        assert job["status"] == "COMPLETED", job
        made = job["result"]["model"]
        assert (made["name"], made["version"], made["engine"]) == ("base", BASE_VERSION, "faster-whisper")
        assert made["beam_size"] == 5 and made["task"] == "transcribe"
        by_language: dict[str, str] = {}
        for segment in job["result"]["segments"]:
            by_language[segment["language"]] = by_language.get(segment["language"], "") + " " + segment["text"]
        assert set(by_language) == {"en", "de"}, by_language
        clip = CLIPS["bilingual.opus"]
        assert word_error_rate(clip["text_en"], by_language["en"]) <= 0.15, by_language["en"]
        assert word_error_rate(clip["text_de"], by_language["de"]) <= 0.35, by_language["de"]
        assert job["result"]["language"] == "en"  # the most speech

        job = wait_for_job(client, plain.get_json()["job_id"])
        assert job["status"] == "COMPLETED" and job["result"]["model"]["name"] == "tiny.en"
        assert job["result"]["model"]["version"] != BASE_VERSION
        assert "language" not in job["result"]["segments"][0]  # asked for: not detected window by window
        stats = base.output()
        assert mixed.get_json()["job_id"] in stats and plain.get_json()["job_id"] not in stats
    finally:
        stop_worker(base)


@pytest.mark.integration
@pytest.mark.timeout(900)  # waits up to 300 s for the result (setup.cfg's default is 300)
def test_delay_takes_a_model(worker, celery_app, tmp_path):
    import shutil

    from conftest import start_worker, stop_worker

    from tasks import transcribe

    path = tmp_path / "shared" / "fox.flac"
    path.parent.mkdir()
    shutil.copy(CLIPS["fox.flac"]["path"], path)
    base = start_worker(
        celery_app, tmp_path, "inference-base-delay", "whisperq.inference.base", pool="threads", concurrency=2
    )
    try:
        result = transcribe.delay(str(path), model="base", language="en").get(timeout=300)
        assert result["model"]["name"] == "base" and result["model"]["version"] == BASE_VERSION
        assert word_error_rate(CLIPS["fox.flac"]["text"], result["text"]) <= 0.2
    finally:
        stop_worker(base)
    assert os.path.exists(path)
