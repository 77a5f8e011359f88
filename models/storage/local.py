"""Files under the data directory: the default store, and the one a shared mount gives
every host. A file is written beside its place and renamed in, so a reader never sees half."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from models.security.sealed import EncryptedWriter, file_key_id, open_stored
from models.storage.base import Storage, StoredFile, check_ref

if TYPE_CHECKING:
    from sqlalchemy.orm import Session


class LocalStorage(Storage):
    """References are paths relative to the data directory."""

    kind = "local"

    def path(self, ref: str) -> Path:
        if os.path.isabs(ref):
            return Path(ref)
        path = (self.root / check_ref(ref)).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"storage reference {ref!r} points outside the data directory")
        return path

    def _place(self, tmp: Path, ref: str, session: Session | None) -> None:
        dest = self.path(ref)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)

    def _open(self, ref: str) -> BinaryIO:
        return open_stored(self.path(ref), what=f"stored file {ref}", ref=ref)

    def _exists(self, ref: str) -> bool:
        return self.path(ref).is_file()

    def delete(self, ref: str) -> None:
        if self.owns(ref):
            self.path(ref).unlink(missing_ok=True)

    def listing(self, folders: tuple[str, ...] = ("audio", "prepared"), parts: bool = False) -> Iterator[StoredFile]:
        for folder in folders:
            base = self.root / folder
            if not base.is_dir():
                continue
            for path in sorted(base.rglob("*")):
                if path.name.startswith(".") and not parts:
                    continue  # a file being written (EncryptedWriter's temporary part)
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):  # a rename updates ctime, not mtime
                    yield StoredFile(path.relative_to(self.root).as_posix(), max(st.st_mtime, st.st_ctime))

    def key_id(self, ref: str) -> str | None:
        return file_key_id(self.path(ref))

    def reseal(self, ref: str) -> bool:
        path = self.path(ref)
        try:
            inode = os.stat(path).st_ino
        except FileNotFoundError:
            return False

        def swap_in(tmp: Path, dest: Path) -> None:
            _replace_if_unchanged(tmp, dest, inode)

        try:
            with (
                open_stored(path, what=f"stored file {ref}", ref=ref) as src,
                EncryptedWriter(path, commit=swap_in, ref=ref) as out,
            ):
                shutil.copyfileobj(src, out, 1024 * 1024)
        except (_Gone, FileNotFoundError):
            return False
        return True


class _Gone(Exception):
    pass


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_renameat2: Any  # glibc's renameat2, or None
try:
    _renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
except (AttributeError, OSError):  # not Linux/glibc
    _renameat2 = None


def _replace_if_unchanged(tmp: Path, dest: Path, inode: int) -> None:
    """Put `tmp` in place of `dest` only if `dest` is still the file that was read: on Linux
    an atomic exchange (renameat2 RENAME_EXCHANGE fails if `dest` has been deleted), else a
    check and a rename."""
    try:
        if os.stat(dest).st_ino != inode:
            raise _Gone
    except FileNotFoundError:
        raise _Gone from None
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(tmp), _AT_FDCWD, os.fsencode(dest), _RENAME_EXCHANGE) == 0:
            os.unlink(tmp)  # now the old file
            return
        code = ctypes.get_errno()
        if code == errno.ENOENT:
            raise _Gone
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(code, os.strerror(code), str(dest))
    os.replace(tmp, dest)
