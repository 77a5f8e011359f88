"""The Job record: the source of truth for a transcription, whatever the broker says."""

from __future__ import annotations

import enum
import uuid
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, inspect
from sqlalchemy.orm import Mapped, mapped_column, relationship
from sqlalchemy.orm.base import NO_VALUE

from models.db import Base
from models.db import UTCDateTime as UTCDateTime  # UTCDateTime and utcnow are also part of this API
from models.db import utcnow as utcnow
from models.security.crypto import SealedAttribute


@dataclass(frozen=True)
class JobOptions:
    """How a job is to be transcribed, as a client asked (checked by
    models.pipeline.options.parse_options at the one door): the job row's own fields."""

    language: str | None = None
    priority: str = "normal"
    task: str = "transcribe"
    model: str | None = None  # a model or an alias (config.registry); None: the default
    word_timestamps: bool = False
    prompt: str | None = None
    temperature: float | None = None
    callback_url: str | None = None
    collect: bool = False
    hotwords: str | None = None  # words to listen for, as one string (models.pipeline.options)
    analyses: dict[str, dict[str, Any]] | None = None  # name -> parameters (models.analysis)

    def fields(self) -> dict[str, Any]:
        return asdict(self)


class JobStatus(str, enum.Enum):
    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.EXPIRED, JobStatus.CANCELLED)


# The statuses of a job that will not run again (as stored), for queries.
FINISHED = tuple(status.value for status in JobStatus if status.finished)


class Stage(str, enum.Enum):
    """Where a PROCESSING job is: decoded in the preparation pool, waiting for the speech
    model, or being transcribed. Stored as its value (`.value` in rows and SQL)."""

    PREPARE = "prepare"
    QUEUED = "queued"
    INFER = "infer"
    ANALYSIS = "analysis"  # the transcript is stored; the analyses it asked for are running


class InvalidTransition(RuntimeError):
    pass


# Which status may follow which. PROCESSING -> PROCESSING is a redelivery after a crash;
# PROCESSING -> PENDING is a retry that goes back to the queue; FAILED -> PENDING is an
# operator's replay from the dead-letter queue; PENDING -> COMPLETED is a worker the
# sweeper wrongly gave up on finishing after all (its transcript is as good as any).
# A client may cancel a job that has not finished.
TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset(
        {JobStatus.PROCESSING, JobStatus.FAILED, JobStatus.EXPIRED, JobStatus.COMPLETED, JobStatus.CANCELLED}
    ),
    JobStatus.PROCESSING: frozenset(
        {JobStatus.PROCESSING, JobStatus.PENDING, JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED}
    ),
    JobStatus.COMPLETED: frozenset(),
    JobStatus.FAILED: frozenset({JobStatus.PENDING}),
    JobStatus.EXPIRED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}

# The webhook event each final state sends.
EVENTS = {
    JobStatus.COMPLETED: "job.completed",
    JobStatus.FAILED: "job.failed",
    JobStatus.CANCELLED: "job.cancelled",
    JobStatus.EXPIRED: "job.expired",
}


