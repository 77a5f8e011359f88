"""Where audio and prepared samples live, behind one interface (`Storage`): the local data
dir (the default, and a mount every host shares) or PostgreSQL large objects
(WHISPERQ_STORAGE=postgres), which every host that reaches the database reaches. The message
and the job row carry a reference, never bytes.

What is stored is sealed (models.security.sealed) on either backend; an upload is spooled,
sealed, to the receiving host's own tmp/ first and handed to the store whole.

Modules: base (the interface and what every backend shares), local, postgres, spool (the
upload spool, client file names, a caller's own files). May import models.db, models.security
and config.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from models.storage.base import Storage, StoredFile, prepared_ref
from models.storage.local import LocalStorage
from models.storage.postgres import PostgresStorage, StoredObject
from models.storage.spool import SealedSpool, caller_file, clean_filename, open_caller_file

if TYPE_CHECKING:
    from config import Settings
    from models.db import Database

__all__ = ["Storage", "StoredFile", "LocalStorage", "PostgresStorage", "StoredObject", "SealedSpool",
           "caller_file", "clean_filename", "open_caller_file", "open_storage", "prepared_ref"]


def open_storage(settings: Settings, db: Database) -> Storage:
    """The backend WHISPERQ_STORAGE names (config.env checked the pairing with DATABASE_URL)."""
    if settings.storage == "postgres":
        return PostgresStorage(settings.data_dir, db)
    return LocalStorage(settings.data_dir)
