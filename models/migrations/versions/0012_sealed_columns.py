"""What a client said of its job that may name people or hold secrets, sealed at rest like the
transcript (models.security.crypto, bound to its table, column and row): jobs.callback_url
(a receiver's token in its URL), jobs.audio_url (a presigned URL's signature), jobs.prompt,
jobs.hotwords, and dead_letters.traceback. The columns keep their names and type; the values
written before are sealed here, under the active key (`whisperq encryption rotate` moves them
on later, as every sealed value).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from typing import Sequence, Union

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: Union[str, Sequence[str], None] = "0011"
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None

# table -> (its row's id column, the columns sealed)
SEALED = {
    "jobs": ("id", ("callback_url", "audio_url", "prompt", "hotwords")),
    "dead_letters": ("job_id", ("traceback",)),
}
BATCH = 500


def upgrade() -> None:
    from models.security.crypto import seal_value, value_key_id

    conn = op.get_bind()
    for table, (key, columns) in SEALED.items():
        for column in columns:
            t = sa.table(table, sa.column(key), sa.column(column))
            rows = conn.execute(sa.select(t.c[key], t.c[column]).where(t.c[column].is_not(None))).all()
            plain = [(row_id, value) for row_id, value in rows if value_key_id(value) is None]
            for start in range(0, len(plain), BATCH):
                for row_id, value in plain[start : start + BATCH]:
                    sealed = seal_value(value, f"{table}.{column}:{row_id}")
                    conn.execute(sa.update(t).where(t.c[key] == row_id).values({column: sealed}))


def downgrade() -> None:
    from models.security.crypto import decrypt_value, value_key_id

    conn = op.get_bind()
    for table, (key, columns) in SEALED.items():
        for column in columns:
            t = sa.table(table, sa.column(key), sa.column(column))
            for row_id, value in conn.execute(sa.select(t.c[key], t.c[column]).where(t.c[column].is_not(None))).all():
                if value_key_id(value) is not None:
                    plain = decrypt_value(value, place=f"{table}.{column}:{row_id}")
                    conn.execute(sa.update(t).where(t.c[key] == row_id).values({column: plain}))
