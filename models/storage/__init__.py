"""Where audio and prepared samples live, behind one interface (`Storage`): the local data
dir (the default, and a mount every host shares), PostgreSQL large objects
(WHISPERQ_STORAGE=postgres), which every host that reaches the database reaches, or objects in
S3 or an S3-compatible store (WHISPERQ_STORAGE=s3://BUCKET/PREFIX). The message and the job row
carry a reference, never bytes.

What is stored is sealed (models.security.sealed) on every backend; an upload is spooled,
sealed, to the receiving host's own tmp/ first and handed to the store whole.

Modules: base (the interface and what every backend shares), local, postgres, s3 (boto3,
imported only where S3 storage is configured), spool (the upload spool, client file names, a
caller's own files). May import models.db, models.security and config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.storage.base import Storage, StoredFile, check_job_id, check_ref, prepared_ref
from models.storage.local import LocalStorage
from models.storage.postgres import PostgresStorage, StoredObject
from models.storage.s3 import S3Storage
from models.storage.spool import SealedSpool, caller_file, clean_filename, open_caller_file

if TYPE_CHECKING:
    from config import Settings
    from models.db import Database

__all__ = [
    "LocalStorage",
    "PostgresStorage",
    "S3Storage",
    "SealedSpool",
    "Storage",
    "StoredFile",
    "StoredObject",
    "caller_file",
    "check_job_id",
    "check_ref",
    "clean_filename",
    "open_caller_file",
    "open_storage",
    "prepared_ref",
]


def open_storage(settings: Settings, db: Database) -> Storage:
    """The backend WHISPERQ_STORAGE names (config.env checked the pairing with DATABASE_URL)."""
    if settings.storage == "postgres":
        return PostgresStorage(settings.data_dir, db)
    if settings.storage.startswith("s3://"):
        return S3Storage(settings.data_dir, settings.storage, owner=settings.s3_expected_owner)
    return LocalStorage(settings.data_dir)
