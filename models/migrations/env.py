"""Alembic's environment: the connection and the models' tables come from
models.migrations (``upgrade``, ``config``), never from a URL in a file."""

from alembic import context

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `whisperq db upgrade`, which connects to WHISPERQ's DATABASE_URL")
context.configure(
    connection=connection,
    target_metadata=context.config.attributes.get("metadata"),
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
