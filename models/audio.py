"""Audio probing and decoding (PyAV/FFmpeg): is it audio, how long is it, the samples."""
from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np

from .crypto import DecryptionError
from .errors import AudioTooLong, SilentAudio, UnsupportedAudio

SAMPLE_RATE = 16000
SILENCE = 10 ** (-60 / 20)  # peak amplitude below -60 dBFS: nothing to hear


def _peak(frame) -> float:
    """Peak amplitude of a decoded frame, 0..1 whatever its sample format."""
    data = frame.to_ndarray()
    if data.dtype.kind == "f":
        return float(np.abs(data).max(initial=0.0))
    info = np.iinfo(data.dtype)
    if data.dtype.kind == "u":
        mid = (int(info.max) + 1) / 2
        return float(np.abs(data.astype(np.float64) - mid).max(initial=0.0) / mid)
    return float(np.abs(data.astype(np.float64)).max(initial=0.0) / -int(info.min))


@dataclass(frozen=True)
class AudioInfo:
    duration: float
    codec: str
    sample_rate: int
    channels: int


def _source(path: str | Path | BinaryIO):
    """What av.open takes: a path, or a readable (and seekable) file object such as a
    decrypting reader from models.crypto."""
    return path if hasattr(path, "read") else str(path)


def probe(path: str | Path | BinaryIO, max_seconds: float | None = None) -> AudioInfo:
    """Decode the whole file once to prove it is audio and to measure its true length.

    Container headers lie (truncated uploads, streams without a duration), so the samples
    are counted. Raises UnsupportedAudio or AudioTooLong with a message for the client.
    """
    samples = 0
    peak = 0.0
    try:
        with av.open(_source(path), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise UnsupportedAudio("the file has no audio stream; upload audio such as WAV, FLAC, MP3, Ogg/Opus or M4A")
            stream = container.streams.audio[0]
            rate = stream.codec_context.sample_rate or stream.rate or 0
            codec = stream.codec_context.name
            channels = stream.codec_context.channels if hasattr(stream.codec_context, "channels") else 0
            for frame in container.decode(stream):
                samples += frame.samples
                if peak < SILENCE:
                    peak = max(peak, _peak(frame))
                rate = frame.sample_rate or rate
                if max_seconds is not None and rate and samples / rate > max_seconds:
                    raise AudioTooLong(
                        f"the audio is longer than the limit of {max_seconds:.0f} s; split it into shorter files"
                    )
    except (UnsupportedAudio, AudioTooLong, DecryptionError):
        raise
    except Exception as exc:  # FFmpeg says "Invalid data found", "End of file", ...
        raise UnsupportedAudio(
            f"the file could not be decoded as audio ({_reason(exc)}); upload audio such as WAV, FLAC, MP3, Ogg/Opus or M4A"
        ) from exc
    if not samples or not rate:
        raise UnsupportedAudio("the file contains no audio samples; upload a recording that is not empty")
    if peak < SILENCE:
        raise SilentAudio("the audio is silent (nothing louder than -60 dBFS); upload a recording with speech in it")
    return AudioInfo(duration=samples / rate, codec=codec, sample_rate=rate, channels=channels)


def decode(path: str | Path | BinaryIO) -> np.ndarray:
    """The audio as float32 mono at 16 kHz, the model's input."""
    from faster_whisper.audio import decode_audio

    try:
        audio = decode_audio(_source(path), sampling_rate=SAMPLE_RATE)
    except DecryptionError:
        raise
    except Exception as exc:
        raise UnsupportedAudio(f"the audio could not be decoded ({_reason(exc)})") from exc
    finally:
        gc.collect()
    if audio.size == 0:
        raise UnsupportedAudio("the file contains no audio samples")
    return audio


def _reason(exc: Exception) -> str:
    text = (getattr(exc, "strerror", None) or str(exc)).strip() or type(exc).__name__
    # FFmpeg errors repeat the file path; the client does not need our paths.
    return text.split(":", 1)[0][:200] if "/" in text else text[:200]
