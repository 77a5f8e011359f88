"""Loading the engine the settings name: faster-whisper, or openai-whisper (its extra).

A process keeps the engine it loads (models.runtime.Runtime.engine)."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from models.speech.engines import FasterWhisperEngine, SpeechEngine, engine_threads, model_path, parallel_batches

if TYPE_CHECKING:
    from config import Settings

log = logging.getLogger(__name__)


def load_engine(settings: "Settings") -> SpeechEngine:
    """The engine the settings name, loaded."""
    path = model_path(settings)
    log.info("loading %s model from %s (device=%s)", settings.engine, path, settings.device)
    if settings.engine == "openai-whisper":
        from models.speech.openai_engine import load_engine as load_openai_whisper  # needs the extra

        engine = load_openai_whisper(settings)
    else:
        engine = FasterWhisperEngine(
            path,
            device=settings.device,
            compute_type=settings.compute_type,
            cpu_threads=engine_threads(settings),
            beam_size=settings.beam_size,
            workers=parallel_batches(settings),
        )
    log.info("model loaded on %s (%s): %d batches at once, %d CPU threads each", engine.device,
             getattr(engine, "compute_type", "?"), parallel_batches(settings), engine_threads(settings))
    return engine
