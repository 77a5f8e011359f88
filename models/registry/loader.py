"""Loading the engine the settings name: faster-whisper, or openai-whisper (its extra).

A process keeps the engine it loads (models.runtime.Runtime.engine). Swapped-in weights reach
here only once their hash was checked against the one recorded for the swap
(models.registry.swaps.ActiveWeights); the engine then names that verified version."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from models.registry.catalog import version_of, weights_path
from models.speech.engines import FasterWhisperEngine, SpeechEngine, engine_threads, parallel_batches

if TYPE_CHECKING:
    from config import Settings
    from config.registry import ModelSpec

log = logging.getLogger(__name__)


def load_engine(settings: Settings, spec: ModelSpec | None = None) -> SpeechEngine:
    """A served model's engine (the default model's for None), loaded."""
    from models.registry.swaps import verified_version

    spec = spec or settings.model()
    path = weights_path(spec, settings.data_dir)
    # of the weights read now: results name what ran (a swap's as verified when taken up)
    version = verified_version(spec) or version_of(spec, settings.data_dir)
    log.info("loading the model %s (%s) from %s (device=%s)", spec.name, spec.engine, path, settings.device)
    engine: SpeechEngine
    if spec.engine == "openai-whisper":
        from models.speech.openai_engine import load_engine as load_openai_whisper  # needs the extra

        engine = load_openai_whisper(settings, spec, path)
    else:
        engine = FasterWhisperEngine(
            path,
            device=settings.device,
            compute_type=spec.compute_type,
            cpu_threads=engine_threads(settings),
            beam_size=spec.beam_size,
            workers=parallel_batches(settings),
        )
    engine.model_name, engine.version = spec.name, version
    log.info(
        "model %s (%s) loaded on %s (%s): %d batches at once, %d CPU threads each",
        spec.name,
        version[:19],
        engine.device,
        getattr(engine, "compute_type", "?"),
        parallel_batches(settings),
        engine_threads(settings),
    )
    return engine
