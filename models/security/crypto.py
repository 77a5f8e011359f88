"""Encryption at rest: the keys, and the transcripts' column types.

WHISPERQ_ENCRYPTION_KEYS holds ``KEYID:BASE64KEY`` entries separated by commas; the first
is the active key (it encrypts), every key decrypts, so a key is rotated by putting a new
one first, restarting, running ``whisperq encryption rotate`` and then dropping the old
one. Without the variable a key is generated once into the data dir (fine for one machine,
not for production: the key then sits beside the data it protects).

Files use a chunked AES-256-GCM format (models.security.sealed); database values are single
AES-256-GCM tokens ``wqe2:KEYID:base64(nonce || ciphertext)`` whose associated data names
the value's place (table, column and row id, see :func:`seal_value`): a token copied into
another row or column fails authentication. ``wqe1:`` tokens, written before values were
bound to their place, still decrypt; ``whisperq encryption rotate`` rewrites them bound.
A plaintext value where a sealed one belongs, or a plain file in the store, is refused
(:class:`PlaintextRefused`) unless WHISPERQ_ALLOW_PLAINTEXT_ROWS is set: that is for data
written before encryption existed; set it, run ``whisperq encryption rotate``, then unset it.
Each master key is split with HKDF into a value key and per-file keys, so no two uses share
a key and nonce.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from config.keys import KEY_BYTES, KEY_ID, parse_keys  # parse_keys is also part of this API

if TYPE_CHECKING:
    from config import Settings

log = logging.getLogger(__name__)

VALUE_PREFIX = "wqe1:"  # a value not bound to its place (written by earlier versions)
BOUND_PREFIX = "wqe2:"  # a value bound to its table, column and row
KEY_FILE = "encryption-key"


class DecryptionError(ValueError):
    """Stored data could not be decrypted: tampered, truncated, or under a key this
    process does not have. ``key_id`` is set when the key is the problem."""

    def __init__(self, message: str, *, key_id: str | None = None, missing_key: bool = False):
        super().__init__(message)
        self.key_id = key_id
        self.missing_key = missing_key


class PlaintextRefused(DecryptionError):
    """Plaintext where sealed data belongs: written before encryption, or put there by someone
    who could write the database or the store but has no key."""

    def __init__(self, what: str):
        super().__init__(
            f"{what} is plaintext where sealed data belongs, and is refused. If it was written before "
            "encryption, set WHISPERQ_ALLOW_PLAINTEXT_ROWS=1, run `whisperq encryption rotate` (it seals it), "
            "then unset WHISPERQ_ALLOW_PLAINTEXT_ROWS"
        )


def new_key_line(key_id: str | None = None) -> str:
    """A fresh ``KEYID:BASE64`` entry for WHISPERQ_ENCRYPTION_KEYS."""
    key_id = key_id or "k" + secrets.token_hex(4)
    if not KEY_ID.match(key_id):
        raise ValueError(f"key id {key_id!r} must be 1 to 32 letters, digits, '-' or '_'")
    return f"{key_id}:{base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()}"


def _derive(key: bytes, info: bytes, salt: bytes | None = None) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=salt, info=info).derive(key)


@dataclass(frozen=True)
class Keyring:
    """The keys in force: `active` encrypts, any of `keys` decrypts."""

    keys: tuple[tuple[str, bytes], ...] = field(repr=False)  # never print key material
    source: str = "WHISPERQ_ENCRYPTION_KEYS"
    # WHISPERQ_ALLOW_PLAINTEXT_ROWS: values and files written before encryption read as they are.
    allow_plaintext: bool = False

    def check_plaintext(self, what: str) -> None:
        """PlaintextRefused unless plaintext (data from before encryption) is allowed now."""
        if not self.allow_plaintext:
            raise PlaintextRefused(what)

    @property
    def active(self) -> str:
        return self.keys[0][0]

    @property
    def ids(self) -> list[str]:
        return [key_id for key_id, _ in self.keys]

    def key(self, key_id: str, what: str = "the data") -> bytes:
        for kid, key in self.keys:
            if kid == key_id:
                return key
        raise DecryptionError(
            f"{what} is encrypted with key id {key_id!r}, which is not configured ({self.source} has "
            f"{', '.join(self.ids)}); add that key after the active one in WHISPERQ_ENCRYPTION_KEYS",
            key_id=key_id,
            missing_key=True,
        )

    def file_key(self, key_id: str, salt: bytes, what: str, purpose: bytes = b"whisperq file v1") -> bytes:
        return _derive(self.key(key_id, what), purpose, salt)

    def mac_key(self, key_id: str) -> bytes:
        """The key that signs the messages the service sends itself (models.security.signing)."""
        cache: dict[str, bytes] = self.__dict__.setdefault("_mac_keys", {})
        if key_id not in cache:
            cache[key_id] = _derive(self.key(key_id, "a message"), b"whisperq message v1")
        return cache[key_id]

    def value_cipher(self, key_id: str, what: str = "a stored transcript") -> AESGCM:
        cache: dict[str, AESGCM] = self.__dict__.setdefault("_value_ciphers", {})
        if key_id not in cache:
            cache[key_id] = AESGCM(_derive(self.key(key_id, what), b"whisperq value v1"))
        return cache[key_id]


_current: Keyring | None = None
_lock = threading.Lock()
_warned: set[str] = set()


def keyring_for(settings: Settings) -> Keyring:
    """The settings' keys, or else the key generated once into the data dir."""
    allow_plaintext = bool(getattr(settings, "allow_plaintext_rows", False))
    if settings.encryption_keys:
        return Keyring(tuple(parse_keys(settings.encryption_keys)), allow_plaintext=allow_plaintext)
    from config.files import generated_secret

    path = Path(settings.data_dir) / KEY_FILE
    generated_secret(path, lambda: new_key_line("local-" + secrets.token_hex(4)))
    if str(path) not in _warned:
        _warned.add(str(path))
        log.warning(
            "WHISPERQ_ENCRYPTION_KEYS is not set: audio and transcripts are encrypted with a key generated "
            "into %s, beside the data; in production set WHISPERQ_ENCRYPTION_KEYS from a secret store",
            path,
        )
    try:
        return Keyring(tuple(parse_keys(path.read_text().strip())), source=str(path), allow_plaintext=allow_plaintext)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def set_keyring(keyring: Keyring) -> None:
    global _current
    _current = keyring


