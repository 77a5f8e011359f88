"""Training-data logging: jobs collected per key or per job, a client's correction kept
beside the original transcript, and `whisperq dataset export` writing an `audiofolder`
dataset that the Hugging Face `datasets` library reads back, without the jobs that were
deleted or whose audio retention removed.

The export looks at every job of its database, so each test has a database and a data dir
of its own (a SQLite file, or a private schema of the suite's PostgreSQL). The audio is
stored through the real upload path (POST /v1/jobs); only the broker message is held back
(no worker reads this database), and the jobs are completed with a known transcript: the
transcription itself is tested elsewhere.
"""

from __future__ import annotations

import dataclasses
import io
import json
import uuid
import wave
from datetime import timedelta

import pytest
from api import bearer, submit, upload
from click.testing import CliRunner
from helpers import CLIPS

from models.jobs.operations import complete_job, delete_job, get_job
from models.jobs.record import Job, utcnow

MADE_BY = {"name": "tiny.en", "version": "sha256:0123abcd", "engine": "faster-whisper"}


@pytest.fixture()
def app(settings, private_db, tmp_path, monkeypatch):
    """The web app on the private database and data dir; its task messages are held back."""
    from tasks.broker import CeleryBroker
    from web import create_app

    monkeypatch.setattr(CeleryBroker, "publish_job", lambda self, job, **kw: None)
    private = dataclasses.replace(
        settings,
        database_url=private_db,
        data_dir=tmp_path / "data",
        audio_retention_seconds=3600.0,
        result_retention_seconds=None,
    )
    app = create_app({"SETTINGS": private, "TESTING": True})
    yield app
    app.extensions["whisperq"].db.dispose()


def whisperq(rt, *args: str):
    """The `whisperq` command on the test's database and data dir."""
    from web.cli import cli

    env = {
        "DATABASE_URL": rt.settings.database_url,
        "WHISPERQ_DATA_DIR": str(rt.settings.data_dir),
        "WHISPERQ_AUDIO_RETENTION": "1h",
    }
    return CliRunner().invoke(cli, list(args), env=env)


def finish(rt, job_id: str, words: str) -> None:
    """Complete the job as a worker would, with a known transcript."""
    duration = get_job(rt, job_id).audio_duration
    complete_job(
        rt,
        job_id,
        {
            "text": words,
            "language": "en",
            "duration": duration,
            "model": MADE_BY,
            "segments": [{"start": 0.0, "end": duration, "text": " " + words}],
        },
    )


def raw_correction(rt, job_id: str):
    """The correction column as stored (its sealed token), whatever the database."""
    from sqlalchemy import JSON, select, type_coerce

    table = Job.__table__
    with rt.db.engine.connect() as conn:
        return conn.execute(select(type_coerce(table.c.correction, JSON)).where(table.c.id == job_id)).scalar_one()


def make_key(rt, name: str, collect: bool = False) -> tuple[str, str]:
    from models.access.apikeys import create_key

    record, token = create_key(rt, name, "standard", collect=collect)
    return record.id, token


# --- collect: per job and per key -----------------------------------------------------------


def test_a_job_is_collected_when_it_asks_or_its_key_collects(app, app_rt):
    client = app.test_client()
    assert submit(client, "report.opus")["collect"] is False
    assert submit(client, "report.opus", collect="true")["collect"] is True
    assert submit(client, "report.opus", collect="off")["collect"] is False
    by_url = client.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/call.mp3", "collect": True})
    assert by_url.status_code == 202 and by_url.get_json()["collect"] is True

    for bad in ({"collect": "sometimes"}, {"collect": "2"}):
        resp = upload(client, filename="f.flac", **bad)
        assert resp.status_code == 400
        assert "collect must be true" in resp.get_json()["error"]["message"]
    resp = client.post("/v1/jobs", json={"audio_url": "http://127.0.0.1:9/call.mp3", "collect": 1})
    assert resp.status_code == 400 and "'collect'" in resp.get_json()["error"]["message"]

    created = whisperq(app_rt, "keys", "create", "--name", "call centre", "--collect")
    assert created.exit_code == 0, created.output
    token = created.output.splitlines()[0]
    listed = json.loads(whisperq(app_rt, "keys", "list", "--json").output)
    key_id = next(k["id"] for k in listed if k["name"] == "call centre")
    assert next(k for k in listed if k["id"] == key_id)["collect"] is True
    assert submit(client, "report.opus", token=token)["collect"] is True  # the key collects every job
    # A job that says collect=false is not collected: the key's setting is its default, not an override.
    assert submit(client, "report.opus", token=token, collect="false")["collect"] is False

    off = whisperq(app_rt, "keys", "collect", key_id, "off")
    assert off.exit_code == 0 and "not collected" in off.output
    assert submit(client, "report.opus", token=token)["collect"] is False
    assert submit(client, "report.opus", token=token, collect="yes")["collect"] is True
    assert whisperq(app_rt, "keys", "collect", key_id, "on").exit_code == 0
    assert json.loads(whisperq(app_rt, "keys", "list", "--json").output)[0]["collect"] is True
    bad = whisperq(app_rt, "keys", "collect", key_id, "maybe")
    assert bad.exit_code == 2 and "'on'" in bad.output
    unknown = whisperq(app_rt, "keys", "collect", "wq_nonesuch", "on")
    assert unknown.exit_code == 1 and "keys list" in unknown.output


