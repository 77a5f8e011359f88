"""Database engine and sessions: SQLite (WAL) by default, PostgreSQL in production."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from sqlalchemy import DateTime, TypeDecorator, create_engine, delete, event, text
from sqlalchemy.engine import CursorResult, Dialect, Engine, Result
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from config import private_dir


class Base(DeclarativeBase):
    pass


def utcnow() -> datetime:
    return datetime.now(UTC)


def rowcount(result: Result[Any]) -> int:
    """The rows an UPDATE or DELETE matched (Session.execute types its result as a plain Result)."""
    return cast("CursorResult[Any]", result).rowcount


def delete_of_jobs(session: Session, table: Any, job_ids: Sequence[str]) -> int:
    """Deletes the rows of `table` whose `job_id` is one of `job_ids`, in one statement that
    leaves the session's objects as they are; returns how many went."""
    return (
        rowcount(
            session.execute(
                delete(table).where(table.job_id.in_(job_ids)),
                execution_options={"synchronize_session": False},
            )
        )
        or 0
    )


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC on every database (SQLite keeps no zone of its own)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use datetime.now(timezone.utc)")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets the web process read while a worker writes; busy_timeout waits out a
    # writer instead of failing with "database is locked".
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


class Database:
    """One engine and session factory per process, created lazily after any fork."""

    def __init__(self, url: str, session_info: dict[str, Any] | None = None):
        self.url = url
        self.session_info = session_info or {}  # copied into every session's .info (the runtime, for the outbox)
        self._engine: Engine | None = None
        self._sessions: sessionmaker[Session] | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            # hide_parameters: bound values (key hashes, owners, transcripts) stay out of
            # SQL error messages and echo logs.
            if self.url.startswith("sqlite"):
                path = self.url.split("///", 1)[-1]
                if path and path != ":memory:":
                    private_dir(Path(path).parent)
                engine = create_engine(self.url, connect_args={"timeout": 10}, hide_parameters=True)
                event.listen(engine, "connect", _sqlite_pragmas)
            else:
                engine = create_engine(self.url, pool_pre_ping=True, pool_size=5, max_overflow=5, hide_parameters=True)
            self._engine = engine
            self._sessions = sessionmaker(engine, expire_on_commit=False, info=self.session_info)
        return self._engine

    @contextmanager
    def session(self, write: bool = False) -> Iterator[Session]:
        """A session that commits on success and rolls back on error.

        `write=True` for a read-check-write (SELECT ... FOR UPDATE): PostgreSQL locks the
        rows; SQLite has no row locks, and pysqlite starts no transaction before a SELECT,
        so two processes could both see a job unfinished and both finish it. There the
        session takes SQLite's write lock first (BEGIN IMMEDIATE), waiting out others."""
        self.engine  # noqa: B018 - creates the factory
        assert self._sessions is not None
        with self._sessions() as session:
            try:
                if write and self.url.startswith("sqlite"):
                    session.execute(text("BEGIN IMMEDIATE"))
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    def upgrade(self) -> None:
        """Bring the schema to the newest revision (models/migrations): several processes
        may start at once, so the upgrade runs under a lock and is a no-op once done. On
        PostgreSQL a connection lost mid-way (a restart) is tried again."""
        from sqlalchemy.exc import OperationalError

        from models.migrations import upgrade

        for attempt in range(3):
            try:
                upgrade(self.engine, Base.metadata)  # every table: importing models declares them all
                return
            except OperationalError:
                if attempt == 2:
                    raise
                time.sleep(0.5 * (attempt + 1))

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    def dispose(self, close: bool = True) -> None:
        """Drop pooled connections; in a child after fork, without closing the parent's."""
        if self._engine is not None:
            self._engine.dispose(close=close)
