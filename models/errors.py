"""The error hierarchy. Each message says what is wrong and how to fix it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from sqlalchemy.exc import InterfaceError, OperationalError


class WhisperqError(Exception):
    """Base class of the service's own errors."""

    code = "error"
    http_status = 500


class InvalidRequest(WhisperqError, ValueError):
    """The request itself is wrong (a field, an option): the client must change it."""

    code = "invalid_request"
    http_status = 400


class UnsupportedAudio(WhisperqError):
    """The upload is not audio that can be decoded. Permanent: retrying cannot help."""

    code = "unsupported_audio"
    http_status = 415


class SilentAudio(UnsupportedAudio):
    """Decodable, but nothing in it to transcribe."""

    code = "silent_audio"
    http_status = 422


class AudioTooLong(WhisperqError):
    code = "audio_too_long"
    http_status = 413


class TooLarge(WhisperqError):
    """More bytes than WHISPERQ_MAX_UPLOAD_MB allows (an object an audio_url names, by its size)."""

    code = "too_large"
    http_status = 413


class JobNotFound(WhisperqError):
    code = "not_found"
    http_status = 404


class JobNotReady(WhisperqError):
    code = "not_ready"
    http_status = 409


class ResultPurged(WhisperqError):
    """Retention deleted the transcript (WHISPERQ_RESULT_RETENTION); the job's record stays."""

    code = "result_deleted"
    http_status = 410


class TranscriptPurged(WhisperqError):
    """A change to a transcript that retention deleted: nothing is left to change (reading
    it is ResultPurged, 410)."""

    code = "result_deleted"
    http_status = 409


class AudioPurged(WhisperqError):
    """Retention deleted the job's audio (WHISPERQ_AUDIO_RETENTION): it cannot run again."""

    code = "audio_deleted"
    http_status = 409


class BrokerUnavailable(WhisperqError):
    code = "broker_unavailable"
    http_status = 503


class DatabaseUnavailable(WhisperqError):
    """The database could not be reached, or refused the work for now (restarting, failing
    over, its connections used up): what the request would have done is not done."""

    code = "database_unavailable"
    http_status = 503

    def __init__(self, message: str = "the database is unreachable right now; nothing was done: try again shortly"):
        super().__init__(message)


# What the database driver raises while the database is away (down, restarting, failing over,
# out of connections): every door answers it as DatabaseUnavailable.
DATABASE_AWAY: tuple[type[Exception], ...] = (OperationalError, InterfaceError)


class TransientJobError(WhisperqError):
    """A job that may succeed later (storage or broker hiccup, out of memory, time-out):
    retried with backoff up to WHISPERQ_MAX_ATTEMPTS, then dead-lettered."""

    code = "transient_failure"


class JobTimeLimitExceeded(TransientJobError):
    code = "time_limit"


class JobCancelled(WhisperqError):
    """The client cancelled (or deleted) the job; it is not run further."""

    code = "cancelled"
    http_status = 409


class JobExpired(WhisperqError):
    """The job was not started within WHISPERQ_JOB_TTL; it is EXPIRED and never runs."""

    code = "expired"


class AttemptsExhausted(WhisperqError):
    """The job used up its attempts and is in the dead-letter store."""

    code = "dead_lettered"


class PermanentJobError(WhisperqError):
    """A job that can never succeed (bad audio, missing file): fail it at once, no retry."""

    code = "permanent_failure"


class IdempotencyConflict(WhisperqError):
    code = "idempotency_conflict"
    http_status = 409


class UnsupportedMediaType(WhisperqError):
    code = "unsupported_media_type"
    http_status = 415


class Unauthorized(WhisperqError):
    code = "unauthorized"
    http_status = 401
    headers: ClassVar[Mapping[str, str]] = {"WWW-Authenticate": 'Bearer realm="whisperq"'}


class Forbidden(WhisperqError):
    code = "forbidden"
    http_status = 403


class ModelNotServed(WhisperqError):
    """A model is configured but no live inference worker serves it: its jobs would wait
    for nobody, so they are refused (the default model's jobs wait for its workers)."""

    code = "model_not_served"
    http_status = 503


class ClaimHeld(WhisperqError):
    """Another worker holds the job's inference claim, its lease live (models.jobs.claims):
    this delivery runs nothing and comes back once that lease could have lapsed."""

    code = "claim_held"

    def __init__(self, message: str, retry_in: float):
        super().__init__(message)
        self.retry_in = retry_in


class ClaimLost(WhisperqError):
    """This worker's claim on a job was taken over after its lease lapsed: its run is
    discarded, never stored; the claim's new holder finishes the job."""

    code = "claim_lost"
