"""The product's domain: what a job is and everything done to it, without Celery or Flask.

Packages, lowest first; each may import config, the packages below it, and the foundation:

- ``models.security`` - the keyring, sealed columns and sealed files (encryption at rest).
  Imports config only.
- foundation, at this level: ``errors`` (the error hierarchy), ``db`` (engine, sessions,
  UTC columns), ``models.storage`` (audio by reference: the data dir, PostgreSQL large
  objects or S3; it may import db), ``retry`` (the retry policy), ``compat``
  (workarounds of libraries' internals), ``migrations`` (Alembic revisions). May import security.
- ``models.speech`` - audio, windows, engines, the batcher, transcripts and their formats.
  Knows nothing of jobs or the database.
- ``models.jobs`` - the Job record and its state machine, store operations, idempotency,
  dead letters, the sweeper, heartbeats, estimates and worker-side metrics.
- ``models.registry`` - the models served at run time: each one's weights and version, hot
  swaps and rollbacks (a table), and its engine, loaded. May import speech; never jobs.
- ``models.access`` - API keys and tiers, and admission at the front door. May import jobs.
- ``models.delivery`` - outbound HTTP under the address guard: webhooks, the outbox, fetching
  audio by URL. May import jobs and access.
- ``models.pipeline`` - the one door every job enters by (``door``: one Submission, one
  ``admit``, whichever way it came in), then the two worker stages: preparing a job and
  running inference. May import speech, registry, jobs, access and delivery.
- ``models.maintenance`` - work over every store at once: retention, key rotation and the
  training-data export.
- ``models.runtime`` - the per-process wiring (settings, database, storage, keyring, engines,
  batchers, the broker seam): may import everything; the rest import it only for
  type annotations.

``models`` never imports ``tasks`` or ``web``; import-linter's contracts in setup.cfg enforce the order. This
module is the package's public face: importing ``models`` declares every table on
``models.db.Base``, which the migrations compare against.
"""

from models.access import apikeys as _apikeys  # noqa: F401 - declares its tables
from models.delivery import mqtt_replies as _mqtt_replies  # noqa: F401
from models.delivery import notify as _notify  # noqa: F401
from models.errors import (
    AudioTooLong,
    BrokerUnavailable,
    InvalidRequest,
    JobNotFound,
    JobNotReady,
    PermanentJobError,
    UnsupportedAudio,
    WhisperqError,
)
from models.jobs import batches as _batches  # noqa: F401
from models.jobs import deadletter as _deadletter  # noqa: F401
from models.jobs import idempotency as _idempotency  # noqa: F401
from models.jobs import ledger as _ledger  # noqa: F401
from models.jobs import shadows as _shadows  # noqa: F401
from models.jobs import workers as _workers  # noqa: F401
from models.jobs.record import Job, JobStatus, Stage
from models.registry import swaps as _swaps  # noqa: F401
from models.runtime import Runtime, get_runtime
from models.speech.segments import Segment, Transcript
from models.storage import postgres as _stored_objects  # noqa: F401

__all__ = [
    "AudioTooLong",
    "BrokerUnavailable",
    "InvalidRequest",
    "Job",
    "JobNotFound",
    "JobNotReady",
    "JobStatus",
    "PermanentJobError",
    "Runtime",
    "Segment",
    "Stage",
    "Transcript",
    "UnsupportedAudio",
    "WhisperqError",
    "get_runtime",
]
