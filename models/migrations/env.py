"""Alembic's environment: the connection comes from models.migrations.upgrade (or the
`whisperq db` commands), never from a URL in a file."""
from alembic import context

import models  # noqa: F401 - declares every table on Base
from models.db import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `whisperq db upgrade`, which connects to WHISPERQ's DATABASE_URL")
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
with context.begin_transaction():
    context.run_migrations()
