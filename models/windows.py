"""Split audio into windows of at most 30 s, the model's input size, cutting in silences."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .audio import SAMPLE_RATE

MAX_WINDOW_SECONDS = 30.0


@dataclass(frozen=True)
class Window:
    start: int  # first sample
    end: int  # one past the last sample

    @property
    def offset(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / SAMPLE_RATE


def split_windows(samples: np.ndarray, max_seconds: float = MAX_WINDOW_SECONDS) -> list[Window]:
    """Contiguous windows of at most `max_seconds` covering the speech.

    Audio that fits one window is one window, silence and all (what the model sees
    unbatched). Longer audio is cut where Silero VAD hears silence, as faster-whisper's
    batched pipeline does; stretches with no speech are left out.
    """
    limit = int(max_seconds * SAMPLE_RATE)
    if len(samples) == 0:
        return []
    if len(samples) <= limit:
        return [Window(0, len(samples))]
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    speech = get_speech_timestamps(
        samples, VadOptions(max_speech_duration_s=max_seconds, min_silence_duration_ms=160)
    )
    windows: list[Window] = []
    start = end = None
    for seg in speech:
        s, e = int(seg["start"]), min(int(seg["end"]), int(seg["start"]) + limit)
        if start is None:
            start, end = s, e
        elif e - start <= limit:
            end = e
        else:
            windows.append(Window(start, end))
            start, end = s, e
    if start is not None:
        windows.append(Window(start, end))
    return windows
