"""Audio and prepared samples as PostgreSQL large objects (WHISPERQ_STORAGE=postgres): every
host that reaches the database reaches them, with no shared disk.

The sealed bytes (models.security.sealed) go into a large object in 1 MiB chunks, named by a
row of `stored_objects` (reference -> oid). An upload's object is written in the transaction
that writes its job's row: both are there, or neither. Reads fetch 1 MiB blocks on demand,
so a decoder seeks (an MP4's index at its end) without copying the whole file out.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import BigInteger, Connection, String, or_, select, text
from sqlalchemy.orm import Mapped, Session, mapped_column

from models.db import Base, Database, UTCDateTime, utcnow
from models.security.sealed import CHUNK_BYTES, HEADER_MAX, DecryptedFile, EncryptedWriter, header_key_id
from models.storage.base import Storage, StoredFile, check_ref

CHUNK = 1 << 20


class StoredObject(Base):
    __tablename__ = "stored_objects"

    ref: Mapped[str] = mapped_column(String(255), primary_key=True)
    oid: Mapped[int] = mapped_column(BigInteger)
    size: Mapped[int] = mapped_column(BigInteger)  # sealed bytes
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LargeObjectSource:
    """A large object read at offsets (DecryptedFile's source), a block at a time."""

    def __init__(self, db: Database, oid: int, size: int, name: str):
        self.db, self.oid, self.size, self.name = db, oid, size, name
        self._block: tuple[int, bytes] = (-1, b"")

    def _fetch(self, start: int) -> bytes:
        from sqlalchemy.exc import DBAPIError

        try:
            with self.db.engine.connect() as conn:
                return bytes(
                    conn.execute(
                        text("SELECT lo_get(:oid, :start, :n)"), {"oid": self.oid, "start": start, "n": CHUNK}
                    ).scalar_one()
                )
        except DBAPIError as exc:  # deleted while it was read
            raise FileNotFoundError(f"{self.name} is no longer in the database ({exc.orig})") from None

    def read_at(self, offset: int, length: int) -> bytes:
        out = bytearray()
        while length > 0 and offset < self.size:
            start = offset - offset % CHUNK
            if self._block[0] != start:
                self._block = (start, self._fetch(start))
            piece = self._block[1][offset - start : offset - start + length]
            if not piece:
                break
            out += piece
            offset, length = offset + len(piece), length - len(piece)
        return bytes(out)

    def close(self) -> None:
        self._block = (-1, b"")


class PostgresStorage(Storage):
    kind = "postgres"

    def __init__(self, root: str | Path, db: Database):
        super().__init__(root)
        self.db = db

    def _place(self, tmp: Path, ref: str, session: Session | None) -> None:
        if session is None:
            with self.db.session() as own:
                self._put(own, tmp, ref)
        else:
            self._put(session, tmp, ref)
        Path(tmp).unlink(missing_ok=True)

    def _put(self, session: Session, tmp: Path, ref: str) -> None:
        check_ref(ref)
        conn = session.connection()
        old = conn.execute(text("SELECT oid FROM stored_objects WHERE ref = :ref FOR UPDATE"), {"ref": ref}).scalar()
        oid, size = _upload(conn, tmp)
        conn.execute(
            text(
                "INSERT INTO stored_objects (ref, oid, size, created_at) VALUES (:ref, :oid, :size, :at) "
                "ON CONFLICT (ref) DO UPDATE SET oid = EXCLUDED.oid, size = EXCLUDED.size, "
                "created_at = EXCLUDED.created_at"
            ),
            {"ref": ref, "oid": oid, "size": size, "at": utcnow()},
        )
        if old is not None:
            conn.execute(text("SELECT lo_unlink(:oid)"), {"oid": old})

    def _row(self, ref: str) -> StoredObject | None:
        with self.db.session() as session:
            return session.get(StoredObject, check_ref(ref))

    def _open(self, ref: str) -> BinaryIO:
        row = self._row(ref)
        if row is None:
            raise FileNotFoundError(f"stored file {ref} is not in the database")
        source = LargeObjectSource(self.db, row.oid, row.size, f"stored file {ref}")
        return io.BufferedReader(DecryptedFile(source, what=f"stored file {ref}", ref=ref), buffer_size=CHUNK_BYTES)

    def _exists(self, ref: str) -> bool:
        return self._row(ref) is not None

    def delete(self, ref: str) -> None:
        if not self.owns(ref):
            return
        check_ref(ref)
        with self.db.session() as session:
            conn = session.connection()
            for oid in (
                conn.execute(text("DELETE FROM stored_objects WHERE ref = :ref RETURNING oid"), {"ref": ref})
                .scalars()
                .all()
            ):
                conn.execute(text("SELECT lo_unlink(:oid)"), {"oid": oid})

    def listing(self, folders: tuple[str, ...] = ("audio", "prepared"), parts: bool = False) -> Iterator[StoredFile]:
        # A large object is written in the transaction that names it: no parts are left.
        query = (
            select(StoredObject.ref, StoredObject.created_at)
            .where(or_(*[StoredObject.ref.startswith(f"{folder}/") for folder in folders]))
            .order_by(StoredObject.ref)
        )
        with self.db.session() as session:
            rows = session.execute(query).all()
        for ref, created in rows:
            yield StoredFile(ref, created.timestamp())

    def key_id(self, ref: str) -> str | None:
        row = self._row(ref)
        if row is None:
            raise FileNotFoundError(f"stored file {ref} is not in the database")
        head = LargeObjectSource(self.db, row.oid, row.size, f"stored file {ref}").read_at(0, HEADER_MAX)
        return header_key_id(head, f"stored file {ref}")

    def reseal(self, ref: str) -> bool:
        row = self._row(ref)
        if row is None:
            return False
        tmp = self.tmp_dir / f"reseal-{row.oid}"
        try:
            try:
                with self._open(ref) as src, EncryptedWriter(tmp, ref=ref) as out:
                    while block := src.read(CHUNK):
                        out.write(block)
            except FileNotFoundError:
                return False
            with self.db.session() as session:
                conn = session.connection()
                now = conn.execute(
                    text("SELECT oid FROM stored_objects WHERE ref = :ref FOR UPDATE"), {"ref": ref}
                ).scalar()
                if now != row.oid:  # deleted, or written anew, meanwhile
                    return False
                oid, size = _upload(conn, tmp)
                conn.execute(
                    text("UPDATE stored_objects SET oid = :oid, size = :size WHERE ref = :ref"),
                    {"oid": oid, "size": size, "ref": ref},
                )
                conn.execute(text("SELECT lo_unlink(:oid)"), {"oid": row.oid})
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def raw(self, ref: str) -> bytes:
        """The bytes as the database holds them (sealed): for checks, not for reading audio."""
        row = self._row(ref)
        if row is None:
            raise FileNotFoundError(f"stored file {ref} is not in the database")
        return LargeObjectSource(self.db, row.oid, row.size, ref).read_at(0, row.size)


def _upload(conn: Connection, tmp: Path) -> tuple[int, int]:
    """A new large object holding the file's bytes, sent in chunks: (oid, size)."""
    with open(tmp, "rb") as fh:
        first = fh.read(CHUNK)
        oid = conn.execute(text("SELECT lo_from_bytea(0, :data)"), {"data": first}).scalar_one()
        size = len(first)
        while chunk := fh.read(CHUNK):
            conn.execute(text("SELECT lo_put(:oid, :offset, :data)"), {"oid": oid, "offset": size, "data": chunk})
            size += len(chunk)
    return oid, size