def current_keyring() -> Keyring:
    """This process's keys (set where the Runtime is built; else from the environment)."""
    global _current
    if _current is None:
        with _lock:
            if _current is None:
                from config import Settings

                _current = keyring_for(Settings.from_env())
    return _current


def seal_value(text: str, place: str, keyring: Keyring | None = None) -> str:
    """A ``wqe2`` token for `text` stored at `place` ("table.column:row-id"): the place is the
    associated data, so the token decrypts there and nowhere else."""
    keyring = keyring or current_keyring()
    key_id = keyring.active
    nonce = secrets.token_bytes(12)
    sealed = keyring.value_cipher(key_id).encrypt(nonce, text.encode("utf-8"), _bound_aad(key_id, place))
    return f"{BOUND_PREFIX}{key_id}:{base64.b64encode(nonce + sealed).decode()}"


def _bound_aad(key_id: str, place: str) -> bytes:
    return f"{BOUND_PREFIX}{key_id}:{place}".encode()


def value_key_id(value: object) -> str | None:
    """The key id of an encrypted value; None for a value stored before encryption."""
    if isinstance(value, str) and value.startswith((VALUE_PREFIX, BOUND_PREFIX)):
        return value[len(VALUE_PREFIX) :].split(":", 1)[0]
    return None


