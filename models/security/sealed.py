"""Encrypted files: chunked AES-256-GCM, the STREAM construction (as Tink's streaming
AEAD and age use), readable with random access, each bound to the name it is stored under.

    header  = b"WQENC2" || len(key id) (1 byte) || key id || salt (16) || nonce prefix (7)
    binding = HMAC-SHA256(bind key, header || storage reference) (32 bytes; zeros until bound)
    chunk i = AES-256-GCM(file key, nonce = prefix || i (4 bytes, big-endian) || last (1 byte),
                          64 KiB of plaintext (the last chunk 0..64 KiB), associated data = header)
    file key = HKDF-SHA256(master key, salt, "whisperq file v1")
    bind key = HKDF-SHA256(master key, salt, "whisperq file ref v2")

Each chunk is authenticated with its position and whether it is the last, and the header
(key id, salt) with every chunk, so altering, reordering, truncating or extending a file,
or splicing two files, fails authentication. The plaintext size follows from the file size,
which is what makes seeking possible without reading the whole file (PyAV seeks, e.g. to
an MP4's index at the end).

The binding ties a stored file to its reference (`audio/ab/<job id>`): a file copied or
moved under another job's name does not open there. A spool is written before its name is
known, so its binding is filled in (`bind`) as the store takes it. Files of the first format
(b"WQENC1", no binding) still open; key rotation rewrites them bound.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from models.security.crypto import DecryptionError, Keyring, current_keyring

MAGIC = b"WQENC2"
LEGACY_MAGIC = b"WQENC1"  # the first format: no binding
CHUNK_BYTES = 64 * 1024
TAG_BYTES = 16
SALT_BYTES = 16
PREFIX_BYTES = 7
BINDING_BYTES = 32
UNBOUND = bytes(BINDING_BYTES)
_SEALED = CHUNK_BYTES + TAG_BYTES


def _nonce(prefix: bytes, index: int, last: bool) -> bytes:
    return prefix + index.to_bytes(4, "big") + (b"\x01" if last else b"\x00")


@dataclass(frozen=True)
class Header:
    key_id: str
    salt: bytes
    prefix: bytes
    header: bytes  # what every chunk is authenticated with
    binding: bytes | None  # None in the first format

    @property
    def data_offset(self) -> int:
        """Where the first chunk starts."""
        return len(self.header) + (0 if self.binding is None else BINDING_BYTES)


def _read_header(fh: IO[bytes], what: str) -> Header | None:
    """The file's header, or None for a file that is not encrypted."""
    start = fh.read(len(MAGIC) + 1)
    if start[: len(MAGIC)] not in (MAGIC, LEGACY_MAGIC):
        return None
    if len(start) <= len(MAGIC) or not 1 <= start[-1] <= 32:
        raise DecryptionError(f"{what} has a damaged encryption header")
    bound = start[: len(MAGIC)] == MAGIC
    want = start[-1] + SALT_BYTES + PREFIX_BYTES + (BINDING_BYTES if bound else 0)
    rest = fh.read(want)
    if len(rest) != want:
        raise DecryptionError(f"{what} is truncated inside its encryption header")
    try:
        key_id = rest[: start[-1]].decode("ascii")
    except UnicodeDecodeError:
        raise DecryptionError(f"{what} has a damaged encryption header") from None
    salt = rest[start[-1] : start[-1] + SALT_BYTES]
    end = start[-1] + SALT_BYTES + PREFIX_BYTES
    return Header(key_id, salt, rest[end - PREFIX_BYTES : end], start + rest[:end], rest[end:] if bound else None)


def _binding(keyring: Keyring, header: Header, ref: str, what: str) -> bytes:
    key = keyring.file_key(header.key_id, header.salt, what, purpose=b"whisperq file ref v2")
    return hmac.new(key, header.header + ref.encode("utf-8"), hashlib.sha256).digest()


def bind(path: str | Path, ref: str, keyring: Keyring | None = None) -> None:
    """Bind the sealed file at `path` (a spool about to be stored) to the reference `ref`:
    after this it opens as `ref` only. A plain file, or one of the first format, is left."""
    what = f"the file for {ref}"
    with open(path, "r+b") as fh:
        header = _read_header(fh, what)
        if header is None or header.binding is None:
            return
        os.pwrite(fh.fileno(), _binding(keyring or current_keyring(), header, ref, what), len(header.header))


