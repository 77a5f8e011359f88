"""The message between the pools: what the preparation pool hands the inference pool.

It travels as JSON (the ``whisperq.infer`` task's one argument) and carries references and
sample offsets, never audio, and names the model to run. It is typed on both sides: built as a ``Prepared`` by
``prepare_job``, sent with ``to_message()``, and checked by ``Prepared.from_message()`` where
the inference pool takes it, so a malformed message fails its job with a clear error instead
of a KeyError deep in a worker.

``schema`` is the message's version. A change that old workers can ignore (a new optional
field) keeps it; one they would misread raises it. A message without one comes from before
versioning and has the shape of version 1. A message newer than this worker understands is
tried again (another worker, upgraded, may take it) until the attempts run out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from models.errors import PermanentJobError, TransientJobError
from models.speech.windows import Window

SCHEMA = 1


class MalformedMessage(PermanentJobError):
    code = "malformed_message"


@dataclass(frozen=True)
class Prepared:
    """A job ready for the model: its prepared samples (a storage reference), their windows
    and how to decode them."""

    job_id: str
    samples_ref: str
    duration: float
    windows: tuple[Window, ...]
    language: str | None = None
    task: str = "transcribe"
    priority: str = "normal"
    word_timestamps: bool = False
    prompt: str | None = None
    temperature: float = 0.0
    model: str | None = None  # a served model's name (config.registry); None: the default
    hotwords: str | None = None  # words to listen for (faster-whisper's hotwords)
    # The candidate model that decodes the job again, apart (models.jobs.shadows), and its own
    # copy of the samples; the inference task ignores both.
    shadow: str | None = None
    shadow_ref: str | None = None

    def to_message(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "job_id": self.job_id,
            "prepared": self.samples_ref,
            "duration": self.duration,
            "windows": [w.to_message() for w in self.windows],
            "language": self.language,
            "task": self.task,
            "priority": self.priority,
            "word_timestamps": self.word_timestamps,
            "prompt": self.prompt,
            "temperature": self.temperature,
            "model": self.model,
            **({"hotwords": self.hotwords} if self.hotwords else {}),
            **({"shadow": self.shadow, "shadow_prepared": self.shadow_ref} if self.shadow else {}),
        }

    @classmethod
    def from_message(cls, value: Any) -> Prepared:
        """The message checked field by field; MalformedMessage names what is wrong."""
        if not isinstance(value, Mapping):
            raise MalformedMessage(f"the inference message is a {type(value).__name__}, not a JSON object")
        schema = value.get("schema", 1)
        if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
            raise MalformedMessage(f"the inference message's schema {schema!r} is not a version number")
        if schema > SCHEMA:
            raise TransientJobError(
                f"the inference message has schema {schema}; this worker reads up to {SCHEMA}: "
                "upgrade the inference workers"
            )

        def field(name: str, kinds: tuple[type, ...], default: Any = ..., optional: bool = False) -> Any:
            item = value.get(name, default)
            if item is ...:
                raise MalformedMessage(f"the inference message has no {name!r}")
            if item is None and optional:
                return None
            if not isinstance(item, kinds) or (isinstance(item, bool) and bool not in kinds):
                raise MalformedMessage(
                    f"the inference message's {name!r} is {item!r}, not " + " or ".join(k.__name__ for k in kinds)
                )
            return item

        windows = field("windows", (list, tuple))
        try:
            parsed = tuple(Window.from_message(w) for w in windows)
        except (TypeError, ValueError) as exc:
            raise MalformedMessage(f"the inference message's windows are not lists of [start, end]: {exc}") from None
        return cls(
            job_id=field("job_id", (str,)),
            samples_ref=field("prepared", (str,)),
            duration=float(field("duration", (int, float))),
            windows=parsed,
            language=field("language", (str,), None, optional=True),
            task=field("task", (str,), "transcribe", optional=True) or "transcribe",
            priority=field("priority", (str,), "normal", optional=True) or "normal",
            word_timestamps=bool(field("word_timestamps", (bool,), False, optional=True)),
            prompt=field("prompt", (str,), None, optional=True) or None,
            temperature=float(field("temperature", (int, float), 0.0, optional=True) or 0.0),
            model=field("model", (str,), None, optional=True) or None,
            hotwords=field("hotwords", (str,), None, optional=True) or None,
            shadow=field("shadow", (str,), None, optional=True) or None,
            shadow_ref=field("shadow_prepared", (str,), None, optional=True) or None,
        )

    @property
    def decoding(self) -> tuple[str, bool, str | None, float, str | None]:
        """What windows must share to share a batch (with the language found for them)."""
        return (self.task, self.word_timestamps, self.prompt, self.temperature, self.hotwords)


@dataclass(frozen=True)
class Finished:
    """What preparation answers for a job already COMPLETED (a duplicate delivery, or a message
    naming someone else's job): that nothing is to be done. It carries no result: a message
    never gets a stored transcript back."""

    job_id: str
