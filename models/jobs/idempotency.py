"""Idempotency keys for POST /v1/jobs: the same key and request give the same job."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import String, delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, mapped_column

from models.db import Base, UTCDateTime, rowcount, utcnow
from models.errors import IdempotencyConflict

if TYPE_CHECKING:
    from models.runtime import Runtime

KEEP = timedelta(hours=24)
MAX_KEY_LENGTH = 255


class IdempotencyKey(Base):
    __tablename__ = "idempotency_keys"

    key: Mapped[str] = mapped_column(String(MAX_KEY_LENGTH), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(36))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)


def lookup(rt: Runtime, key: str, fingerprint: str) -> str | None:
    """The job made earlier under this key, or None; 409 if the request differs."""
    with rt.db.session() as session:
        row = session.get(IdempotencyKey, key)
        if row is None or row.created_at < utcnow() - KEEP:
            return None
        if row.fingerprint != fingerprint:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used for a different request; use a new key for a new request"
            )
        return row.job_id


def seen(rt: Runtime, key: str | None) -> bool:
    """Whether a request under this key came in the last KEEP (its job is answered again)."""
    if key is None:
        return False
    with rt.db.session() as session:
        row = session.get(IdempotencyKey, key)
        return row is not None and row.created_at >= utcnow() - KEEP


def remember(rt: Runtime, key: str, fingerprint: str, job_id: str) -> str:
    """Record the key; if a concurrent request won the race, return the winner's job id."""
    try:
        with rt.db.session() as session:
            old = session.get(IdempotencyKey, key)
            if old is not None:  # expired: reuse the key
                session.delete(old)
                session.flush()
            session.add(IdempotencyKey(key=key, fingerprint=fingerprint, job_id=job_id))
        return job_id
    except IntegrityError:
        winner = lookup(rt, key, fingerprint)
        if winner is None:
            raise
        return winner


def forget_old(rt: Runtime) -> int:
    with rt.db.session() as session:
        result = session.execute(delete(IdempotencyKey).where(IdempotencyKey.created_at < utcnow() - KEEP))
        return rowcount(result) or 0


def forget(rt: Runtime, key: str) -> None:
    with rt.db.session() as session:
        session.execute(delete(IdempotencyKey).where(IdempotencyKey.key == key))
