"""The Job record: the source of truth for a transcription, whatever the broker says."""
from __future__ import annotations

import enum
import uuid
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, DateTime, Float, Integer, String, Text, TypeDecorator
from sqlalchemy.orm import Mapped, mapped_column

from .db import Base


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC on every database (SQLite keeps no zone of its own)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use datetime.now(timezone.utc)")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


class JobStatus(str, enum.Enum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED)


class InvalidTransition(RuntimeError):
    pass


# Which status may follow which. PROCESSING -> PROCESSING is a redelivery after a crash;
# PROCESSING -> PENDING is a retry that goes back to the queue.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.PROCESSING, JobStatus.FAILED}),
    JobStatus.PROCESSING: frozenset({JobStatus.PROCESSING, JobStatus.PENDING, JobStatus.COMPLETED, JobStatus.FAILED}),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset(),
}


def new_job_id() -> str:
    return str(uuid.uuid4())


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_job_id)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.PENDING.value, index=True)
    task: Mapped[str] = mapped_column(String(16), default="transcribe")
    language: Mapped[str | None] = mapped_column(String(8))
    priority: Mapped[str] = mapped_column(String(8), default="normal")
    audio_ref: Mapped[str] = mapped_column(Text)
    audio_owned: Mapped[bool] = mapped_column(default=True)
    filename: Mapped[str | None] = mapped_column(String(255))
    audio_duration: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    error: Mapped[str | None] = mapped_column(Text)
    result_text: Mapped[str | None] = mapped_column(Text)
    result_language: Mapped[str | None] = mapped_column(String(8))
    result_segments: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    processing_seconds: Mapped[float | None] = mapped_column(Float)

    @property
    def state(self) -> JobStatus:
        return JobStatus(self.status)

    def _move(self, new: JobStatus) -> None:
        if new not in TRANSITIONS[self.state]:
            raise InvalidTransition(f"job {self.id} cannot go from {self.status} to {new.value}")
        self.status = new.value

    def start(self, worker: str | None = None) -> None:
        self._move(JobStatus.PROCESSING)
        self.attempts = (self.attempts or 0) + 1
        self.started_at = utcnow()
        self.worker = worker
        self.error = None

    def complete(self, text: str, language: str | None, segments: list[dict[str, Any]], duration: float | None) -> None:
        self._move(JobStatus.COMPLETED)
        self.result_text = text
        self.result_language = language
        self.result_segments = segments
        if duration is not None:
            self.audio_duration = duration
        self.finished_at = utcnow()
        if self.started_at is not None:
            self.processing_seconds = (self.finished_at - self.started_at).total_seconds()

    def fail(self, reason: str) -> None:
        self._move(JobStatus.FAILED)
        self.error = reason
        self.finished_at = utcnow()

    def result(self) -> dict[str, Any] | None:
        """The transcript as a dict, or None while the job is not COMPLETED."""
        if self.state is not JobStatus.COMPLETED:
            return None
        return {
            "job_id": self.id,
            "text": self.result_text or "",
            "language": self.result_language,
            "duration": self.audio_duration,
            "segments": list(self.result_segments or []),
        }

    def to_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat().replace("+00:00", "Z") if value else None

        return {
            "job_id": self.id,
            "status": self.status,
            "task": self.task,
            "language": self.language,
            "priority": self.priority,
            "filename": self.filename,
            "audio_duration": self.audio_duration,
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "attempts": self.attempts,
            "error": self.error,
            "result": self.result(),
        }