def is_encrypted(path: str | Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(len(MAGIC)) in (MAGIC, LEGACY_MAGIC)


def file_key_id(path: str | Path) -> str | None:
    """The key id a file is encrypted under; None for a plain file."""
    with open(path, "rb") as fh:
        header = _read_header(fh, f"file {path}")
    return header.key_id if header else None


class EncryptedWriter:
    """Write a file encrypted under the active key. The bytes go to a temporary name beside
    `path`; close() renames it into place (`commit`, os.replace by default), an error inside
    ``with`` or abort() removes it: a reader never sees half a file. Given `ref`, the file is
    bound to that storage reference as it is written; else it is unbound until `bind`."""

    def __init__(
        self,
        path: str | Path,
        keyring: Keyring | None = None,
        commit: Callable[[Path, Path], object] | None = None,
        ref: str | None = None,
    ):
        keyring = keyring or current_keyring()
        self.path = Path(path)
        self.key_id = keyring.active
        salt, self._prefix = secrets.token_bytes(SALT_BYTES), secrets.token_bytes(PREFIX_BYTES)
        kid = self.key_id.encode("ascii")
        self._header = MAGIC + bytes([len(kid)]) + kid + salt + self._prefix
        self._aead = AESGCM(keyring.file_key(self.key_id, salt, str(self.path)))
        binding = UNBOUND
        if ref is not None:
            header = Header(self.key_id, salt, self._prefix, self._header, UNBOUND)
            binding = _binding(keyring, header, ref, str(self.path))
        self._commit = commit or os.replace
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".part")
        self.temp_path = Path(tmp)
        self._fh = os.fdopen(fd, "wb")
        self._buf = bytearray()
        self._index = 0
        self.size = 0  # plaintext bytes written
        self.closed = False
        try:
            self._fh.write(self._header + binding)
        except BaseException:
            self.abort()
            raise

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def write(self, data: bytes) -> int:
        if self.closed:
            raise ValueError("write to a closed EncryptedWriter")
        view = memoryview(data).cast("B")
        n, pos = len(view), 0
        while pos < n:
            if len(self._buf) == CHUNK_BYTES:  # more follows, so it is not the last chunk
                self._seal(self._buf, last=False)
                self._buf = bytearray()
            if not self._buf and n - pos > CHUNK_BYTES:
                self._seal(view[pos : pos + CHUNK_BYTES], last=False)
                pos += CHUNK_BYTES
                continue
            take = min(CHUNK_BYTES - len(self._buf), n - pos)
            self._buf += view[pos : pos + take]
            pos += take
        self.size += n
        return n

    def _seal(self, chunk: bytes | bytearray | memoryview, last: bool) -> None:
        self._fh.write(self._aead.encrypt(_nonce(self._prefix, self._index, last), bytes(chunk), self._header))
        self._index += 1

    def close(self) -> None:
        """Seal the last chunk and put the file in place."""
        if self.closed:
            return
        try:
            self._seal(self._buf, last=True)
            self._fh.close()
            self.closed = True
            self._commit(self.temp_path, self.path)
        except BaseException:
            self.abort()
            raise
        finally:
            self._buf = bytearray()

    def abort(self) -> None:
        self.closed = True
        try:
            self._fh.close()
        finally:
            self.temp_path.unlink(missing_ok=True)

    def __enter__(self) -> EncryptedWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            self.abort()


class FileSource:
    """Sealed bytes in a local file, read at an offset (what DecryptedFile reads from)."""

    def __init__(self, path: str | Path):
        self.name = str(path)
        self._fh = open(path, "rb")  # noqa: SIM115 - held for the object's life; close() closes it
        self.size = os.fstat(self._fh.fileno()).st_size

    def read_at(self, offset: int, length: int) -> bytes:
        return os.pread(self._fh.fileno(), length, offset)

    def close(self) -> None:
        self._fh.close()


HEADER_MAX = len(MAGIC) + 1 + 32 + SALT_BYTES + PREFIX_BYTES + BINDING_BYTES


def header_key_id(head: bytes, what: str) -> str | None:
    """The key id in the first bytes (HEADER_MAX of them) of a sealed file; None for a plain one."""
    header = _read_header(io.BytesIO(head[:HEADER_MAX]), what)
    return header.key_id if header else None


class RandomAccess(io.RawIOBase):
    """A read-only raw file of `size` bytes, read from where `_pos` stands, which seeking
    moves anywhere: what DecryptedFile and models.storage.s3.S3Object share (each reads
    its own way, in readinto)."""

    size: int
    _pos: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


