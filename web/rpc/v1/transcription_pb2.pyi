import datetime

from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitRequest(_message.Message):
    __slots__ = ("audio", "audio_url", "filename", "language", "priority", "model", "task", "word_timestamps", "prompt", "temperature", "collect", "callback_url", "idempotency_key", "hotwords", "speakers", "redact")
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    AUDIO_URL_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    COLLECT_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    HOTWORDS_FIELD_NUMBER: _ClassVar[int]
    SPEAKERS_FIELD_NUMBER: _ClassVar[int]
    REDACT_FIELD_NUMBER: _ClassVar[int]
    audio: bytes
    audio_url: str
    filename: str
    language: str
    priority: str
    model: str
    task: str
    word_timestamps: bool
    prompt: str
    temperature: float
    collect: bool
    callback_url: str
    idempotency_key: str
    hotwords: str
    speakers: str
    redact: str
    def __init__(self, audio: _Optional[bytes] = ..., audio_url: _Optional[str] = ..., filename: _Optional[str] = ..., language: _Optional[str] = ..., priority: _Optional[str] = ..., model: _Optional[str] = ..., task: _Optional[str] = ..., word_timestamps: _Optional[bool] = ..., prompt: _Optional[str] = ..., temperature: _Optional[float] = ..., collect: _Optional[bool] = ..., callback_url: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., hotwords: _Optional[str] = ..., speakers: _Optional[str] = ..., redact: _Optional[str] = ...) -> None: ...

class UploadChunk(_message.Message):
    __slots__ = ("head", "data")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    head: SubmitRequest
    data: bytes
    def __init__(self, head: _Optional[_Union[SubmitRequest, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "status", "stage", "progress", "queue_position", "estimated_start_at", "estimated_finish_at", "error", "result", "task", "language", "priority", "model", "route", "rerun_of", "batch_id", "filename", "audio_duration", "created_at", "started_at", "finished_at", "attempts", "word_timestamps", "audio_url", "callback_url", "next_attempt_at", "audio_purged_at", "result_purged_at", "notice", "collect", "correction", "hotwords", "confidence", "analyses")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[Job.Status]
        PENDING: _ClassVar[Job.Status]
        PROCESSING: _ClassVar[Job.Status]
        COMPLETED: _ClassVar[Job.Status]
        FAILED: _ClassVar[Job.Status]
        EXPIRED: _ClassVar[Job.Status]
        CANCELLED: _ClassVar[Job.Status]
    STATUS_UNSPECIFIED: Job.Status
    PENDING: Job.Status
    PROCESSING: Job.Status
    COMPLETED: Job.Status
    FAILED: Job.Status
    EXPIRED: Job.Status
    CANCELLED: Job.Status
    class AnalysesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Analysis
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Analysis, _Mapping]] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_POSITION_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_START_AT_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_FINISH_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ROUTE_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    AUDIO_DURATION_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_URL_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    AUDIO_PURGED_AT_FIELD_NUMBER: _ClassVar[int]
    RESULT_PURGED_AT_FIELD_NUMBER: _ClassVar[int]
    NOTICE_FIELD_NUMBER: _ClassVar[int]
    COLLECT_FIELD_NUMBER: _ClassVar[int]
    CORRECTION_FIELD_NUMBER: _ClassVar[int]
    HOTWORDS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    ANALYSES_FIELD_NUMBER: _ClassVar[int]
    id: str
    status: Job.Status
    stage: str
    progress: float
    queue_position: int
    estimated_start_at: _timestamp_pb2.Timestamp
    estimated_finish_at: _timestamp_pb2.Timestamp
    error: str
    result: Result
    task: str
    language: str
    priority: str
    model: str
    route: str
    rerun_of: str
    batch_id: str
    filename: str
    audio_duration: float
    created_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    attempts: int
    word_timestamps: bool
    audio_url: str
    callback_url: str
    next_attempt_at: _timestamp_pb2.Timestamp
    audio_purged_at: _timestamp_pb2.Timestamp
    result_purged_at: _timestamp_pb2.Timestamp
    notice: str
    collect: bool
    correction: Correction
    hotwords: str
    confidence: float
    analyses: _containers.MessageMap[str, Analysis]
    def __init__(self, id: _Optional[str] = ..., status: _Optional[_Union[Job.Status, str]] = ..., stage: _Optional[str] = ..., progress: _Optional[float] = ..., queue_position: _Optional[int] = ..., estimated_start_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., estimated_finish_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., error: _Optional[str] = ..., result: _Optional[_Union[Result, _Mapping]] = ..., task: _Optional[str] = ..., language: _Optional[str] = ..., priority: _Optional[str] = ..., model: _Optional[str] = ..., route: _Optional[str] = ..., rerun_of: _Optional[str] = ..., batch_id: _Optional[str] = ..., filename: _Optional[str] = ..., audio_duration: _Optional[float] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., attempts: _Optional[int] = ..., word_timestamps: _Optional[bool] = ..., audio_url: _Optional[str] = ..., callback_url: _Optional[str] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., audio_purged_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., result_purged_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., notice: _Optional[str] = ..., collect: _Optional[bool] = ..., correction: _Optional[_Union[Correction, _Mapping]] = ..., hotwords: _Optional[str] = ..., confidence: _Optional[float] = ..., analyses: _Optional[_Mapping[str, Analysis]] = ...) -> None: ...

