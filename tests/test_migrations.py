"""Schema migrations (Alembic, models/migrations) on SQLite and PostgreSQL: a database made
before the schema had revisions is brought up with its rows; a new one is made from the
revisions; either way the result is exactly the tables the models declare."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from helpers import postgres_database
from sqlalchemy import inspect, select, text

from models import migrations
from models.db import Base, Database

FIXTURES = Path(__file__).parent / "fixtures" / "schema"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'whisperq.db'}"
        return
    with postgres_database("whisperq_migrate") as (url, _admin):
        yield url


def _differences(db: Database) -> list:
    with db.engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)


def _make_as_before_revisions(db: Database, drop: tuple[str, ...] = ()) -> str:
    """The tables as the create_all of earlier versions made them, and one job in them."""
    lines = (FIXTURES / f"before-revisions.{db.engine.dialect.name}.sql").read_text().splitlines()
    script = "\n".join(line for line in lines if not line.startswith("--"))
    job_id = str(uuid.uuid4())
    with db.engine.begin() as conn:
        for statement in script.split(";"):
            if statement.strip():
                conn.exec_driver_sql(statement)
        for column in drop:  # an older version still: a column added later is missing
            conn.exec_driver_sql(f"DROP INDEX IF EXISTS ix_jobs_{column}")
            conn.exec_driver_sql(f"ALTER TABLE jobs DROP COLUMN {column}")
        conn.execute(
            text(
                "INSERT INTO jobs (id, status, task, priority, audio_ref, audio_owned, created_at, attempts, filename) "
                "VALUES (:id, 'COMPLETED', 'transcribe', 'normal', 'a/b.flac', :owned, :at, 1, 'talk.flac')"
            ),
            {"id": job_id, "owned": True, "at": datetime(2026, 11, 1, tzinfo=UTC)},
        )
    return job_id


def test_a_new_database_is_made_from_the_revisions_and_matches_the_models(database_url):
    db = Database(database_url)
    db.upgrade()
    assert migrations.current(db.engine) == migrations.head()
    assert _differences(db) == []
    db.upgrade()  # a second start finds nothing to do
    assert migrations.current(db.engine) == migrations.head()
    db.dispose()


def test_a_database_made_before_revisions_is_upgraded_with_its_rows(database_url):
    from models.jobs.record import Job

    db = Database(database_url)
    job_id = _make_as_before_revisions(db)
    assert "alembic_version" not in inspect(db.engine).get_table_names()
    db.upgrade()
    assert migrations.current(db.engine) == migrations.head()
    assert _differences(db) == []
    with db.session() as session:
        job = session.execute(select(Job).where(Job.id == job_id)).scalar_one()
    assert (job.status, job.filename, job.attempts) == ("COMPLETED", "talk.flac", 1)
    db.dispose()


def test_an_older_database_gets_the_columns_added_since(database_url):
    db = Database(database_url)
    _make_as_before_revisions(db, drop=("engine_runs", "audio_format", "owner"))
    db.upgrade()
    columns = {c["name"] for c in inspect(db.engine).get_columns("jobs")}
    assert {"engine_runs", "audio_format", "owner"} <= columns
    assert _differences(db) == []
    db.dispose()


def test_processes_starting_at_once_upgrade_once(database_url):
    """Several processes open a new database together: the lock lets one make the tables."""
    errors: list[BaseException] = []
    databases = [Database(database_url) for _ in range(4)]

    def start(db: Database) -> None:
        try:
            db.upgrade()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(db,)) for db in databases]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert migrations.current(databases[0].engine) == migrations.head()
    for db in databases:
        db.dispose()


def test_the_revisions_go_down_and_up_again(database_url):
    from alembic import command

    db = Database(database_url)
    db.upgrade()
    with db.engine.connect() as conn:
        command.downgrade(migrations.config(conn), "base")
        conn.commit()
    assert set(inspect(db.engine).get_table_names()) <= {"alembic_version"}
    db.upgrade()
    assert _differences(db) == []
    db.dispose()


def test_what_a_client_said_is_sealed_by_the_upgrade_and_read_back(database_url):
    """A database of revision 0011 holds callback URLs, presigned audio URLs, prompts, hotwords
    and a dead letter's traceback in plaintext; 0012 seals each, bound to its row and column,
    and the models read them back."""
    from models.jobs.deadletter import DeadLetter
    from models.jobs.record import Job
    from models.security.crypto import value_is_bound

    db = Database(database_url)
    migrations.upgrade(db.engine, Base.metadata, "0011")
    job_id = str(uuid.uuid4())
    said = {
        "callback_url": "https://hooks.example.com/done?token=s3cret",
        "audio_url": "https://bucket.s3.amazonaws.com/a.mp3?X-Amz-Signature=abc",
        "prompt": "Acme Corp, Siobhan",
        "hotwords": "Siobhan, Kubernetes",
    }
    with db.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, status, task, priority, audio_ref, audio_owned, attempts, created_at, "
                "callback_url, audio_url, prompt, hotwords) VALUES (:id, 'FAILED', 'transcribe', 'normal', '', "
                ":owned, 1, :at, :callback_url, :audio_url, :prompt, :hotwords)"
            ),
            {"id": job_id, "owned": True, "at": datetime.now(UTC), **said},
        )
        conn.execute(
            text(
                "INSERT INTO dead_letters (job_id, task, error, traceback, attempts, failed_at, replays) "
                "VALUES (:id, 'whisperq.transcribe', 'gone', 'Traceback: /srv/calls/alice.wav', 1, :at, 0)"
            ),
            {"id": job_id, "at": datetime.now(UTC)},
        )
    db.upgrade()
    with db.engine.connect() as conn:
        raw = conn.execute(
            text("SELECT callback_url, audio_url, prompt, hotwords FROM jobs WHERE id = :id"), {"id": job_id}
        ).one()
        trace = conn.execute(text("SELECT traceback FROM dead_letters WHERE job_id = :id"), {"id": job_id}).scalar()
    assert all(value_is_bound(v) for v in (*raw, trace)), raw
    assert not any(plain in " ".join((*raw, trace)) for plain in ("s3cret", "Signature", "Siobhan", "alice"))
    with db.session() as session:
        job = session.get(Job, job_id)
        assert {name: getattr(job, name) for name in said} == said
        assert session.get(DeadLetter, job_id).traceback == "Traceback: /srv/calls/alice.wav"
    db.dispose()
