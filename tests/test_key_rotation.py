"""Key rotation (`whisperq encryption status|rotate`): files and transcripts, plaintext ones from
before encryption and values from before bound values included, re-sealed under the active key;
a file deleted meanwhile is not brought back."""

from __future__ import annotations

import io
import json

import pytest
from helpers import make_job
from keyrings import FOX, A, B, assert_not_plain, key, legacy_token, ring
from sqlalchemy import text

LEGACY = "1e0acb00-0000-4000-8000-000000000000"  # a job from before encryption: its audio kept its suffix

pytestmark = pytest.mark.usefixtures("keyring_restored")  # tests here switch the process's keys


def test_rotation(private_rt, monkeypatch):
    from click.testing import CliRunner

    from models.jobs import operations as jobs
    from models.jobs.record import Job
    from models.pipeline import preparation
    from web.cli import cli

    rt = private_rt(A, allow_plaintext=True)  # rows and a file from before encryption, read to be sealed
    spool = rt.storage.spool(io.BytesIO(FOX))
    job = make_job(rt, spool.path, filename="fox.flac", duration=4.3, language="en", priority="normal")
    spool.release()
    preparation.prepare_job(rt, job.id, job.audio_ref)
    jobs.complete_job(
        rt,
        job.id,
        {
            "text": "the quick brown fox",
            "language": "en",
            "duration": 4.3,
            "segments": [{"start": 0.0, "end": 4.3, "text": "the quick brown fox"}],
        },
    )
    legacy = rt.storage.root / "audio" / "1e" / f"{LEGACY}.flac"  # stored before encryption existed
    legacy.parent.mkdir(parents=True)
    legacy.write_bytes(FOX)
    with rt.db.session() as s:
        s.add(
            Job(
                id=LEGACY,
                audio_ref=f"audio/1e/{LEGACY}.flac",
                priority="normal",
                status="PENDING",
            )
        )
        s.add(Job(id="2e0acb00-0000-4000-8000-000000000000", audio_ref="", priority="normal", status="PENDING"))
    with rt.db.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE jobs SET status = 'COMPLETED', result_text = 'old plain words', "
                "result_segments = '[]' WHERE id LIKE '1e0acb%'"
            )
        )
        # written under key a by a version whose values were not bound to their row
        conn.execute(
            text("UPDATE jobs SET status = 'COMPLETED', result_text = :t WHERE id LIKE '2e0acb%'"),
            {"t": legacy_token("older sealed words", ring(A))},
        )

    env = {"WHISPERQ_DATA_DIR": str(rt.settings.data_dir), "DATABASE_URL": rt.settings.database_url}
    runner = CliRunner()

    def whisperq(*args: str, keys: str, plaintext: str = "1"):
        result = runner.invoke(
            cli,
            ["encryption", *args],
            catch_exceptions=False,
            env={**env, "WHISPERQ_ENCRYPTION_KEYS": keys, "WHISPERQ_ALLOW_PLAINTEXT_ROWS": plaintext},
        )
        return result

    refused = whisperq("rotate", keys=A, plaintext="")  # without the flag, what is plaintext stays unread
    assert refused.exit_code == 1 and refused.output.count("WHISPERQ_ALLOW_PLAINTEXT_ROWS=1") == 2, refused.output
    assert f"{LEGACY}.flac is plaintext" in refused.output and "jobs.result_text of row 1e0acb" in refused.output

    status = json.loads(whisperq("status", "--json", keys=f"{B},{A}").output)
    assert status["active"] == "b" and status["files"] == {"a": 2, "(unencrypted)": 1}
    assert status["transcripts"] == {"a": 2, "(unencrypted)": 1}

    result = whisperq("rotate", keys=f"{B},{A}")
    assert result.exit_code == 0, result.output
    assert "files         3 re-encrypted, 0 already current" in result.output
    assert "transcripts   3 re-encrypted" in result.output
    again = whisperq("rotate", keys=f"{B},{A}")
    assert "0 re-encrypted, 3 already current" in again.output

    status = json.loads(whisperq("status", "--json", keys=B).output)
    assert status["files"] == {"b": 3} and status["transcripts"] == {"b": 3}
    rt_b = private_rt(B)  # the old key and the plaintext flag dropped: everything still reads
    for ref in (job.audio_ref, f"audio/1e/{LEGACY}.flac"):
        assert_not_plain(rt_b.storage.path(ref), FOX)
        with rt_b.storage.open(ref) as fh:
            assert fh.read() == FOX
    assert rt_b.storage.load_samples(f"prepared/{job.id[:2]}/{job.id}.npy").size > 60_000
    assert jobs.get_job(rt_b, job.id).result()["text"] == "the quick brown fox"
    assert jobs.get_job(rt_b, LEGACY).result_text == "old plain words"
    assert jobs.get_job(rt_b, "2e0acb00-0000-4000-8000-000000000000").result_text == "older sealed words"
    with rt_b.db.engine.connect() as conn:  # rewritten bound to their rows
        assert all(
            v.startswith("wqe2:b:")
            for v in conn.execute(text("SELECT result_text FROM jobs WHERE result_text IS NOT NULL")).scalars()
        )

    failing = runner.invoke(cli, ["encryption", "rotate"], env={**env, "WHISPERQ_ENCRYPTION_KEYS": key("c")})
    assert failing.exit_code == 1 and "key id 'b', which is not configured" in failing.output


def test_rotation_does_not_bring_back_a_file_deleted_meanwhile(tmp_path):
    from models.storage.local import _Gone, _replace_if_unchanged

    dest, tmp = tmp_path / "audio.flac", tmp_path / ".audio.flac.part"
    dest.write_bytes(b"old")
    inode = dest.stat().st_ino
    tmp.write_bytes(b"new")
    dest.unlink()  # a DELETE or retention got there first
    with pytest.raises(_Gone):
        _replace_if_unchanged(tmp, dest, inode)
    assert not dest.exists()
    dest.write_bytes(b"old")
    _replace_if_unchanged(tmp, dest, dest.stat().st_ino)
    assert dest.read_bytes() == b"new" and not tmp.exists()