# --- corrections ----------------------------------------------------------------------------


def test_a_correction_is_kept_beside_the_original(app, app_rt):
    client = app.test_client()
    _owner, token = make_key(app_rt, "editor")
    _other, other_token = make_key(app_rt, "someone else")
    job_id = submit(client, "report.opus", token=token)["job_id"]
    url = f"/v1/jobs/{job_id}/transcript"
    before = client.get(f"/v1/jobs/{job_id}", headers=bearer(token))
    assert before.get_json()["correction"] is None

    resp = client.put(url, json={"text": "first try"}, headers=bearer(token))
    assert resp.status_code == 409 and resp.get_json()["error"]["code"] == "not_ready"
    assert "once the job is COMPLETED" in resp.get_json()["error"]["message"]

    finish(app_rt, job_id, "please send the quarterly report to the finance team")
    etag = client.get(f"/v1/jobs/{job_id}", headers=bearer(token)).headers["ETag"]
    fixed = "Please send the quarterly report to the finance team before Friday afternoon."
    segments = [
        {"start": 0.0, "end": 4.5, "text": "Please send the quarterly report"},
        {"start": 4.5, "end": 9, "text": " to the finance team before Friday afternoon."},
    ]
    resp = client.put(url, json={"text": fixed, "segments": segments}, headers=bearer(token))
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    assert body["result"]["text"] == "please send the quarterly report to the finance team"  # the original stays
    assert body["correction"]["text"] == fixed
    assert body["correction"]["segments"] == [{**s, "end": float(s["end"])} for s in segments]
    assert body["correction"]["corrected_at"].endswith("Z")

    shown = client.get(f"/v1/jobs/{job_id}", headers={**bearer(token), "If-None-Match": etag})
    assert shown.status_code == 200  # a correction changes the job's ETag
    assert shown.get_json()["correction"]["text"] == fixed
    assert shown.get_json()["result"]["text"] == "please send the quarterly report to the finance team"
    assert (
        client.get(url, headers=bearer(token)).get_data(as_text=True).strip()
        == "please send the quarterly report to the finance team"
    )
    assert raw_correction(app_rt, job_id).startswith("wqe2:")  # sealed at rest, bound to the row, like the transcript
    assert "quarterly" not in raw_correction(app_rt, job_id)

    again = client.put(url, json={"text": "Second thoughts."}, headers=bearer(token))
    assert again.status_code == 200
    assert again.get_json()["correction"] == {
        **again.get_json()["correction"],
        "text": "Second thoughts.",
        "segments": None,
    }

    for who in (other_token, None):  # another key, or anonymous use: as if it did not exist
        resp = client.put(url, json={"text": "mine now"}, headers=bearer(who))
        assert resp.status_code == 404 and resp.get_json()["error"]["code"] == "not_found"
    assert get_job(app_rt, job_id).correction["text"] == "Second thoughts."


