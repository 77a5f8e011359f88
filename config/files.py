"""The data dir's private files: directories only the owner reads, and secrets made once
and shared by every process through a file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def private_dir(path: Path) -> Path:
    """Make `path`, and whichever of its parents are missing, readable by the owner alone
    (0700) from the start: the data dir holds keys, secrets and audio. A directory that
    exists already is left as the operator made it (a shared mount, say)."""
    missing: list[Path] = []
    at = Path(path)
    while not at.exists() and at != at.parent:
        missing.append(at)
        at = at.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
    return Path(path)


def generated_secret(path: Path, make: Callable[[], str]) -> str:
    """A secret made once into `path` (mode 0600) and read by every process after: the
    first process to get here wins the race, the others read its secret."""
    if not path.exists():
        private_dir(path.parent)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")  # mode 0600
        try:
            with os.fdopen(fd, "w") as out:
                out.write(make() + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # atomic, and never replaces a secret already there
        finally:
            os.unlink(tmp)
    return path.read_text().strip()


BROKER_FILE = "broker.url"


def publish_broker(data_dir: Path, url: str) -> Path:
    """Write the running stack's broker URL (it holds the embedded broker's password) into
    the data dir, readable by its owner alone, for local callers of `transcribe.delay()`
    and `whisperq env` to find; atomically, so a reader never sees half a URL."""
    private_dir(Path(data_dir))
    fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=f".{BROKER_FILE}-")  # mode 0600
    with os.fdopen(fd, "w") as out:
        out.write(url + "\n")
    os.replace(tmp, Path(data_dir) / BROKER_FILE)
    return Path(data_dir) / BROKER_FILE


def withdraw_broker(data_dir: Path, url: str) -> None:
    """Remove the published URL when the stack that wrote it stops (not a newer stack's)."""
    path = Path(data_dir) / BROKER_FILE
    try:
        if path.read_text().strip() == url:
            path.unlink()
    except FileNotFoundError:
        pass


def published_broker(data_dir: Path) -> str | None:
    """The broker URL a stack running on this data dir published, if one is running: the
    file is the owner's alone, and its embedded broker's lock is held. Else None."""
    import fcntl

    path = Path(data_dir) / BROKER_FILE
    try:
        st = path.stat()
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # not written by us for us: not to be trusted with the jobs
    try:
        with open(Path(data_dir) / "redis" / "lock") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return path.read_text().strip() or None  # held: the stack runs
            fcntl.flock(lock, fcntl.LOCK_UN)
    except OSError:
        pass
    return None  # left by a stack that stopped without withdrawing it
