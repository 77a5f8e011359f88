"""The sealed file format (models.security.sealed): a round trip at every size, seeking,
PyAV reading through it, tampering and unknown keys detected, a failed writer leaving nothing,
a file bound to its storage reference, the first format still read, and a plaintext file in
the store refused unless allowed."""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path

import pytest
from helpers import CLIPS
from keyrings import FOX, KIB, A, B, assert_not_plain, key, ring, seal

from models.security import crypto
from models.security.crypto import DecryptionError
from models.security.sealed import BINDING_BYTES, CHUNK_BYTES, MAGIC, EncryptedWriter, open_decrypted

pytestmark = pytest.mark.usefixtures("keyring_restored")  # tests here switch the process's keys


@pytest.mark.parametrize("size", [0, 1, 64 * KIB - 1, 64 * KIB, 64 * KIB + 1, 3 * 64 * KIB, 3_000_017])
def test_round_trip(tmp_path, size):
    keys = ring(A)
    data = os.urandom(size)
    path = seal(tmp_path / "f", data, keys, step=max(1, size // 7 or 1))
    chunks = max(1, -(-size // CHUNK_BYTES))
    assert path.stat().st_size == len(MAGIC) + 1 + 1 + 16 + 7 + BINDING_BYTES + size + 16 * chunks
    assert_not_plain(path, data if size >= 64 else None)
    with open_decrypted(path, keys) as fh:
        assert fh.read() == data
        assert fh.seek(0, io.SEEK_END) == size
    assert [p.name for p in tmp_path.iterdir()] == ["f"]  # no temporary part left


def test_seek_anywhere(tmp_path):
    keys = ring(A)
    data = os.urandom(5 * CHUNK_BYTES + 123)
    import random

    rnd = random.Random(7)
    with open_decrypted(seal(tmp_path / "f", data, keys), keys) as fh:
        for _ in range(200):
            pos, n = rnd.randrange(len(data) + 10), rnd.randrange(1, 3 * CHUNK_BYTES)
            fh.seek(pos)
            assert fh.read(n) == data[pos : pos + n]
            assert fh.tell() == min(len(data), pos + n) if pos <= len(data) else True
        fh.seek(-100, io.SEEK_END)
        assert fh.read() == data[-100:]
        fh.seek(CHUNK_BYTES - 3)
        fh.seek(10, io.SEEK_CUR)
        assert fh.read(5) == data[CHUNK_BYTES + 7 : CHUNK_BYTES + 12]


def test_pyav_reads_an_mp4_whose_index_is_at_the_end(tmp_path):
    """An M4A as most encoders write it (moov after mdat): PyAV must seek to read it."""
    import av
    import numpy as np

    from models.speech import audio

    samples = audio.decode(CLIPS["fox.flac"]["path"])
    plain = tmp_path / "fox.m4a"
    with av.open(str(plain), "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(samples[None, :].astype(np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    data = plain.read_bytes()
    assert data.index(b"moov") > data.index(b"mdat")
    keys = ring(A)
    path = seal(tmp_path / "sealed.m4a", data, keys)
    with open_decrypted(path, keys) as fh:
        info = audio.probe(fh)
    assert info.codec == "aac" and info == audio.probe(plain)  # AAC adds priming samples: compare with the plain file
    with open_decrypted(path, keys) as fh:
        assert np.array_equal(audio.decode(fh), audio.decode(plain))


def _sealed_file(tmp_path, keys, chunks: int = 4) -> tuple[Path, bytes]:
    data = os.urandom(chunks * CHUNK_BYTES - 1000)
    return seal(tmp_path / "f", data, keys), data


def _read_all(path, keys) -> bytes:
    with open_decrypted(path, keys) as fh:
        return fh.read()


@pytest.mark.parametrize(
    "damage",
    [
        "flip-body",
        "flip-header",
        "flip-tag",
        "truncate-chunk",
        "truncate-bytes",
        "swap",
        "drop-middle",
        "append",
        "splice",
    ],
)
def test_tampering_is_detected(tmp_path, damage):
    keys = ring(A)
    path, _ = _sealed_file(tmp_path, keys)
    raw = bytearray(path.read_bytes())
    header, sealed = len(MAGIC) + 1 + 1 + 16 + 7 + BINDING_BYTES, CHUNK_BYTES + 16
    body = [bytes(raw[header + i * sealed : header + (i + 1) * sealed]) for i in range(4)]
    if damage == "flip-body":
        raw[header + sealed + 500] ^= 0x01
    elif damage == "flip-header":
        raw[len(MAGIC) + 3] ^= 0x80  # the salt
    elif damage == "flip-tag":
        raw[header + sealed - 1] ^= 0x01
    elif damage == "truncate-chunk":  # a whole number of chunks: only the last-chunk flag tells
        raw = raw[: header + 2 * sealed]
    elif damage == "truncate-bytes":
        raw = raw[:-7]
    elif damage == "swap":
        raw = raw[:header] + body[1] + body[0] + body[2] + body[3]
    elif damage == "drop-middle":
        raw = raw[:header] + body[0] + body[2] + body[3]
    elif damage == "append":
        raw = raw + body[1]
    elif damage == "splice":  # a chunk from another file under the same key
        (tmp_path / "other").mkdir()
        o = _sealed_file(tmp_path / "other", keys)[0].read_bytes()
        raw = raw[: header + sealed] + o[header + sealed : header + 2 * sealed] + raw[header + 2 * sealed :]
    path.write_bytes(bytes(raw))
    with pytest.raises(DecryptionError, match=r"failed authentication|truncated") as err:
        _read_all(path, keys)
    assert str(path) in str(err.value)


def test_an_unknown_key_id_is_named(tmp_path):
    path, _ = _sealed_file(tmp_path, ring(A), chunks=1)
    with pytest.raises(DecryptionError) as err:
        _read_all(path, ring(B))
    assert err.value.missing_key and err.value.key_id == "a"
    assert "key id 'a', which is not configured" in str(err.value) and str(path) in str(err.value)
    # The same id with other key material: authentication fails, it does not decrypt to junk.
    with pytest.raises(DecryptionError, match="failed authentication"):
        _read_all(path, ring(key("a")))


def test_a_writer_that_fails_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError), EncryptedWriter(tmp_path / "f", ring(A)) as out:
        out.write(b"x" * 100_000)
        raise RuntimeError("the source broke")
    assert list(tmp_path.iterdir()) == []


def test_a_plain_file_in_the_store_is_refused_unless_allowed(tmp_path):
    from models.security.sealed import open_stored

    plain = tmp_path / "audio.flac"
    plain.write_bytes(FOX)
    with pytest.raises(crypto.PlaintextRefused, match=r"stored file x is plaintext.*WHISPERQ_ALLOW_PLAINTEXT_ROWS=1"):
        open_stored(plain, ring(A), what="stored file x")
    with open_stored(plain, dataclasses.replace(ring(A), allow_plaintext=True)) as fh:
        assert fh.read() == FOX
    sealed = seal(tmp_path / "sealed", FOX, ring(A))
    with open_stored(sealed, ring(A)) as fh:
        assert fh.read() == FOX


def legacy_seal(path: Path, data: bytes, keyring) -> Path:
    """A file in the first format (b"WQENC1", no binding), as versions before the binding wrote."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from models.security.sealed import LEGACY_MAGIC, _nonce

    salt, prefix = os.urandom(16), os.urandom(7)
    kid = keyring.active.encode()
    header = LEGACY_MAGIC + bytes([len(kid)]) + kid + salt + prefix
    aead = AESGCM(keyring.file_key(keyring.active, salt, "test"))
    chunks = [data[i : i + CHUNK_BYTES] for i in range(0, len(data), CHUNK_BYTES)] or [b""]
    if len(chunks[-1]) == CHUNK_BYTES:
        chunks.append(b"")
    body = [aead.encrypt(_nonce(prefix, i, i == len(chunks) - 1), c, header) for i, c in enumerate(chunks)]
    path.write_bytes(header + b"".join(body))
    return path


def test_a_file_opens_only_under_the_reference_it_is_bound_to(tmp_path):
    from models.security.sealed import bind, open_stored

    keys = ring(A)
    ref, other = "audio/0f/0f0e0d0c-0000-4000-8000-000000000001", "audio/aa/aa0e0d0c-0000-4000-8000-000000000002"
    written = EncryptedWriter(tmp_path / "bound", keys, ref=ref)
    with written as out:
        out.write(FOX)
    with open_stored(tmp_path / "bound", keys, ref=ref) as fh:
        assert fh.read() == FOX
    with pytest.raises(DecryptionError, match=f"is not bound to '{other}'.*not this job's file"):
        open_stored(tmp_path / "bound", keys, ref=other)

    spool = seal(tmp_path / "spool", FOX, keys)  # written before its name is known: unbound
    with pytest.raises(DecryptionError, match="is not bound"):
        open_stored(spool, keys, ref=ref)
    with open_stored(spool, keys) as fh:  # a spool is read back without a reference
        assert fh.read() == FOX
    bind(spool, ref, keys)
    with open_stored(spool, keys, ref=ref) as fh:
        assert fh.read() == FOX
    with pytest.raises(DecryptionError, match="is not bound"):
        open_stored(spool, keys, ref=other)

    # the binding cannot be moved from one file to another: each is keyed by its own salt
    donor = (tmp_path / "bound").read_bytes()
    start = len(MAGIC) + 1 + 1 + 16 + 7
    forged = tmp_path / "forged"
    forged.write_bytes(seal(tmp_path / "x", b"other audio" * 999, keys).read_bytes())
    bind(forged, other, keys)
    mixed = bytearray(forged.read_bytes())
    mixed[start : start + BINDING_BYTES] = donor[start : start + BINDING_BYTES]
    forged.write_bytes(bytes(mixed))
    with pytest.raises(DecryptionError, match="is not bound"):
        open_stored(forged, keys, ref=ref)


def test_a_file_of_the_first_format_still_opens(tmp_path):
    from models.security.sealed import bind, file_key_id, open_stored

    keys = ring(A)
    data = os.urandom(3 * CHUNK_BYTES + 5)
    old = legacy_seal(tmp_path / "old", data, keys)
    assert file_key_id(old) == "a"
    bind(old, "audio/0f/0f0e0d0c-0000-4000-8000-000000000001", keys)  # nothing to bind: left as it is
    with open_stored(old, keys, ref="audio/0f/0f0e0d0c-0000-4000-8000-000000000001") as fh:
        assert fh.read() == data