# What a job whose transcript retention deleted says instead of its transcript.
RESULT_PURGED = "the transcript was deleted after the retention period (WHISPERQ_RESULT_RETENTION)"


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
    # The transcript, encrypted at rest and bound to this row (models.security.crypto): read and
    # write result_text and result_segments; the *_token columns hold the ciphertext.
    result_text_token: Mapped[str | None] = mapped_column("result_text", Text)
    result_language: Mapped[str | None] = mapped_column(String(8))
    result_segments_token: Mapped[Any] = mapped_column("result_segments", JSON, nullable=True)
    processing_seconds: Mapped[float | None] = mapped_column(Float)
    # Where a PROCESSING job is (a Stage's value); and which worker process holds its message.
    stage: Mapped[str | None] = mapped_column(String(16))
    worker_id: Mapped[str | None] = mapped_column(String(64), index=True)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # When a worker reserved its message (its worker_id says which).
    held_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # When it last entered the queue (creation or replay): the time-to-live counts from here.
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Where to POST the job when it ends (see models.delivery.notify), sealed: read and write
    # callback_url (a URL may carry a token of the receiver's).
    callback_url_token: Mapped[str | None] = mapped_column("callback_url", Text)
    # Submitted by URL: the preparation pool fetches it (see models.delivery.fetch); sealed, as
    # a presigned URL carries its signature: read and write audio_url.
    audio_url_token: Mapped[str | None] = mapped_column("audio_url", Text)
    word_timestamps: Mapped[bool | None] = mapped_column(default=False)
    # Decoding options: Whisper's initial prompt (sealed: read and write prompt), and the
    # sampling temperature.
    prompt_token: Mapped[str | None] = mapped_column("prompt", Text)
    temperature: Mapped[float | None] = mapped_column(Float)
    # Audio seconds transcribed so far, and when inference began: progress and estimates.
    progress_seconds: Mapped[float | None] = mapped_column(Float)
    infer_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # A client asked to cancel a running job: it stops at the next window boundary.
    cancel_requested: Mapped[bool | None] = mapped_column(default=False)
    # DELETE: audio and transcript are gone; the row stays so a late message finds it.
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Retention (models.maintenance.retention) deleted the audio, or the transcript, at these times.
    audio_purged_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    result_purged_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The API key that submitted it (models.access.apikeys); None for anonymous use and for
    # transcribe.delay() callers. Other keys get 404 for it.
    owner: Mapped[str | None] = mapped_column(String(36), index=True)
    # The container the door found (models.speech.audio.DEMUXERS), pinned when the file is decoded.
    audio_format: Mapped[str | None] = mapped_column(String(16))
    # How many times the engine went through all of the job's windows under a claim still
    # held when its transcript was stored: once, whatever the deliveries (a run cut short by a
    # crash, or discarded because its claim was taken over, is not counted). The tests read it.
    engine_runs: Mapped[int | None] = mapped_column(Integer)
    # The inference claim (models.jobs.claims): the fencing token, raised by each run that takes
    # it; who holds it (host:pid); and when its lease lapses unless renewed (None: free).
    claim_token: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    claim_holder: Mapped[str | None] = mapped_column(String(255))
    claim_expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The model asked for (a name of config.registry; None: the deployment's default when the
    # job was made, before models had names), and what made the transcript: the weights'
    # version, the engine and its decoding options (recorded by the inference worker).
    model: Mapped[str | None] = mapped_column(String(48))
    model_version: Mapped[str | None] = mapped_column(String(80))
    decoding: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The alias the job named when its model was chosen by weight (config.registry), and the
    # candidate model that decodes it again in shadow (models.jobs.shadows), if any.
    route: Mapped[str | None] = mapped_column(String(48))
    shadow: Mapped[str | None] = mapped_column(String(48))
    # The job this one re-runs (POST /v1/jobs/<id>/rerun): same audio, maybe another model.
    rerun_of: Mapped[str | None] = mapped_column(String(36), index=True)
    # The batch it was submitted in (POST /v1/batches; models.jobs.batches), if any.
    batch_id: Mapped[str | None] = mapped_column(String(36), index=True)
    # Training-data logging (opt-in per key or per job): `whisperq dataset export` takes it;
    # a client's correction is kept beside the original transcript (sealed like it).
    collect: Mapped[bool | None] = mapped_column(default=False)
    correction_token: Mapped[Any] = mapped_column("correction", JSON, nullable=True)
    corrected_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The way in it came through (models.pipeline.door.DOORS): a transcribe.delay() job keeps
    # its transcript in the result backend too (for r.get()); no other job's ever goes there.
    origin: Mapped[str | None] = mapped_column(String(16))
    # Words to listen for (the job's, else its key's), and the analyses asked for: name ->
    # parameters (models.analysis); each one's run is a JobAnalysis row.
    hotwords_token: Mapped[str | None] = mapped_column("hotwords", Text)  # sealed: read and write hotwords
    analyses: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # How sure the model was: the transcript's mean token probability (models.speech.segments
    # .confidence), and of its language.
    confidence: Mapped[float | None] = mapped_column(Float, index=True)
    language_probability: Mapped[float | None] = mapped_column(Float)
    # What the analyses add to the transcript beside its segments (speakers, turns, what was
    # redacted): labels, times and counts, no words.
    result_extra: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    # Each analysis asked for, once the transcript is stored (models.jobs.analyses).
    analysis_runs: Mapped[list[JobAnalysis]] = relationship(
        back_populates="job", lazy="selectin", cascade="all, delete-orphan", order_by="JobAnalysis.name"
    )

    result_text = SealedAttribute("result_text_token", "jobs.result_text")
    result_segments = SealedAttribute("result_segments_token", "jobs.result_segments", as_json=True)
    correction = SealedAttribute("correction_token", "jobs.correction", as_json=True)
    # What a client said of its job that may name people or hold secrets: sealed like the transcript.
    callback_url = SealedAttribute("callback_url_token", "jobs.callback_url")
    audio_url = SealedAttribute("audio_url_token", "jobs.audio_url")
    prompt = SealedAttribute("prompt_token", "jobs.prompt")
    hotwords = SealedAttribute("hotwords_token", "jobs.hotwords")

    def runs(self) -> list[JobAnalysis]:
        """Its analyses' rows as loaded (none on a row detached before they were)."""
        state = inspect(self)
        loaded = state.attrs.analysis_runs.loaded_value
        if loaded is NO_VALUE:
            return list(self.analysis_runs) if state.session is not None else []
        return list(loaded)

    @property
    def state(self) -> JobStatus:
        return JobStatus(self.status)

    def _move(self, new: JobStatus) -> None:
        if new not in TRANSITIONS[self.state]:
            raise InvalidTransition(f"job {self.id} cannot go from {self.status} to {new.value}")
        self.status = new.value

    def start(self, worker: str | None = None, worker_id: str | None = None) -> None:
        """An attempt begins (first delivery, retry, or redelivery after a crash)."""
        self._move(JobStatus.PROCESSING)
        self.attempts = (self.attempts or 0) + 1
        self.started_at = utcnow()
        self.worker = worker
        self.worker_id = worker_id
        self.stage = Stage.PREPARE.value
        self.next_attempt_at = None

    def retry_later(self, reason: str, when: datetime) -> None:
        self._move(JobStatus.PENDING)
        self.error = reason
        self.stage = None
        self.worker_id = None
        self.next_attempt_at = when
        self.progress_seconds = None  # nothing of the failed attempt was kept (and nothing of it is billed)

    def waiting_since(self) -> datetime:
        return self.queued_at or self.created_at

    def expire(self) -> None:
        self._move(JobStatus.EXPIRED)
        self.error = "the job was not started within its time-to-live (WHISPERQ_JOB_TTL)"
        self.finished_at = utcnow()

    def reset_for_replay(self) -> None:
        self._move(JobStatus.PENDING)
        self.queued_at = utcnow()
        self.attempts = 0
        self.error = None
        self.finished_at = None
        self.stage = None
        self.worker_id = None
        self.next_attempt_at = None
        self.progress_seconds = None

    def complete(self, *transcript: Any, **named: Any) -> None:
        """The transcript stored (store_transcript's arguments) and the job COMPLETED at once."""
        self.store_transcript(*transcript, **named)
        self.finish()

    def store_transcript(
        self,
        text: str,
        language: str | None,
        segments: list[dict[str, Any]],
        duration: float | None,
        made_by: dict[str, Any] | None = None,
        language_probability: float | None = None,
    ) -> None:
        """The transcript is stored; the job finishes now (complete) or once its analyses are done."""
        from models.speech.segments import confidence

        self._made_by(made_by)
        self.replace_transcript(text, segments)
        self.result_language = language
        self.language_probability = language_probability
        self.confidence = confidence(segments)
        if duration is not None:
            self.audio_duration = duration

    def analysing(self) -> dict[str, Any]:
        """What a run answers for a job whose transcript is stored while its analyses run."""
        return {"job_id": self.id, "status": self.status, "stage": self.stage}

    def replace_transcript(self, text: str, segments: list[dict[str, Any]]) -> None:
        self.result_text = text
        self.result_segments = segments

    def finish(self) -> None:
        """COMPLETED: the transcript (stored) and every analysis asked for are done."""
        self._move(JobStatus.COMPLETED)
        self.finished_at = utcnow()
        self.stage = None
        if self.started_at is not None:
            self.processing_seconds = (self.finished_at - self.started_at).total_seconds()

    def cancel(self, partial: dict[str, Any] | None = None) -> None:
        self._move(JobStatus.CANCELLED)
        self.error = "cancelled by the client"
        self.finished_at = utcnow()
        self.stage = None
        if partial is not None:  # what was transcribed before the cancel is kept
            self._made_by(partial.get("model"))
            self.result_text = partial["text"]
            self.result_language = partial["language"]
            self.result_segments = partial["segments"]

    def _made_by(self, made_by: dict[str, Any] | None) -> None:
        if made_by:
            self.model = made_by.get("name") or self.model
            self.model_version = made_by.get("version")
            self.decoding = {k: v for k, v in made_by.items() if k not in ("name", "version")}

    def fail(self, reason: str) -> None:
        self._move(JobStatus.FAILED)
        self.error = reason
        self.finished_at = utcnow()
        self.stage = None

    def result(self) -> dict[str, Any] | None:
        """The transcript as a dict: the whole one once COMPLETED, the part done before a
        cancel (`partial`), or None."""
        if self.state is JobStatus.CANCELLED and self.result_segments is not None:
            partial = True
        elif self.state is JobStatus.COMPLETED:
            partial = False
        else:
            return None
        out = {
            "job_id": self.id,
            "text": self.result_text or "",
            "language": self.result_language,
            "duration": self.audio_duration,
            "segments": list(self.result_segments or []),
        }
        if self.language_probability is not None:
            out["language_probability"] = self.language_probability
        if self.confidence is not None:
            out["confidence"] = self.confidence
        out.update(self.result_extra or {})
        if self.runs():
            out["analyses"] = {run.name: run.to_dict() for run in self.runs()}
        if self.model_version:
            out["model"] = {"name": self.model, "version": self.model_version, **(self.decoding or {})}
        if partial:
            out["partial"] = True
        return out

    @property
    def progress(self) -> float:
        if self.state is JobStatus.COMPLETED:
            return 1.0
        if not self.audio_duration or not self.progress_seconds:
            return 0.0
        return round(min(1.0, self.progress_seconds / self.audio_duration), 3)

    def to_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat().replace("+00:00", "Z") if value else None

        return {
            "job_id": self.id,
            "status": self.status,
            "task": self.task,
            "language": self.language,
            "priority": self.priority,
            "model": self.model,
            "route": self.route,
            "rerun_of": self.rerun_of,
            "batch_id": self.batch_id,
            "filename": self.filename,
            "audio_duration": self.audio_duration,
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "finished_at": iso(self.finished_at),
            "attempts": self.attempts,
            "stage": self.stage,
            "progress": self.progress,
            "word_timestamps": bool(self.word_timestamps),
            "audio_url": self.audio_url,
            "callback_url": self.callback_url,
            "next_attempt_at": iso(self.next_attempt_at),
            "error": self.error,
            "result": None if self.result_purged_at is not None else self.result(),
            "audio_purged_at": iso(self.audio_purged_at),
            "result_purged_at": iso(self.result_purged_at),
            "notice": RESULT_PURGED if self.result_purged_at is not None else None,
            "collect": bool(self.collect),
            "hotwords": self.hotwords,
            "confidence": self.confidence,
            "analyses": {run.name: run.to_dict() for run in self.runs()}
            or ({name: {"status": AnalysisStatus.PENDING.value} for name in self.analyses} if self.analyses else None),
            # A client's correction (models.jobs.corrections), kept beside the original `result`.
            "correction": None
            if self.correction_token is None or self.result_purged_at is not None
            else {
                **{k: (self.correction or {}).get(k) for k in ("text", "segments")},
                "corrected_at": iso(self.corrected_at),
            },
        }


class AnalysisStatus(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    DONE = "DONE"
    FAILED = "FAILED"


class JobAnalysis(Base):
    """One analysis of one job (models.analysis): made PENDING when the transcript is stored,
    run by the analysis pool, DONE with its output or FAILED with why. Its output holds labels,
    times and counts, never the transcript's words (the merged transcript is the job's, sealed)."""

    __tablename__ = "job_analyses"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    params: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=AnalysisStatus.PENDING.value, index=True)
    version: Mapped[str | None] = mapped_column(String(32))
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # How many runs stored an output: once, whatever the deliveries (the tests read it).
    runs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    queued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    seconds: Mapped[float | None] = mapped_column(Float)

    job: Mapped[Job] = relationship(back_populates="analysis_runs")

    @property
    def finished(self) -> bool:
        return self.status in (AnalysisStatus.DONE.value, AnalysisStatus.FAILED.value)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "version": self.version}
        if self.error:
            out["error"] = self.error
        if self.seconds is not None:
            out["seconds"] = round(self.seconds, 3)
        return out
