"""The storage interface and what every backend shares.

A reference is a relative name the service chose: `audio/<id[:2]>/<id>` for a job's audio,
`prepared/<id[:2]>/<id>.npy` for its decoded samples (`<id>.shadow.npy` for a shadow's copy),
where the id is a job's, a canonical lower-case UUID. Each is checked where it is built
(`audio_ref`, `prepared_ref`) and again wherever a backend opens, writes or deletes one
(`check_ref`): no name a message carries can reach another file. An absolute reference is a
file the caller owns (`transcribe.delay("/path")`): read in place, as it is, and never deleted.
Each host keeps its own tmp/ under its data dir for spools and fetches in progress.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, BinaryIO

from config import private_dir
from models.security.sealed import EncryptedWriter, bind

if TYPE_CHECKING:
    import numpy as np
    from sqlalchemy.orm import Session

    from models.storage.spool import SealedSpool


_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
JOB_ID = re.compile(rf"^{_UUID}$")
# An audio reference of an earlier version kept the client's suffix (`<id>.flac`): still read.
REF = re.compile(
    rf"^(?:audio/([0-9a-f]{{2}})/({_UUID})(?:\.[A-Za-z0-9]{{1,10}})?|prepared/([0-9a-f]{{2}})/({_UUID})(?:\.shadow)?\.npy)$"
)


def check_job_id(job_id: object) -> str:
    """A job id as the service makes them: a canonical, lower-case UUID; ValueError otherwise."""
    if not isinstance(job_id, str) or not JOB_ID.match(job_id):
        raise ValueError(f"{str(job_id)[:80]!r} is not a job id (a lower-case UUID such as {uuid.uuid4()})")
    return job_id


# What a write cut short leaves beside the file it was writing (models.security.sealed's writer).
PART = re.compile(r"^((?:audio|prepared)/[0-9a-f]{2}/)\.([^/]+)\.[A-Za-z0-9_]{1,16}\.part$")


def check_ref(ref: str) -> str:
    """A reference the service chose, exactly, or what a write of one cut short left (ValueError
    for any other name: a path, `..`, a name from a message)."""
    part = PART.match(ref) if isinstance(ref, str) else None
    name = part.group(1) + part.group(2) if part else ref
    found = REF.match(name) if isinstance(name, str) else None
    if found is None or (found.group(1) or found.group(3)) != (found.group(2) or found.group(4))[:2]:
        raise ValueError(f"storage reference {str(ref)[:120]!r} is not one this service makes")
    return ref


def prepared_ref(job_id: str) -> str:
    """Where a job's decoded samples are kept (`<id>.shadow` for a shadow model's copy)."""
    base, dot, kind = job_id.partition(".")
    check_job_id(base)
    if dot and kind != "shadow":
        raise ValueError(f"prepared samples are a job's own or its shadow's, not {job_id!r}")
    return f"prepared/{base[:2]}/{job_id}.npy"


def audio_ref(job_id: str) -> str:
    """Where a job's audio is kept: under its id alone (no client suffix: FFmpeg must learn
    nothing from a name)."""
    return f"audio/{check_job_id(job_id)[:2]}/{job_id}"


@dataclass(frozen=True)
class StoredFile:
    """One finished file in the store, for retention's orphan sweep and key rotation."""

    ref: str
    written_at: float  # when it was written (or moved into place), in seconds since the epoch


