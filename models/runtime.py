"""The per-process wiring: what a process builds from its settings, held in one object.

A Runtime holds the settings, the database, the audio storage and the keyring from the
start; a model's engine and batcher are built on first use (only an inference worker uses
them, and only for the models it is sent); the broker (the one seam through which models
reach the queues: publish a job, publish webhook deliveries, forget a result) is given by
whoever owns a Celery app (``tasks.broker.CeleryBroker``, set by ``web.create_app``,
``tasks.app.runtime`` and the CLI).
Building a Runtime installs the outbox's session hooks and makes its keyring the one the
sealed columns use.

This is the composition root of models: it may import every package, and no module of
models imports it except for type annotations (setup.cfg's import-linter contracts check both).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from config import Settings
from models.db import Database
from models.retry import RetryPolicy
from models.storage import Storage, open_storage

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from config.registry import ModelSpec
    from models.security.crypto import Keyring
    from models.speech.batching import Batcher
    from models.speech.engines import SpeechEngine

_T = TypeVar("_T")


class Broker(Protocol):
    """What models ask of the queues; implemented once, in tasks.broker."""

    def publish_job(self, job: Any, countdown: float | None = None, reply_to: str | None = None) -> None:
        """Send a job's transcribe message (its id and audio reference only)."""

    def publish_notify(self, delivery_ids: list[str]) -> None:
        """Send webhook deliveries to the notification pool."""

    def publish_analyses(
        self, job_id: str, names: list[str], priority: str, audio_seconds: float | None = None
    ) -> None:
        """Send a job's analyses (models.jobs.analyses) to the analysis pool, each with its time
        limit for `audio_seconds` of audio (None: the longest allowed)."""

    def forget_result(self, job_id: str) -> None:
        """Remove a job's entry from the result backend, if it has one."""


@dataclass(eq=False)
class Runtime:
    settings: Settings
    broker: Broker | None = None  # None: nothing is published (the sweeper sends what is owed later)
    db: Database = field(init=False)
    storage: Storage = field(init=False)
    keyring: Keyring = field(init=False)
    _parts: dict[tuple[str, ...], Any] = field(init=False, default_factory=dict, repr=False)
    _lock: threading.RLock = field(init=False, default_factory=threading.RLock, repr=False)

    def __post_init__(self) -> None:
        from models.delivery.notify import install_outbox
        from models.security.crypto import keyring_for, set_keyring

        self.keyring = keyring_for(self.settings)
        set_keyring(self.keyring)  # encryption at rest: the sealed columns and files read it
        self.db = Database(self.settings.database_url, session_info={"runtime": self})
        self.storage = open_storage(self.settings, self.db)
        install_outbox()

    @property
    def job_retries(self) -> RetryPolicy:
        """How often and how soon a failed job is tried again (models.retry)."""
        return RetryPolicy.for_jobs(self.settings)

    def engine_for(self, model: str | None = None) -> SpeechEngine:
        """A served model's engine (the default's for None), loaded on first use and kept: an
        inference process loads only the models it is sent.

        The weights are the model's newest swap (models.registry.swaps), read every few seconds:
        after a swap the next call loads the new weights and returns their engine from then
        on; the engine before is let go here, and lives on only in the jobs that began on it."""
        from models.registry.loader import load_engine

        spec = self.active_spec(model)
        key = ("engine", spec.name, spec.weights)
        engine: SpeechEngine | None = self._parts.get(key)
        if engine is None:
            engine = self._part(key, lambda: load_engine(self.settings, spec))
            with self._lock:
                for old in [k for k in self._parts if k[:2] == key[:2] and k != key]:
                    del self._parts[old]
        return engine

    def active_spec(self, model: str | None = None) -> ModelSpec:
        """A model's registry entry with the weights it runs now (its newest swap, if any)."""
        from models.registry.swaps import ActiveWeights

        active = self._part(("swaps", ""), lambda: ActiveWeights(self.settings, self.db))
        return active.spec(model)

    def batcher_for(self, model: str | None = None) -> Batcher:
        """The dynamic batcher a model's jobs submit their windows to (one per model)."""
        from models.pipeline.inference import build_batcher

        name = self.settings.model(model).name
        return self._part(("batcher", name), lambda: build_batcher(self, name))

    def s3_client(self) -> S3Client:
        """The client an `audio_url=s3://…` is read with (models.delivery.s3_fetch): storage's own
        where audio lives in S3, else one made on first use, configured the same way (AWS's own
        variables, the credentials chain)."""
        from models.storage.s3 import ProcessClient, S3Storage

        if isinstance(self.storage, S3Storage):
            return self.storage.client
        return self._part(("s3", ""), lambda: ProcessClient(self.settings.s3_expected_owner)).get()

    @property
    def engine(self) -> SpeechEngine:
        return self.engine_for(None)

    @property
    def batcher(self) -> Batcher:
        return self.batcher_for(None)

    def built(self, kind: str) -> list[Any]:
        """The parts of a kind ("engine", "batcher") built so far, without building any."""
        return [part for key, part in list(self._parts.items()) if key[0] == kind]

    def _part(self, name: tuple[str, ...], build: Callable[[], _T]) -> _T:
        part: _T | None = self._parts.get(name)
        if part is None:
            with self._lock:
                part = self._parts.get(name)
                if part is None:
                    part = self._parts[name] = build()
        return part


_runtime: Runtime | None = None
_lock = threading.Lock()


def get_runtime() -> Runtime:
    """This process's runtime, from the environment (workers and `transcribe.delay` callers)."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                runtime = Runtime(Settings.from_env())
                runtime.db.upgrade()
                _runtime = runtime
    return _runtime


def current_runtime() -> Runtime | None:
    """This process's runtime if get_runtime built one, without building it."""
    return _runtime


def reset_runtime() -> None:
    """Forget the runtime (after fork, or when tests change the environment)."""
    global _runtime
    if _runtime is not None:
        # The parent's pooled connections are shared with a forked child: let go of them
        # without closing them, or the parent's sessions break.
        _runtime.db.dispose(close=False)
    _runtime = None