@pytest.mark.parametrize(
    "body, words",
    [
        ({"text": 42}, "text must be the corrected transcript as a non-empty string (got a number)"),
        ({"text": ""}, "got blank text"),
        ({"text": "   \n"}, "got blank text"),
        ({}, "got nothing"),
        ([], "send a JSON object such as"),
        ("the words", "send a JSON object such as"),
        ({"text": "x", "speaker": "A"}, "unknown field(s) 'speaker'"),
        ({"text": "x", "segments": "0-4 s"}, "segments must be a list of objects"),
        ({"text": "x", "segments": [7]}, "segments[0] must be an object"),
        ({"text": "x", "segments": [{"start": 0, "text": "x"}]}, "segments[0] lacks end"),
        ({"text": "x", "segments": [{"start": 0, "end": 1, "text": "x", "words": []}]}, "segments[0] has 'words'"),
        ({"text": "x", "segments": [{"start": 2, "end": 1, "text": "x"}]}, "ends (1.0) before it starts (2.0)"),
        ({"text": "x", "segments": [{"start": True, "end": 1, "text": "x"}]}, "segments[0].start must be a number"),
        ({"text": "x", "segments": [{"start": -1, "end": 1, "text": "x"}]}, "segments[0].start must be a number"),
        ({"text": "x", "segments": [{"start": 0, "end": 1, "text": None}]}, "segments[0].text must be a string"),
        ({"text": "x", "segments": [{"start": 0, "end": 9400, "text": "x"}]}, "past the end of the audio"),
        ({"text": "x" * 400_001}, "at most 400000"),
    ],
)
def test_a_bad_correction_is_400_saying_what_to_send(app, app_rt, body, words):
    client = app.test_client()
    job_id = submit(client, "report.opus")["job_id"]
    finish(app_rt, job_id, "the words")
    resp = client.put(f"/v1/jobs/{job_id}/transcript", json=body)
    assert resp.status_code == 400, resp.get_json()
    assert resp.get_json()["error"]["code"] == "invalid_request"
    assert words in resp.get_json()["error"]["message"]
    assert get_job(app_rt, job_id).correction is None


def test_a_correction_needs_json_of_sane_size_and_a_transcript_still_kept(app, app_rt):
    client = app.test_client()
    job_id = submit(client, "report.opus")["job_id"]
    finish(app_rt, job_id, "the words")
    url = f"/v1/jobs/{job_id}/transcript"
    resp = client.put(url, data="the words", content_type="text/plain")
    assert resp.status_code == 415 and "Content-Type: application/json" in resp.get_json()["error"]["message"]
    resp = client.put(url, data="{not json", content_type="application/json")
    assert resp.status_code == 400 and "not valid JSON" in resp.get_json()["error"]["message"]
    huge = json.dumps({"text": "x" * (3 * 1024 * 1024)})
    resp = client.put(url, data=huge, content_type="application/json")
    assert resp.status_code == 413 and "the correction is larger than 2 MiB" in resp.get_json()["error"]["message"]
    long_one = "word " * 60_000  # a long recording's transcript: more than a submission's 64 KiB
    assert client.put(url, json={"text": long_one}).status_code == 200

    with app_rt.db.session() as s:  # retention deleted the transcript (and the correction with it)
        s.get(Job, job_id).result_purged_at = utcnow()
    resp = client.put(url, json={"text": "too late"})
    assert resp.status_code == 409 and resp.get_json()["error"]["code"] == "result_deleted"
    assert "WHISPERQ_RESULT_RETENTION" in resp.get_json()["error"]["message"]
    delete_job(app_rt, job_id)
    assert client.put(url, json={"text": "gone"}).status_code == 404


def test_deleting_a_job_or_its_transcript_deletes_its_correction(app, app_rt):
    from models.maintenance.retention import run_retention

    client = app.test_client()
    deleted, purged, kept = (submit(client, "report.opus")["job_id"] for _ in range(3))
    for job_id in (deleted, purged, kept):
        finish(app_rt, job_id, "the words")
        assert client.put(f"/v1/jobs/{job_id}/transcript", json={"text": "The words."}).status_code == 200
    delete_job(app_rt, deleted)
    with app_rt.db.session() as s:
        s.get(Job, purged).finished_at = utcnow() - timedelta(days=8)
    week = dataclasses.replace(app_rt.settings, audio_retention_seconds=None, result_retention_seconds=7 * 86400.0)
    rt_week = type(app_rt)(week)
    try:
        assert run_retention(rt_week)["results_purged"] == 1
    finally:
        rt_week.db.dispose()
    assert raw_correction(app_rt, deleted) is None and raw_correction(app_rt, purged) is None
    assert raw_correction(app_rt, kept) is not None
    assert get_job(app_rt, purged).to_dict()["correction"] is None
    assert get_job(app_rt, kept).to_dict()["correction"]["text"] == "The words."