class Analysis(_message.Message):
    __slots__ = ("status", "version", "error", "seconds")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    status: str
    version: str
    error: str
    seconds: float
    def __init__(self, status: _Optional[str] = ..., version: _Optional[str] = ..., error: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class Result(_message.Message):
    __slots__ = ("text", "language", "duration", "segments", "model", "partial", "language_probability", "confidence", "speakers", "turns", "redacted", "analyses")
    class AnalysesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Analysis
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Analysis, _Mapping]] = ...) -> None: ...
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PARTIAL_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SPEAKERS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    REDACTED_FIELD_NUMBER: _ClassVar[int]
    ANALYSES_FIELD_NUMBER: _ClassVar[int]
    text: str
    language: str
    duration: float
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    model: _struct_pb2.Struct
    partial: bool
    language_probability: float
    confidence: float
    speakers: _containers.RepeatedScalarFieldContainer[str]
    turns: _containers.RepeatedCompositeFieldContainer[Turn]
    redacted: Redacted
    analyses: _containers.MessageMap[str, Analysis]
    def __init__(self, text: _Optional[str] = ..., language: _Optional[str] = ..., duration: _Optional[float] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., model: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., partial: _Optional[bool] = ..., language_probability: _Optional[float] = ..., confidence: _Optional[float] = ..., speakers: _Optional[_Iterable[str]] = ..., turns: _Optional[_Iterable[_Union[Turn, _Mapping]]] = ..., redacted: _Optional[_Union[Redacted, _Mapping]] = ..., analyses: _Optional[_Mapping[str, Analysis]] = ...) -> None: ...

class Segment(_message.Message):
    __slots__ = ("start", "end", "text", "words", "language", "avg_logprob", "no_speech_prob", "compression_ratio", "speaker")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    AVG_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    NO_SPEECH_PROB_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_RATIO_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    start: float
    end: float
    text: str
    words: _containers.RepeatedCompositeFieldContainer[Word]
    language: str
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    speaker: str
    def __init__(self, start: _Optional[float] = ..., end: _Optional[float] = ..., text: _Optional[str] = ..., words: _Optional[_Iterable[_Union[Word, _Mapping]]] = ..., language: _Optional[str] = ..., avg_logprob: _Optional[float] = ..., no_speech_prob: _Optional[float] = ..., compression_ratio: _Optional[float] = ..., speaker: _Optional[str] = ...) -> None: ...

class Word(_message.Message):
    __slots__ = ("word", "start", "end", "probability", "speaker")
    WORD_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    word: str
    start: float
    end: float
    probability: float
    speaker: str
    def __init__(self, word: _Optional[str] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., probability: _Optional[float] = ..., speaker: _Optional[str] = ...) -> None: ...

class Turn(_message.Message):
    __slots__ = ("speaker", "start", "end")
    SPEAKER_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    speaker: str
    start: float
    end: float
    def __init__(self, speaker: _Optional[str] = ..., start: _Optional[float] = ..., end: _Optional[float] = ...) -> None: ...

class Redacted(_message.Message):
    __slots__ = ("kinds", "count")
    KINDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    count: int
    def __init__(self, kinds: _Optional[_Iterable[str]] = ..., count: _Optional[int] = ...) -> None: ...

class Correction(_message.Message):
    __slots__ = ("text", "segments", "corrected_at")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    CORRECTED_AT_FIELD_NUMBER: _ClassVar[int]
    text: str
    segments: _containers.RepeatedCompositeFieldContainer[Segment]
    corrected_at: _timestamp_pb2.Timestamp
    def __init__(self, text: _Optional[str] = ..., segments: _Optional[_Iterable[_Union[Segment, _Mapping]]] = ..., corrected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
