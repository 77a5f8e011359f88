"""The data dir's private files: directories only the owner reads, and secrets made once
and shared by every process through a file."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


def private_dir(path: Path) -> Path:
    """Make `path`, and whichever of its parents are missing, readable by the owner alone
    (0700) from the start: the data dir holds keys, secrets and audio. A directory that
    exists already is left as the operator made it (a shared mount, say)."""
    missing = []
    at = Path(path)
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
    return Path(path)


def generated_secret(path: Path, make) -> str:
    """A secret made once into `path` (mode 0600) and read by every process after: the
    first process to get here wins the race, the others read its secret."""
    if not path.exists():
        private_dir(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")  # mode 0600
        try:
            with os.fdopen(fd, "w") as out:
                out.write(make() + "\n")
            try:
                os.link(tmp, path)  # atomic, and never replaces a secret already there
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    return path.read_text().strip()