def test_key_rotation_reencrypts_corrections(app, app_rt):
    import base64
    import os

    from models.maintenance.rotation import rotate, usage
    from models.security import crypto

    client = app.test_client()
    job_id = submit(client, "report.opus")["job_id"]
    finish(app_rt, job_id, "the words")
    assert client.put(f"/v1/jobs/{job_id}/transcript", json={"text": "The corrected words."}).status_code == 200
    before = crypto.current_keyring()
    old = before.active
    new = f"n{uuid.uuid4().hex[:6]}:{base64.b64encode(os.urandom(32)).decode()}"
    crypto.set_keyring(
        crypto.Keyring(tuple(crypto.parse_keys(new)) + tuple(crypto.parse_keys(os.environ["WHISPERQ_ENCRYPTION_KEYS"])))
    )
    try:
        assert usage(app_rt).transcripts[old] == 1
        report = rotate(app_rt)
        assert report.failures == [] and report.transcripts_rewritten == 1
        assert crypto.value_key_id(raw_correction(app_rt, job_id)) == crypto.current_keyring().active
        assert crypto.value_is_bound(raw_correction(app_rt, job_id))
        assert usage(app_rt).transcripts == {crypto.current_keyring().active: 1}
        assert get_job(app_rt, job_id).correction["text"] == "The corrected words."
    finally:
        crypto.set_keyring(before)


# --- export ---------------------------------------------------------------------------------


