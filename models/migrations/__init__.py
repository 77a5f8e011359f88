"""The database schema's history, as Alembic revisions (versions/), and the code that
brings a database to the newest one.

Every process that opens the database upgrades it at start (`Database.upgrade`: web, workers,
`whisperq run` once before it starts them). Several may start at once, so the upgrade
runs under a lock: PostgreSQL's advisory lock, or an exclusive lock file beside a SQLite
database. A database made before the schema had revisions (tables but no
`alembic_version`) is brought up to the first revision by adding the nullable columns it
lacks, then stamped, and upgraded from there like any other.

A change to the tables in models/ needs a new revision here; tests compare the upgraded
schema with the models on SQLite and PostgreSQL, so a forgotten one fails them.
"""

from __future__ import annotations

import fcntl
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, inspect, text
from sqlalchemy.engine import Connection, Engine

HERE = Path(__file__).resolve().parent
BASELINE = "0001"  # the schema as create_all made it before revisions were kept
_LOCK_ID = 0x77687173  # "whqs": the advisory lock key on PostgreSQL


def config(connection: Connection | None = None, metadata: MetaData | None = None) -> Config:
    """Alembic's configuration for a connection; `metadata` (the models' tables) is what
    autogenerate compares with."""
    cfg = Config()
    cfg.set_main_option("script_location", str(HERE))
    cfg.attributes["connection"] = connection
    cfg.attributes["metadata"] = metadata
    return cfg


@functools.cache
def head() -> str:
    """The newest revision (the versions directory is read once per process)."""
    return cast(str, ScriptDirectory.from_config(config()).get_current_head())  # the versions have one head


def current(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, metadata: MetaData, revision: str = "head") -> None:
    """Bring the database to `revision` (the newest by default); a no-op when it is there.
    `metadata` holds every table (models.db.Base's): a database made before revisions were
    kept gets the columns it lacks from it."""
    with _locked(engine) as conn:
        if MigrationContext.configure(conn).get_current_revision() == head() and revision == "head":
            return
        cfg = config(conn, metadata)
        if _made_before_revisions(conn):
            _add_missing_columns(conn, metadata)
            command.stamp(cfg, BASELINE)
        command.upgrade(cfg, revision)
        conn.commit()


def _made_before_revisions(conn: Connection) -> bool:
    tables = set(inspect(conn).get_table_names())
    return "jobs" in tables and "alembic_version" not in tables


def _add_missing_columns(conn: Connection, metadata: MetaData) -> None:
    """What create_all's upgrades did before revisions: tables made by an older version
    lack columns added since, all nullable; add them so the tables match the baseline."""
    inspector = inspect(conn)
    present_tables = set(inspector.get_table_names())
    for table in metadata.sorted_tables:
        if table.name not in present_tables:
            table.create(conn)
            continue
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in present and column.nullable:
                kind = column.type.compile(dialect=conn.dialect)
                conn.exec_driver_sql(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}')
                for index in table.indexes:
                    if list(index.columns) == [column]:
                        index.create(conn, checkfirst=True)


@contextmanager
def _locked(engine: Engine) -> Iterator[Connection]:
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _LOCK_ID})
            conn.commit()
            try:
                yield conn
            finally:
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_ID})
                conn.commit()
        return
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        with engine.connect() as conn:
            yield conn
        return
    with open(f"{database}.migrate.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with engine.connect() as conn:
                yield conn
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
