"""What arrives before it is stored: an upload spooled and sealed as it comes in, the client's
file name made safe, and a caller's own file (`transcribe.delay(path)`) checked."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import tempfile
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

from models.security.crypto import Keyring, current_keyring
from models.security.sealed import EncryptedWriter, open_decrypted


def clean_filename(name: str | None) -> str | None:
    """The client's file name, safe to store and show: no directories, no control characters."""
    if not name:
        return None
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").strip().strip(".")
    return name[:200] or None


def _within(directory: Path, path: Path) -> bool:
    return directory == path or directory in path.parents


def caller_file(ref: str, input_dirs: tuple[Path, ...], data_dir: Path, others: tuple[Path, ...] = ()) -> str:
    """The file a caller names (`transcribe.delay(path)`, MQTT `path`), resolved (links
    followed), if it is an absolute path inside one of `input_dirs` (the caller's own and the
    shared ones), not inside one of `others` (other keys' own) more closely, and not in the
    service's own store; else ValueError saying what to do. The answer is the same for a file
    in another key's directory as for one outside every directory, so a refusal tells nothing
    of other tenants' files. The store's files (other jobs' audio, keys) are never readable
    this way, whatever the input directories are."""
    listed = ", ".join(str(d) for d in input_dirs) or "none"
    if not isinstance(ref, str) or not os.path.isabs(ref):
        raise ValueError(f"give the absolute path of a file in your input directories ({listed}), not {ref!r}")
    real = Path(os.path.realpath(ref))
    mine = max((len(d.parts) for d in input_dirs if _within(d, real)), default=-1)
    theirs = max((len(d.parts) for d in others if _within(d, real)), default=-1)
    if mine < 0 or theirs > mine:
        raise ValueError(
            f"{ref!r} is outside your input directories ({listed}); put the file there, or ask an "
            "operator to add its directory to WHISPERQ_INPUT_DIRS"
        )
    store = Path(os.path.realpath(data_dir))
    if _within(store, real) and (store / "inbox") not in real.parents:
        raise ValueError(f"{ref!r} is in the service's own data directory; only its inbox/ may be read this way")
    return str(real)


def open_caller_file(path: str) -> BinaryIO:
    """A caller's file, opened as the door resolved it: never through a link. The last part is
    opened with O_NOFOLLOW, and the file opened must have the very path the door checked, so
    a file or directory swapped for a link after the door's check is refused, not followed."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PermissionError(f"{path} became a symbolic link after it was submitted; it is not followed") from None
        raise
    try:
        opened = os.path.realpath(f"/proc/self/fd/{fd}") if os.path.isdir("/proc/self/fd") else path
        if opened != path or not stat.S_ISREG(os.fstat(fd).st_mode):
            raise PermissionError(f"{path} was moved or replaced by a link after it was submitted; it is not followed")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class SealedSpool:
    """An upload as it arrives: encrypted into `directory` while it is hashed (sha256 of
    the plaintext) and counted, refused with `too_large()` the moment it passes `limit`.
    Once seek() or read() is called it is complete, and reads back decrypted.
    `discard()` removes every trace; `path` is the finished file (for `store_audio`)."""

    def __init__(
        self,
        directory: str | Path,
        limit: int | None = None,
        too_large: Callable[[], BaseException] | None = None,
        keyring: Keyring | None = None,
    ):
        self._keyring = keyring or current_keyring()
        fd, name = tempfile.mkstemp(dir=directory, prefix="upload-")  # holds the name until the file replaces it
        os.close(fd)
        self.path: Path | None = Path(name)  # None once released
        self.name = name
        self.limit, self._too_large = limit, too_large or (lambda: ValueError(f"the upload is over {limit} bytes"))
        self.sha256 = hashlib.sha256()
        self.size = 0
        self.closed = False
        self._reader: io.BufferedReader | None = None
        try:
            self._writer = EncryptedWriter(self.path, self._keyring)
        except BaseException:
            self.path.unlink(missing_ok=True)
            raise

    def write(self, data: Any) -> int:
        if self._reader is not None or self._writer.closed:
            raise ValueError("the upload is complete; it cannot be written to")
        n = len(memoryview(data).cast("B"))
        if self.limit is not None and self.size + n > self.limit:
            self.discard()
            raise self._too_large()
        self.sha256.update(data)
        self._writer.write(data)
        self.size += n
        return n

    def finish(self) -> SealedSpool:
        if self._reader is None:
            self._writer.close()
            self._reader = open_decrypted(self.path, self._keyring, "the upload")
        return self

    def _finished(self) -> io.BufferedReader:
        """The reader of the complete upload (finish() opens it)."""
        return cast(io.BufferedReader, self.finish()._reader)

    def open(self) -> io.BufferedReader:
        """A new reader of the complete upload."""
        self.finish()
        return open_decrypted(self.path, self._keyring, "the upload")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return self._reader is None

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._finished().seek(offset, whence)

    def tell(self) -> int:
        return self._reader.tell() if self._reader is not None else self.size

    def read(self, size: int = -1) -> bytes:
        return self._finished().read(size)

    def readline(self, size: int = -1) -> bytes:
        return self._finished().readline(size)

    def readinto(self, buffer: Any) -> int:
        return self._finished().readinto(buffer)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._finished())

    def flush(self) -> None:
        pass

    def close(self) -> None:
        """Let go of open files (the file itself stays until discard() or store_audio())."""
        self.closed = True
        if self._reader is not None:
            self._reader.close()
        elif not self._writer.closed:
            self._writer.abort()

    def release(self) -> None:
        """The file has been moved into the store: discard() no longer touches it."""
        self.close()
        self.path = None

    def discard(self) -> None:
        self.close()  # an unfinished file's temporary part goes with its writer
        if self.path is not None:
            self.path.unlink(missing_ok=True)