class Storage:
    """What the web, the pools and maintenance use; a backend supplies the methods marked
    as such. `root` is this host's data dir (its tmp/ holds spools, whatever the backend)."""

    kind = "abstract"

    def __init__(self, root: str | Path):
        self.root = Path(root)

    # -- this host's temporary files -------------------------------------------------------
    @property
    def tmp_dir(self) -> Path:
        path = self.root / "tmp"
        if not path.is_dir():
            private_dir(self.root)
            path.mkdir(parents=True, exist_ok=True)
        return path

    def spool(
        self, stream: IO[bytes], limit: int | None = None, too_large: Callable[[], BaseException] | None = None
    ) -> SealedSpool:
        """Copy an upload, encrypted, to a temporary file on this host."""
        from models.storage.spool import SealedSpool

        spool = SealedSpool(self.tmp_dir, limit, too_large)
        try:
            shutil.copyfileobj(stream, spool, length=1024 * 1024)
            return spool.finish()
        except BaseException:
            spool.discard()
            raise

    def writer(self, path: str | Path) -> EncryptedWriter:
        """Seal a local file as it is written (atomically: see EncryptedWriter)."""
        return EncryptedWriter(path)

    def owns(self, ref: str) -> bool:
        return not os.path.isabs(ref)

    # -- the store: each backend ------------------------------------------------------------
    def open(self, ref: str) -> BinaryIO:
        """A stored file's plaintext (decrypted, seekable), or the caller's own file as it is."""
        if not self.owns(ref):
            from models.storage.spool import open_caller_file  # spool imports this module

            return open_caller_file(ref)
        return self._open(check_ref(ref))

    def exists(self, ref: str) -> bool:
        if not self.owns(ref):
            return os.path.lexists(ref)  # a link there is refused when it is opened, not waited for
        return self._exists(check_ref(ref))

    def store_audio(self, tmp: Path, job_id: str, session: Session | None = None) -> str:
        """Move a sealed local file into the store as the job's audio; returns its reference.
        Given the session that writes the job's row, a backend that can commits both at once."""
        ref = audio_ref(job_id)
        self.put(tmp, ref, session=session)
        return ref

    def put(self, tmp: Path, ref: str, session: Session | None = None) -> None:
        """Move the sealed local file `tmp` into the store under `ref` (replacing one there),
        bound to `ref` (models.security.sealed): it opens under no other name."""
        bind(tmp, check_ref(ref))
        self._place(tmp, ref, session)

    def _place(self, tmp: Path, ref: str, session: Session | None) -> None:
        raise NotImplementedError

    def _open(self, ref: str) -> BinaryIO:
        raise NotImplementedError

    def _exists(self, ref: str) -> bool:
        raise NotImplementedError

    def delete(self, ref: str) -> None:
        """Remove a stored file (none there: nothing happens); a caller's own is never touched."""
        raise NotImplementedError

    def listing(self, folders: tuple[str, ...] = ("audio", "prepared"), parts: bool = False) -> Iterator[StoredFile]:
        """Every finished file under these folders; with `parts`, also what a write cut short left."""
        raise NotImplementedError

    def key_id(self, ref: str) -> str | None:
        """The key a stored file is sealed under; None for a plain file written before encryption."""
        raise NotImplementedError

    def reseal(self, ref: str) -> bool:
        """Seal a stored file again under the active key, swapped in only if it is still the
        file that was read; False when it went away (or changed) meanwhile."""
        raise NotImplementedError

    # -- shared ----------------------------------------------------------------------------
    def save_samples(self, job_id: str, samples: np.ndarray) -> str:
        """Prepared audio (16 kHz mono) as 16-bit PCM in a .npy file; returns its reference."""
        import numpy as np

        ref = prepared_ref(job_id)
        tmp = self.tmp_dir / f"samples-{uuid.uuid4().hex}"
        pcm = np.clip(np.round(samples * 32768.0), -32768, 32767).astype(np.int16)
        try:
            with self.writer(tmp) as fh:
                np.save(fh, pcm)
            self.put(tmp, ref)
        finally:
            tmp.unlink(missing_ok=True)
        return ref

    def load_samples(self, ref: str) -> np.ndarray:
        import numpy as np

        with self.open(ref) as fh:
            samples: np.ndarray = np.load(fh).astype(np.float32) / 32768.0
            return samples

    def copy_to_spool(self, ref: str) -> Path:
        """A stored (or caller's) file copied into this host's tmp folder, sealed anew, for
        another job to store as its audio (a re-run): each job owns its audio, and deleting one leaves the other's."""
        tmp = self.tmp_dir / f"rerun-{uuid.uuid4().hex}"
        with self.open(ref) as src, self.writer(tmp) as out:
            shutil.copyfileobj(src, out, 1 << 20)
        return tmp
