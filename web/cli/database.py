"""`whisperq init-db` and `whisperq new-migration`: the database schema and its revisions
(models.migrations)."""

from __future__ import annotations

import click

from .context import load_settings


@click.command("init-db")
def init_db() -> None:
    """Create the database tables or upgrade them to the newest schema revision (web and
    workers also do this at start)."""
    from models import migrations
    from models.db import Database

    settings = load_settings()
    db = Database(settings.database_url)
    db.upgrade()
    click.echo(
        f"tables ready at schema revision {migrations.current(db.engine)} in {settings.describe()['database_url']}"
    )


@click.command("new-migration")
@click.argument("message")
def new_migration(message: str) -> None:
    """Write a new schema revision into models/migrations/versions/ from what the models
    declare beyond the newest revision (for developers; review it before committing)."""
    import tempfile

    from alembic import command
    from alembic.script import Script
    from sqlalchemy import create_engine

    from models import migrations
    from models.db import Base

    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite:///{tmp}/schema.db")
        migrations.upgrade(engine, Base.metadata)
        with engine.connect() as conn:
            number = f"{int(migrations.head()) + 1:04d}"
            script = command.revision(
                migrations.config(conn, Base.metadata), message=message, autogenerate=True, rev_id=number
            )
        engine.dispose()
    if not isinstance(script, Script):  # one head, so one new revision: never a list or nothing
        raise click.ClickException(f"alembic wrote no single revision script ({script!r})")
    click.echo(f"wrote {script.path}; check it (and on PostgreSQL), then commit it with the model change")
