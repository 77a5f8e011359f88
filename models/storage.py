"""Audio storage by reference: the message and the job row carry a reference, never bytes.

What the store writes is encrypted at rest (models.security.crypto): uploads as they arrive, fetched
audio and the prepared samples. A file the caller owns is read in place, as it is.
"""
from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
import unicodedata
from pathlib import Path
from typing import BinaryIO, Callable

from config import private_dir

from models.security.crypto import Keyring, current_keyring
from models.security.sealed import EncryptedWriter, open_decrypted, open_stored

def clean_filename(name: str | None) -> str | None:
    """The client's file name, safe to store and show: no directories, no control characters."""
    if not name:
        return None
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").strip().strip(".")
    return name[:200] or None


def caller_file(ref: str, input_dirs: tuple[Path, ...], data_dir: Path) -> str:
    """The file a `transcribe.delay(path)` caller names, resolved (links followed), if it is
    an absolute path inside one of WHISPERQ_INPUT_DIRS and not in the service's own store;
    else ValueError saying what to do. The store's files (other jobs' audio, keys) are never
    readable this way, whatever the input directories are."""
    listed = ", ".join(str(d) for d in input_dirs)
    if not isinstance(ref, str) or not os.path.isabs(ref):
        raise ValueError(f"transcribe.delay() takes the absolute path of a file under WHISPERQ_INPUT_DIRS ({listed}), "
                         f"not {ref!r}")
    real = Path(os.path.realpath(ref))
    if not any(d == real or d in real.parents for d in input_dirs):
        raise ValueError(f"{ref!r} is outside WHISPERQ_INPUT_DIRS ({listed}); put the file there, or add its "
                         "directory to WHISPERQ_INPUT_DIRS")
    store = Path(os.path.realpath(data_dir))
    if (store == real or store in real.parents) and (store / "inbox") not in real.parents:
        raise ValueError(f"{ref!r} is in the service's own data directory; only its inbox/ may be read this way")
    return str(real)


class LocalStorage:
    """Files under the data directory. References are paths relative to it.

    An absolute reference is a file the caller owns (``transcribe.delay("/path")``): it is
    read in place and never deleted.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @property
    def tmp_dir(self) -> Path:
        path = self.root / "tmp"
        if not path.is_dir():
            private_dir(self.root)
            path.mkdir(parents=True, exist_ok=True)
        return path

    def spool(self, stream: BinaryIO, limit: int | None = None,
              too_large: Callable[[], BaseException] | None = None) -> "SealedSpool":
        """Copy an upload, encrypted, to a temporary file on the same disk as the store."""
        spool = SealedSpool(self.tmp_dir, limit, too_large)
        try:
            shutil.copyfileobj(stream, spool, length=1024 * 1024)
            return spool.finish()
        except BaseException:
            spool.discard()
            raise

    def open(self, ref: str) -> BinaryIO:
        """A stored file's plaintext (decrypted), or the caller's own file as it is."""
        if not self.owns(ref):
            return open(self.path(ref), "rb")
        return open_stored(self.path(ref), what=f"stored file {ref}")

    def writer(self, path: str | Path) -> EncryptedWriter:
        """Write a file into the store encrypted (atomically: see EncryptedWriter)."""
        return EncryptedWriter(path)

    def adopt(self, tmp: Path, job_id: str) -> str:
        """Move a spooled file into the store under the job's id alone (no client suffix:
        FFmpeg must learn nothing from a name); returns its reference."""
        ref = f"audio/{job_id[:2]}/{job_id}"
        dest = self.root / ref
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        return ref

    def copy_to_spool(self, ref: str) -> Path:
        """A stored (or caller's) file copied into the tmp folder, sealed anew, for another job
        to adopt (a re-run): each job owns its audio, and deleting one leaves the other's."""
        import shutil
        import uuid

        tmp = self.tmp_dir / f"rerun-{uuid.uuid4().hex}"
        with self.open(ref) as src, self.writer(tmp) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        return tmp

    def path(self, ref: str) -> Path:
        if os.path.isabs(ref):
            return Path(ref)
        path = (self.root / ref).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"storage reference {ref!r} points outside the data directory")
        return path

    def owns(self, ref: str) -> bool:
        return not os.path.isabs(ref)

    def delete(self, ref: str) -> None:
        if self.owns(ref):
            self.path(ref).unlink(missing_ok=True)

    def save_samples(self, job_id: str, samples) -> str:
        """Prepared audio (16 kHz mono) as 16-bit PCM in a .npy file; returns its reference."""
        import numpy as np

        ref = f"prepared/{job_id[:2]}/{job_id}.npy"
        dest = self.root / ref
        dest.parent.mkdir(parents=True, exist_ok=True)
        pcm = np.clip(np.round(samples * 32768.0), -32768, 32767).astype(np.int16)
        with EncryptedWriter(dest) as fh:
            np.save(fh, pcm)
        return ref

    def load_samples(self, ref: str):
        import numpy as np

        with self.open(ref) as fh:
            return np.load(fh).astype(np.float32) / 32768.0


class SealedSpool:
    """An upload as it arrives: encrypted into `directory` while it is hashed (sha256 of
    the plaintext) and counted, refused with `too_large()` the moment it passes `limit`.
    Once seek() or read() is called it is complete, and reads back decrypted.
    `discard()` removes every trace; `path` is the finished file (for `adopt`)."""

    def __init__(self, directory: str | Path, limit: int | None = None,
                 too_large: Callable[[], BaseException] | None = None, keyring: Keyring | None = None):
        self._keyring = keyring or current_keyring()
        fd, name = tempfile.mkstemp(dir=directory, prefix="upload-")  # holds the name until the file replaces it
        os.close(fd)
        self.path = Path(name)
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

    def write(self, data) -> int:
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

    def finish(self) -> "SealedSpool":
        if self._reader is None:
            self._writer.close()
            self._reader = open_decrypted(self.path, self._keyring, "the upload")
        return self

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
        return self.finish()._reader.seek(offset, whence)

    def tell(self) -> int:
        return self._reader.tell() if self._reader is not None else self.size

    def read(self, size: int = -1) -> bytes:
        return self.finish()._reader.read(size)

    def readline(self, size: int = -1) -> bytes:
        return self.finish()._reader.readline(size)

    def readinto(self, buffer) -> int:
        return self.finish()._reader.readinto(buffer)

    def __iter__(self):
        return iter(self.finish()._reader)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        """Let go of open files (the file itself stays until discard() or adopt)."""
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