class DecryptedFile(RandomAccess):
    """Random-access reading of an encrypted file, one chunk decrypted (and cached) at a time.
    `path` is a local file, or a source with `name`, `size`, `read_at(offset, length)` and
    `close()` (a large object in the database: models.storage.postgres). Given `ref`, the
    file must be bound to that storage reference (or be of the first format, which has none)."""

    def __init__(self, path: Any, keyring: Keyring | None = None, what: str | None = None, ref: str | None = None):
        super().__init__()
        self._src = path if hasattr(path, "read_at") else FileSource(path)
        self.name, self.mode = self._src.name, "rb"
        self._what = what or f"file {self.name}"
        try:
            header = _read_header(io.BytesIO(self._src.read_at(0, HEADER_MAX)), self._what)
            if header is None:
                raise DecryptionError(f"{self._what} is not encrypted (no {MAGIC.decode()} header)")
            keyring = keyring or current_keyring()
            self.key_id, self._prefix, self._header, self._offset = (
                header.key_id,
                header.prefix,
                header.header,
                header.data_offset,
            )
            self._aead = AESGCM(keyring.file_key(header.key_id, header.salt, self._what))
            if (
                ref is not None
                and header.binding is not None
                and not hmac.compare_digest(header.binding, _binding(keyring, header, ref, self._what))
            ):
                raise DecryptionError(
                    f"{self._what} is not bound to {ref!r}: it was stored under another name (or never stored) "
                    "and is not this job's file",
                    key_id=header.key_id,
                )
            body = self._src.size - self._offset
            if body < TAG_BYTES:
                raise DecryptionError(f"{self._what} is truncated (no final chunk)")
            self._chunks = -(-body // _SEALED)
            self._last_len = body - (self._chunks - 1) * _SEALED
            if self._last_len < TAG_BYTES:
                raise DecryptionError(f"{self._what} is truncated inside its last chunk")
            self.size = (self._chunks - 1) * CHUNK_BYTES + self._last_len - TAG_BYTES
            self._pos, self._cached = 0, (-1, b"")
            self._chunk(self._chunks - 1)  # fail at open on a truncated file or a wrong key
        except BaseException:
            self._src.close()
            raise

    def _chunk(self, index: int) -> bytes:
        if self._cached[0] == index:
            return self._cached[1]
        last = index == self._chunks - 1
        length = self._last_len if last else _SEALED
        sealed = self._src.read_at(self._offset + index * _SEALED, length)
        if len(sealed) != length:
            raise DecryptionError(f"{self._what} changed size while it was read")
        try:
            plain = self._aead.decrypt(_nonce(self._prefix, index, last), sealed, self._header)
        except InvalidTag:
            raise DecryptionError(
                f"{self._what} failed authentication at chunk {index}: it was altered, truncated or reordered "
                f"(or key {self.key_id!r} is not the key it was written with)",
                key_id=self.key_id,
            ) from None
        self._cached = (index, plain)
        return plain

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self.size:
            return 0
        index, offset = divmod(self._pos, CHUNK_BYTES)
        chunk = memoryview(self._chunk(index))
        n = min(len(buffer), len(chunk) - offset)
        buffer[:n] = chunk[offset : offset + n]
        self._pos += n
        return n

    def readall(self) -> bytes:
        parts = []
        while self._pos < self.size:
            index, offset = divmod(self._pos, CHUNK_BYTES)
            part = self._chunk(index)[offset:]
            parts.append(part)
            self._pos += len(part)
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            self._src.close()
            self._cached = (-1, b"")
        super().close()


def open_decrypted(
    path: Any, keyring: Keyring | None = None, what: str | None = None, ref: str | None = None
) -> io.BufferedReader:
    """A readable, seekable binary file of the plaintext (DecryptionError if it cannot be)."""
    return io.BufferedReader(DecryptedFile(path, keyring, what, ref), buffer_size=CHUNK_BYTES)


def open_stored(
    path: str | Path, keyring: Keyring | None = None, what: str | None = None, ref: str | None = None
) -> io.BufferedReader:
    """A stored file's plaintext: decrypted (bound to `ref`, given one); a plain file (written
    before encryption) only where WHISPERQ_ALLOW_PLAINTEXT_ROWS allows it, else PlaintextRefused."""
    if is_encrypted(path):
        return open_decrypted(path, keyring, what, ref)
    (keyring or current_keyring()).check_plaintext(what or f"file {path}")
    return open(path, "rb")
