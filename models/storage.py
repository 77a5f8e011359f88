"""Audio storage by reference: the message and the job row carry a reference, never bytes."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import unicodedata
from pathlib import Path
from typing import BinaryIO

_SUFFIX = re.compile(r"^\.[a-z0-9]{1,8}$")


def clean_filename(name: str | None) -> str | None:
    """The client's file name, safe to store and show: no directories, no control characters."""
    if not name:
        return None
    name = name.replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C").strip().strip(".")
    return name[:200] or None


def safe_suffix(name: str | None) -> str:
    suffix = Path(name or "").suffix.lower()
    return suffix if _SUFFIX.match(suffix) else ".bin"


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
        path.mkdir(parents=True, exist_ok=True)
        return path

    def spool(self, stream: BinaryIO, limit: int | None = None) -> Path:
        """Copy an upload to a private temporary file on the same disk as the store."""
        fd, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(stream, out, length=1024 * 1024)
        except BaseException:
            os.unlink(name)
            raise
        return Path(name)

    def adopt(self, tmp: Path, job_id: str, suffix: str) -> str:
        """Move a spooled file into the store under the job's id; returns its reference."""
        ref = f"audio/{job_id[:2]}/{job_id}{suffix}"
        dest = self.root / ref
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)
        return ref

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
        tmp = dest.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            np.save(fh, pcm)
        os.replace(tmp, dest)
        return ref

    def load_samples(self, ref: str):
        import numpy as np

        return np.load(self.path(ref)).astype(np.float32) / 32768.0
