"""Keys and sealed values (models.security.crypto): parsing WHISPERQ_ENCRYPTION_KEYS, a generated
local key, values bound to their row and column, plaintext refused where a sealed value belongs
unless allowed, and owner tokens only this deployment sealed."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import re

import pytest
from keyrings import A, B, key, legacy_token, ring

from models.security import crypto
from models.security.crypto import DecryptionError, Keyring, decrypt_value, parse_keys

pytestmark = pytest.mark.usefixtures("keyring_restored")  # tests here switch the process's keys


def test_parse_keys():
    raw = os.urandom(32)
    keys = parse_keys(
        f" new:{base64.urlsafe_b64encode(raw).decode().rstrip('=')} , old:{base64.b64encode(raw).decode()}"
    )
    assert keys == [("new", raw), ("old", raw)]
    assert Keyring(tuple(keys)).active == "new"
    for bad, words in [
        ("", "no key given"),
        ("abc", "not KEYID:BASE64KEY"),
        ("a b:" + "A" * 44, "key id"),
        ("a:" + base64.b64encode(os.urandom(16)).decode(), "16 bytes"),
        ("a:!!!!", "not base64"),
        (f"{A},{key('a')}", "appears twice"),
        ("zero:" + base64.b64encode(bytes(32)).decode(), "not random"),  # all zeros: no key at all
        ("abab:" + base64.b64encode(b"ab" * 16).decode(), "not random"),
    ]:
        with pytest.raises(ValueError, match=words) as err:
            parse_keys(bad)
        assert "new-key" in str(err.value) or "twice" in str(err.value) or "key id" in str(err.value)


def test_a_bad_setting_stops_the_process(tmp_path):
    from config import ConfigError, Settings

    with pytest.raises(ConfigError, match=r"WHISPERQ_ENCRYPTION_KEYS: .*whisperq encryption new-key"):
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_ENCRYPTION_KEYS": "k1:c2hvcnQ="})


def test_a_generated_key_is_shared_and_private(tmp_path, settings):
    from concurrent.futures import ThreadPoolExecutor

    local = dataclasses.replace(settings, data_dir=tmp_path, encryption_keys=None)
    with ThreadPoolExecutor(8) as pool:
        rings = list(pool.map(lambda _: crypto.keyring_for(local), range(16)))
    assert len({r.keys for r in rings}) == 1 and rings[0].active.startswith("local-")
    assert (tmp_path / "encryption-key").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["encryption-key"]


def test_values():
    keys = ring(A)
    place = "jobs.result_text:job-1"
    token = crypto.seal_value("the quick brown fox ✓", place, keys)
    assert token.startswith("wqe2:a:") and "fox" not in token
    assert decrypt_value(token, keys, place) == "the quick brown fox ✓"
    assert crypto.seal_value("same", place, keys) != crypto.seal_value("same", place, keys)  # a fresh nonce each time
    with pytest.raises(DecryptionError, match="not a sealed token"):  # a token or nothing
        decrypt_value("written before encryption", keys)
    with pytest.raises(DecryptionError, match=re.escape("jobs.result_text of row job-1 is not a sealed token")):
        decrypt_value("written before encryption", dataclasses.replace(keys, allow_plaintext=True), place)
    assert decrypt_value(legacy_token("an older value", keys), keys) == "an older value"
    with pytest.raises(DecryptionError) as err:
        decrypt_value(token, ring(B), place)
    assert err.value.missing_key
    blob = bytearray(base64.b64decode(token.split(":", 2)[2]))
    blob[-1] ^= 1
    with pytest.raises(DecryptionError, match="failed authentication"):
        decrypt_value("wqe2:a:" + base64.b64encode(bytes(blob)).decode(), keys, place)
    with pytest.raises(DecryptionError, match="failed authentication"):  # the key id is bound to the token
        decrypt_value(token.replace("wqe2:a:", "wqe2:b:"), ring(B, A), place)
    for elsewhere in ("jobs.result_text:job-2", "jobs.result_segments:job-1"):  # another row, another column
        with pytest.raises(DecryptionError, match="copied from another row or column"):
            decrypt_value(token, keys, elsewhere)
    with pytest.raises(DecryptionError, match="failed authentication"):  # nor passes as an unbound one
        decrypt_value(token.replace("wqe2:", "wqe1:"), keys)


def test_swapped_transcripts_fail_to_decrypt(database):
    """Two rows' ciphertexts swapped in the database (or a row's text and segments): each
    read fails authentication instead of showing one job's transcript as another's."""
    from sqlalchemy import text as sql

    from models.jobs.record import Job, new_job_id

    ids = [new_job_id(), new_job_id()]
    with database.session() as s:
        for n, job_id in enumerate(ids):
            job = Job(id=job_id, audio_ref="", status="PENDING", priority="normal")
            job.result_text, job.result_segments = f"words of job {n}", [{"text": f"words of job {n}"}]
            s.add(job)
    try:
        with database.session() as s:
            assert [s.get(Job, i).result_text for i in ids] == ["words of job 0", "words of job 1"]
            raw = {
                i: s.execute(sql("SELECT result_text, result_segments FROM jobs WHERE id = :id"), {"id": i}).one()
                for i in ids
            }
            assert all("words" not in str(v) and str(v[0]).startswith("wqe2:") for v in raw.values())
            s.execute(sql("UPDATE jobs SET result_text = :t WHERE id = :id"), {"t": raw[ids[1]][0], "id": ids[0]})
            s.execute(sql("UPDATE jobs SET result_text = :t WHERE id = :id"), {"t": raw[ids[0]][0], "id": ids[1]})
        for job_id in ids:
            with database.session() as s, pytest.raises(DecryptionError, match="copied from another row or column"):
                _ = s.get(Job, job_id).result_text
        with database.session() as s:  # a row's own text moved into its segments column
            s.execute(
                sql("UPDATE jobs SET result_segments = :t WHERE id = :id"),
                {"t": json.dumps(raw[ids[0]][0]), "id": ids[0]},
            )
        with database.session() as s, pytest.raises(DecryptionError, match="failed authentication"):
            _ = s.get(Job, ids[0]).result_segments
    finally:
        with database.session() as s:
            s.execute(sql("DELETE FROM jobs WHERE id IN (:a, :b)"), {"a": ids[0], "b": ids[1]})


def test_plaintext_where_a_sealed_value_belongs_is_refused_unless_allowed(database):
    """Someone who can write the database but has no key must not be able to plant a
    transcript (or a webhook secret) that reads as genuine: plaintext is refused, except while
    WHISPERQ_ALLOW_PLAINTEXT_ROWS lets rows from before encryption be read (and rotated)."""
    from sqlalchemy import text as sql

    from models.jobs.record import Job, new_job_id

    job_id = new_job_id()
    with database.session() as s:
        s.add(Job(id=job_id, audio_ref="", status="COMPLETED", priority="normal"))
    try:
        with database.engine.begin() as conn:
            conn.execute(
                sql("UPDATE jobs SET result_text = 'planted words', result_segments = '[]' WHERE id = :id"),
                {"id": job_id},
            )
        for column in ("result_text", "result_segments"):
            with database.session() as s:
                with pytest.raises(crypto.PlaintextRefused, match=f"jobs.{column} of row {job_id} is plaintext") as err:
                    getattr(s.get(Job, job_id), column)
                assert "WHISPERQ_ALLOW_PLAINTEXT_ROWS=1" in str(err.value)
                assert "whisperq encryption rotate" in str(err.value)
        crypto.set_keyring(dataclasses.replace(crypto.current_keyring(), allow_plaintext=True))
        with database.session() as s:
            job = s.get(Job, job_id)
            assert (job.result_text, job.result_segments) == ("planted words", [])
    finally:
        with database.session() as s:
            s.execute(sql("DELETE FROM jobs WHERE id = :id"), {"id": job_id})


def test_the_plaintext_flag_comes_from_the_settings(tmp_path):
    from config import Settings

    for env, allowed in (({}, False), ({"WHISPERQ_ALLOW_PLAINTEXT_ROWS": "1"}, True)):
        s = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_ENCRYPTION_KEYS": A, **env})
        assert s.allow_plaintext_rows is allowed and crypto.keyring_for(s).allow_plaintext is allowed


def test_a_plaintext_owner_token_names_no_one():
    """A raw broker message's owner_token must be one this deployment sealed for that job: a
    plain key id in its place would let any producer act as any key."""
    from models.errors import InvalidRequest
    from models.pipeline.door import owner_from_token, owner_token

    crypto.set_keyring(dataclasses.replace(ring(A), allow_plaintext=True))  # not even while rows may be plain
    assert owner_from_token("job-1", owner_token("job-1", "key-1")) == "key-1"
    with pytest.raises(InvalidRequest, match="not issued by this deployment"):
        owner_from_token("job-1", "key-1")


def test_a_sealed_value_needs_its_row_id():
    from models.jobs.record import Job

    with pytest.raises(ValueError, match="set the row's id before result_text"):
        Job(audio_ref="").result_text = "words"
