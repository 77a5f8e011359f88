"""The models: the Job record and the speech models, plus the plain functions around them."""
from .errors import (
    AudioTooLong,
    BrokerUnavailable,
    InvalidRequest,
    JobNotFound,
    JobNotReady,
    PermanentJobError,
    UnsupportedAudio,
    WhisperqError,
)
from .job import Job, JobStatus
from .runtime import Runtime, get_runtime
from .speech import Segment, Transcript

__all__ = [
    "Job", "JobStatus", "Runtime", "get_runtime", "Segment", "Transcript", "WhisperqError",
    "InvalidRequest", "UnsupportedAudio", "AudioTooLong", "JobNotFound", "JobNotReady",
    "BrokerUnavailable", "PermanentJobError",
]
