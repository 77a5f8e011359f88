"""Keys, keyrings and sealed files for the encryption tests (test_sealed, test_crypto,
test_sealed_storage, test_key_rotation, test_encryption); conftest.py loads its fixtures:
keyring_restored (the process's keyring back after a test that switches it) and private_rt
(runtimes on a data dir and database of the test's own, under the keys asked for)."""

from __future__ import annotations

import base64
import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from helpers import CLIPS

if TYPE_CHECKING:  # the product's modules are imported when used: conftest loads this before it configures the run
    from models.security.crypto import Keyring

FOX = CLIPS["fox.flac"]["path"].read_bytes()
PLAIN_MAGIC = (b"RIFF", b"ID3", b"fLaC", b"OggS", b"\x93NUMPY", b"\xff\xfb", b"\xff\xf1")
KIB = 1024


def key(key_id: str) -> str:
    return f"{key_id}:{base64.b64encode(os.urandom(32)).decode()}"


def ring(*entries: str) -> Keyring:
    from models.security.crypto import Keyring, parse_keys

    return Keyring(tuple(parse_keys(",".join(entries))))


A, B = key("a"), key("b")


@pytest.fixture()
def keyring_restored():
    """For tests that switch the process's keys: the next test gets the suite's back."""
    from models.security import crypto

    before = crypto._current
    yield
    crypto.set_keyring(before)


def seal(path: Path, data: bytes, keyring: Keyring, step: int = 10_000) -> Path:
    from models.security.sealed import EncryptedWriter

    with EncryptedWriter(path, keyring) as out:
        for n in range(0, len(data), step):
            out.write(data[n : n + step])
    return path


def assert_not_plain(path: Path, plaintext: bytes | None = None) -> None:
    from models.security.sealed import MAGIC

    data = path.read_bytes()
    assert not data.startswith(PLAIN_MAGIC), f"{path} starts like plaintext audio: {data[:8]!r}"
    assert data.startswith(MAGIC), f"{path} is not in the encrypted format"
    if plaintext:
        assert plaintext[:4096] not in data and plaintext[-4096:] not in data


def legacy_token(text_: str, keys, key_id: str = "a") -> str:
    """A ``wqe1`` value, as versions before bound values wrote it."""
    nonce = os.urandom(12)
    sealed = keys.value_cipher(key_id).encrypt(nonce, text_.encode(), f"wqe1:{key_id}".encode())
    return f"wqe1:{key_id}:" + base64.b64encode(nonce + sealed).decode()


@pytest.fixture()
def private_rt(tmp_path, settings):
    """A runtime on its own data dir and database, under key A."""
    from models.runtime import Runtime

    def make(keys: str | None = A, allow_plaintext: bool = False) -> Runtime:
        rt = Runtime(
            dataclasses.replace(
                settings,
                data_dir=tmp_path / "data",
                encryption_keys=keys,
                database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
                allow_plaintext_rows=allow_plaintext,
            )
        )
        rt.db.upgrade()
        return rt

    return make
