"""openai-whisper (PyTorch) behind the same interface as FasterWhisperEngine.

Chosen with WHISPERQ_ENGINE=openai-whisper; needs the `openai-whisper` extra. It loads a
checkpoint file (`{"dims", "model_state_dict"}`): WHISPERQ_MODEL naming a `.pt` file (an
original openai checkpoint loads as is), else the CTranslate2 model directory (the bundled
tiny.en by default) converted once into `$WHISPERQ_DATA_DIR/models/`, so nothing is
downloaded. Windows are decoded together in one `whisper.decode` call per batch, as the
faster-whisper engine decodes them (text without timestamp tokens, words aligned by
cross-attention, segments cut by models.speech.segments), so both engines give the same segments
for the same text.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models import compat
from models.speech.engines import (
    APPEND_PUNCTUATIONS,
    PREPEND_PUNCTUATIONS,
    Decoded,
    SpeechEngine,
    Word,
    bundled_model_path,
    engine_threads,
)

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from config import Settings
    from config.registry import ModelSpec

log = logging.getLogger(__name__)


def resolve_torch_device(device: str) -> str:
    """`auto` means CUDA where PyTorch sees a GPU, else CPU."""
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def checkpoint_path(settings: Settings, source: str) -> str:
    """The checkpoint to load for a model's weights `source` (models.registry.catalog.weights_path
    names them): the weights when they are a file, else the CTranslate2 directory (such as the
    bundled tiny.en) converted once into the data dir."""
    if Path(source).is_file():
        return source
    if source == bundled_model_path():
        name = "tiny.en.pt"
    else:
        stat = (Path(source) / "model.bin").stat()
        digest = hashlib.sha1(f"{Path(source).resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:10]
        name = f"{Path(source).name}-{digest}.pt"
    dest = settings.data_dir / "models" / name
    if not dest.is_file():
        from models.speech.convert import convert

        log.info("converting the CTranslate2 model %s into an openai-whisper checkpoint at %s", source, dest)
        convert(source, dest)  # atomic: workers converting at once each rename a whole file
    return str(dest)


class OpenAIWhisperEngine(SpeechEngine):
    """openai-whisper run window by window, any number of windows per `whisper.decode` call.

    The model is one PyTorch module whose decoding installs hooks on it (the key/value
    cache, the alignment's attention weights), so calls into it are serialised.
    """

    name = "openai-whisper"

    def __init__(
        self,
        checkpoint: str,
        device: str = "auto",
        compute_type: str = "auto",
        cpu_threads: int = 0,
        beam_size: int = 5,
    ):
        import torch
        import whisper
        from whisper.model import ModelDimensions, Whisper

        self.path = checkpoint
        self.device = resolve_torch_device(device)
        self.fp16 = self.device == "cuda" and compute_type != "float32"
        self.compute_type = "float16" if self.fp16 else "float32"
        self.beam_size = beam_size
        if cpu_threads:
            torch.set_num_threads(cpu_threads)
        loaded = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model = Whisper(ModelDimensions(**loaded["dims"]))
        model.load_state_dict(loaded["model_state_dict"])
        heads = loaded.get("alignment_heads")
        if heads:
            mask = torch.zeros(model.dims.n_text_layer, model.dims.n_text_head, dtype=torch.bool)
            for layer, head in heads:
                mask[layer, head] = True
            model.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
        elif Path(checkpoint).stem in whisper._ALIGNMENT_HEADS:  # an original checkpoint, by its file name
            model.set_alignment_heads(whisper._ALIGNMENT_HEADS[Path(checkpoint).stem])
        self.model = model.to(self.device).eval()
        self.multilingual = model.is_multilingual
        self.model_name: str | None = None
        self.version: str | None = None  # models.registry.loader sets both
        self._lock = threading.Lock()
        self._tokenizers: dict[tuple[str, str], Any] = {}

    def _tokenizer(self, language: str, task: str) -> Any:
        from whisper.tokenizer import get_tokenizer

        key = (language, task)
        if key not in self._tokenizers:
            self._tokenizers[key] = get_tokenizer(
                self.multilingual, num_languages=self.model.num_languages, language=language, task=task
            )
        return self._tokenizers[key]

    def _mel(self, chunk: np.ndarray) -> Any:
        """The window's log-mel over 30 s, as whisper.transcribe makes it (audio padded with silence)."""
        import numpy as np
        import torch
        from whisper.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim

        samples = torch.from_numpy(np.ascontiguousarray(chunk[:N_SAMPLES], dtype=np.float32))
        mel = log_mel_spectrogram(samples, self.model.dims.n_mels, padding=N_SAMPLES, device=self.device)
        return pad_or_trim(mel[:, :N_FRAMES], N_FRAMES).to(torch.float16 if self.fp16 else torch.float32)

    def _detect(self, chunk: np.ndarray) -> tuple[str, float]:
        mel = self._mel(chunk)
        probs: dict[str, float]  # one window: one language -> probability mapping
        with self._lock:
            _tokens, probs = self.model.detect_language(mel)
        best = max(probs, key=probs.__getitem__)
        return best, float(probs[best])

    def _decode(
        self,
        chunks: Sequence[np.ndarray],
        language: str,
        task: str,
        prompt: str | None,
        temperature: float,
        hotwords: str | None = None,
    ) -> list[Decoded]:
        """One `whisper.decode` call over several windows; then each window's words aligned
        (whisper.timing). openai-whisper has no hotwords: they go first in the prompt."""
        if hotwords:
            prompt = f"{hotwords}. {prompt}" if prompt else hotwords
        import torch
        import whisper

        tokenizer = self._tokenizer(language, task)
        mels = [self._mel(c) for c in chunks]
        options = whisper.DecodingOptions(
            task=task,
            language=language if self.multilingual else "en",
            temperature=temperature,
            beam_size=self.beam_size if temperature == 0 else None,
            prompt=prompt,
            without_timestamps=True,
            fp16=self.fp16,
        )
        out = []
        with self._lock, torch.no_grad():
            results = compat.openai_whisper_decoding_task(self.model, options).run(torch.stack(mels))
            for chunk, mel, result in zip(chunks, mels, results, strict=True):
                tokens = [t for t in result.tokens if t < tokenizer.eot]
                aligned = self._align(tokens, tokenizer, mel, len(chunk)) if tokens else []
                out.append((tokenizer.decode(tokens), aligned, result.avg_logprob, result.no_speech_prob))
        return out

    def _align(self, tokens: list[int], tokenizer: Any, mel: Any, samples: int) -> list[Word]:
        """Word times from the alignment heads' cross-attention (whisper.timing), window-relative."""
        from whisper.audio import HOP_LENGTH, N_FRAMES
        from whisper.timing import find_alignment, merge_punctuations

        words = find_alignment(self.model, tokenizer, tokens, mel, min(N_FRAMES, math.ceil(samples / HOP_LENGTH)))
        merge_punctuations(words, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS)
        return [(w.word, w.start, w.end, w.probability) for w in words]


def load_engine(settings: Settings, spec: ModelSpec, source: str) -> OpenAIWhisperEngine:
    """The engine of a served model whose weights are `source` (called by models.registry.loader.load_engine)."""
    try:
        import torch  # noqa: F401
        import whisper  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "WHISPERQ_ENGINE=openai-whisper needs PyTorch and openai-whisper: `pip install torch==2.13.0` "
            "(or the build for your GPU), then `pip install -e '.[openai-whisper]'`"
        ) from exc
    return OpenAIWhisperEngine(
        checkpoint_path(settings, source),
        device=settings.device,
        compute_type=spec.compute_type,
        cpu_threads=engine_threads(settings),
        beam_size=spec.beam_size,
    )
