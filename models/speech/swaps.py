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
"""
from __future__ import annotations

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
from models.speech.catalog import version_of, weights_path

if TYPE_CHECKING:
    from config.registry import ModelSpec
    from config.settings import Settings
    from models.db import Database

CHECK_EVERY = 2.0  # seconds a worker trusts what it last read


class ModelWeights(Base):
    __tablename__ = "model_weights"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(48), index=True)
    weights: Mapped[str] = mapped_column(Text)
    version: Mapped[str] = mapped_column(String(80))
    action: Mapped[str] = mapped_column(String(16))  # "swap" or "rollback"
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "weights": self.weights, "version": self.version, "action": self.action,
                "at": self.created_at.isoformat().replace("+00:00", "Z")}


def check_weights(settings: Settings, spec: ModelSpec, weights: str) -> ModelSpec:
    """The spec with these weights, if they can be loaded as that model's (same engine)."""
    weights = weights.strip()
    if not weights.startswith("bundled:"):
        path = Path(weights)
        if not path.is_absolute():
            raise InvalidRequest(f"the weights {weights!r} must be an absolute path or bundled:NAME")
        if spec.engine == "openai-whisper" and not path.is_file():
            raise InvalidRequest(f"{weights} is not a file: the model {spec.name!r} runs openai-whisper, which "
                                 "loads a checkpoint (.pt)")
        if spec.engine != "openai-whisper" and not (path / "model.bin").is_file():
            raise InvalidRequest(f"{weights} is not a CTranslate2 model directory (no model.bin in it)")
    elif weights not in ("bundled:tiny.en", "bundled:base"):
        raise InvalidRequest("bundled weights are bundled:tiny.en and bundled:base")
    return replace(spec, weights=weights)


def swap(settings: Settings, db: Database, name: str, weights: str) -> ModelWeights:
    """Make `weights` the model's from now on; its workers take them up as jobs start."""
    spec = check_weights(settings, settings.model(name), weights)
    version = version_of(spec, settings.data_dir)  # assembles bundled:base if need be
    weights_path(spec, settings.data_dir)
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
        return list(session.execute(select(ModelWeights).where(ModelWeights.model == name)
                                    .order_by(ModelWeights.id)).scalars())


def _append(db: Database, name: str, weights: str, version: str, action: str) -> ModelWeights:
    with db.session(write=True) as session:
        row = ModelWeights(model=name, weights=weights, version=version, action=action)
        session.add(row)
        session.flush()
        session.expunge(row)
        return row


class ActiveWeights:
    """What each model name runs now, read from the database at most every CHECK_EVERY seconds."""

    def __init__(self, settings: Settings, db: Database, every: float = CHECK_EVERY):
        self.settings, self.db, self.every = settings, db, every
        self._seen: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def spec(self, name: str | None) -> ModelSpec:
        spec = self.settings.model(name)
        now = time.monotonic()
        seen = self._seen.get(spec.name)
        if seen is None or now - seen[0] >= self.every:
            with self._lock:
                with self.db.session() as session:
                    weights = session.execute(select(ModelWeights.weights).where(ModelWeights.model == spec.name)
                                              .order_by(ModelWeights.id.desc()).limit(1)).scalar_one_or_none()
                seen = self._seen[spec.name] = (now, weights or spec.weights)
        return replace(spec, weights=seen[1])