def test_the_export_is_an_audiofolder_that_datasets_reads(app, app_rt, tmp_path, monkeypatch):
    from models.maintenance.retention import run_retention

    client = app.test_client()
    _key, token = make_key(app_rt, "collector", collect=True)
    corrected = submit(client, "report.opus", collect="true")["job_id"]
    plain = submit(client, "fox.flac", token=token)["job_id"]  # its key collects
    not_collected = submit(client, "fox.flac")["job_id"]
    deleted = submit(client, "report.opus", collect="true")["job_id"]
    retained = submit(client, "fox.flac", collect="true")["job_id"]
    submit(client, "fox.flac", collect="true")  # never finished: the export's "1 not completed"
    for job_id in (corrected, plain, not_collected, deleted, retained):
        finish(app_rt, job_id, CLIPS["report.opus" if job_id in (corrected, deleted) else "fox.flac"]["text"])
    fixed = (
        "Please send the quarterly report to the finance team before Friday afternoon. We will review the "
        "numbers together on Monday morning and decide on the budget for next year."
    )
    assert client.put(f"/v1/jobs/{corrected}/transcript", json={"text": fixed}).status_code == 200
    assert client.delete(f"/v1/jobs/{deleted}").status_code == 204
    with app_rt.db.session() as s:  # ended two hours ago: retention (WHISPERQ_AUDIO_RETENTION=1h) deletes its audio
        s.get(Job, retained).finished_at = utcnow() - timedelta(hours=2)
    assert run_retention(app_rt)["audio_purged"] == 1

    out = tmp_path / "export"
    result = whisperq(app_rt, "dataset", "export", str(out))
    assert result.exit_code == 0, result.output
    assert "exported 2 jobs" in result.output and "1 corrected" in result.output
    assert "skipped 3 collected jobs" in result.output
    assert "1 deleted" in result.output and "1 audio deleted by retention" in result.output
    assert "1 not completed" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["data", "metadata.jsonl"]
    assert sorted(p.name for p in (out / "data").iterdir()) == sorted([f"{corrected}.wav", f"{plain}.wav"])
    lines = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    by_job = {line["job_id"]: line for line in lines}
    assert set(by_job) == {corrected, plain}
    assert by_job[corrected] == {
        **by_job[corrected],
        "file_name": f"data/{corrected}.wav",
        "transcription": fixed,
        "original_transcription": CLIPS["report.opus"]["text"],
        "corrected": True,
        "language": "en",
        "model": "tiny.en",
        "model_version": "sha256:0123abcd",
    }
    assert by_job[plain]["transcription"] == by_job[plain]["original_transcription"] == CLIPS["fox.flac"]["text"]
    assert by_job[plain]["corrected"] is False
    for line in lines:
        with wave.open(str(out / line["file_name"]), "rb") as w:
            assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
            seconds = w.getnframes() / 16000
        assert seconds == pytest.approx(line["duration"], abs=0.001)
        assert seconds == pytest.approx(get_job(app_rt, line["job_id"]).audio_duration, abs=0.1)

    # The Hugging Face datasets library reads it as it is, offline; decoding the audio would
    # need torchcodec, so the files are read as bytes and checked with `wave`.
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)  # read once, when datasets is imported
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    loaded = datasets.load_dataset("audiofolder", data_dir=str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert loaded.num_rows == 2
    assert {"audio", "transcription", "original_transcription", "corrected", "job_id"} <= set(loaded.column_names)
    rows = {row["job_id"]: row for row in loaded.cast_column("audio", datasets.Audio(decode=False))}
    assert rows[corrected]["transcription"] == fixed and rows[corrected]["corrected"] is True
    assert rows[plain]["transcription"] == CLIPS["fox.flac"]["text"]
    for job_id, row in rows.items():
        with wave.open(io.BytesIO(row["audio"]["bytes"]) if row["audio"]["bytes"] else row["audio"]["path"]) as w:
            assert (w.getframerate(), w.getnchannels()) == (16000, 1)
            assert w.getnframes() / 16000 == pytest.approx(get_job(app_rt, job_id).audio_duration, abs=0.1)


def test_export_filters_and_refuses_to_mix_with_other_files(app, app_rt, tmp_path):
    client = app.test_client()
    corrected, plain = (submit(client, clip, collect="true")["job_id"] for clip in ("report.opus", "fox.flac"))
    for job_id in (corrected, plain):
        finish(app_rt, job_id, "the words")
    assert client.put(f"/v1/jobs/{corrected}/transcript", json={"text": "The words."}).status_code == 200
    out = tmp_path / "export"

    def exported(*args: str) -> set[str]:
        result = whisperq(app_rt, "dataset", "export", str(out), "--overwrite", *args)
        assert result.exit_code == 0, result.output
        return {json.loads(line)["job_id"] for line in (out / "metadata.jsonl").read_text().splitlines()}

    assert exported() == {corrected, plain}
    assert exported("--corrected-only") == {corrected}
    assert sorted(p.name for p in (out / "data").iterdir()) == [f"{corrected}.wav"]  # the earlier export replaced
    assert exported("--model", "tiny.en") == {corrected, plain}
    assert exported("--model", "base") == set()
    assert exported("--since", "2000-01-01") == {corrected, plain}
    assert exported("--since", (utcnow() + timedelta(days=1)).date().isoformat()) == set()

    bad = whisperq(app_rt, "dataset", "export", str(out), "--since", "last tuesday")
    assert bad.exit_code == 2 and "such as 2026-11-01" in bad.output
    again = whisperq(app_rt, "dataset", "export", str(out))
    assert again.exit_code == 1 and "is not empty" in again.output and "--overwrite" in again.output
    (out / "notes.txt").write_text("mine")
    mixed = whisperq(app_rt, "dataset", "export", str(out), "--overwrite")
    assert mixed.exit_code == 1 and "'notes.txt', which an export does not write" in mixed.output
    assert (out / "notes.txt").read_text() == "mine" and (out / "metadata.jsonl").exists()
    a_file = tmp_path / "export.tar"
    a_file.write_text("")
    onto_file = whisperq(app_rt, "dataset", "export", str(a_file))
    assert onto_file.exit_code == 1 and "is a file" in onto_file.output


def test_a_crash_leaves_no_index_naming_missing_files(app, app_rt, tmp_path, monkeypatch):
    from models.maintenance import dataset

    client = app.test_client()
    first, second = (submit(client, "report.opus", collect="true")["job_id"] for _ in range(2))
    for job_id in (first, second):
        finish(app_rt, job_id, "the words")
    calls = []
    real = dataset._write_wav

    def crash_on_second(dest, samples):
        calls.append(dest)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", str(dest))
        real(dest, samples)

    monkeypatch.setattr(dataset, "_write_wav", crash_on_second)
    out = tmp_path / "export"
    result = whisperq(app_rt, "dataset", "export", str(out))
    assert result.exit_code == 1 and "No space left on device" in result.output
    assert not (out / "metadata.jsonl").exists() and not (out / dataset.PARTIAL).exists()
    monkeypatch.setattr(dataset, "_write_wav", real)
    assert whisperq(app_rt, "dataset", "export", str(out), "--overwrite").exit_code == 0
    assert len((out / "metadata.jsonl").read_text().splitlines()) == 2