def value_is_bound(value: object) -> bool:
    """Whether an encrypted value is bound to its place (False for plain and ``wqe1`` values)."""
    return isinstance(value, str) and value.startswith(BOUND_PREFIX)


def decrypt_value(value: str, keyring: Keyring | None = None, place: str | None = None) -> str:
    """The text of a token. A bound (``wqe2``) token needs the `place` it was sealed for. A
    value that is no token is refused whatever the settings: a plaintext column value is
    :class:`SealedAttribute`'s to allow, and a token from outside (an owner token in a broker
    message) must never pass as plaintext."""
    key_id = value_key_id(value)
    if key_id is None:
        where = f" at {place.split(':', 1)[0]} of row {place.split(':', 1)[-1]}" if place else ""
        raise DecryptionError(f"the value{where} is not a sealed token; plaintext is not accepted here")
    keyring = keyring or current_keyring()
    bound = value_is_bound(value)
    if bound and place is None:
        raise ValueError("a bound value needs the place it was stored at to be decrypted")
    try:
        blob = base64.b64decode(value.split(":", 2)[2], validate=True)
        aad = _bound_aad(key_id, cast(str, place)) if bound else f"{VALUE_PREFIX}{key_id}".encode()  # checked above
        return keyring.value_cipher(key_id).decrypt(blob[:12], blob[12:], aad).decode("utf-8")
    except DecryptionError:
        raise
    except Exception:
        where = f" at {place.split(':', 1)[0]} of row {place.split(':', 1)[-1]}" if place else ""
        raise DecryptionError(
            f"a stored value{where} under key id {key_id!r} failed authentication (it was altered, "
            "copied from another row or column, or belongs to another key with the same id)",
            key_id=key_id,
        ) from None


class SealedAttribute:
    """The plaintext view of a mapped column that holds a bound token: reading decrypts
    (once per token), writing seals the value for its table, column and row. The row's id
    must be set before the value is. A plaintext value (stored before encryption) is refused
    unless WHISPERQ_ALLOW_PLAINTEXT_ROWS is set (Keyring.allow_plaintext).

        result_text_token: Mapped[str | None] = mapped_column("result_text", Text)
        result_text = SealedAttribute("result_text_token", "jobs.result_text")
    """

    def __init__(self, raw: str, place: str, as_json: bool = False, key: str = "id"):
        self.raw, self.place, self.as_json, self.key = raw, place, as_json, key

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def _place(self, obj: Any) -> str:
        row = getattr(obj, self.key, None)
        if row is None:
            raise ValueError(f"set the row's {self.key} before {self.name}: the value is sealed to its row")
        return f"{self.place}:{row}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        token = getattr(obj, self.raw)
        cache = obj.__dict__.setdefault("_sealed_plain", {})
        hit = cache.get(self.name)
        if hit is not None and hit[0] is token:
            return hit[1]
        if isinstance(token, str) and value_key_id(token) is not None:
            text = decrypt_value(token, place=self._place(obj))
            value = json.loads(text) if self.as_json else text
        else:
            if token is not None:  # a value written before encryption, or by someone without the key
                current_keyring().check_plaintext(f"{self.place} of row {getattr(obj, self.key, None)}")
            value = token
        cache[self.name] = (token, value)
        return value

    def __set__(self, obj: Any, value: Any) -> None:
        if value is None:
            token = None
        else:
            text = json.dumps(value, ensure_ascii=False) if self.as_json else value
            token = seal_value(text, self._place(obj))
        setattr(obj, self.raw, token)
        obj.__dict__.setdefault("_sealed_plain", {})[self.name] = (token, value)


__all__ = [
    "DecryptionError",
    "Keyring",
    "PlaintextRefused",
    "SealedAttribute",
    "current_keyring",
    "decrypt_value",
    "keyring_for",
    "new_key_line",
    "parse_keys",
    "seal_value",
    "set_keyring",
    "value_is_bound",
    "value_key_id",
]
