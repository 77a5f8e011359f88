"""Split audio into windows of at most 30 s of speech, the model's input size.

A window is one or more stretches of speech, in order, heard as one: the silence between
them is left out, as faster-whisper's batched pipeline packs its chunks. A window then holds
up to 30 s of speech whatever the pauses (fewer windows, so fewer model calls), and the
word alignment that times the transcript (models.speech.segments) never has to place words in a
long silence. `TimeMap` takes times in a window back to times in the recording.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.speech.audio import SAMPLE_RATE

MAX_WINDOW_SECONDS = 30.0


@dataclass(frozen=True)
class TimeMap:
    """Where a window's audio lies in the recording: for each stretch, its start in the
    window and in the recording (seconds). A time in the window maps through its stretch."""

    pieces: tuple[tuple[float, float], ...]

    @classmethod
    def at(cls, offset: float) -> TimeMap:
        """A window that is one stretch of the recording, starting at `offset` s."""
        return cls(((0.0, float(offset)),))

    def piece(self, t: float) -> int:
        return max(0, bisect.bisect_right([p[0] for p in self.pieces], t) - 1)

    def __call__(self, t: float, piece: int | None = None) -> float:
        """The recording's time for the window's time `t`, through stretch `piece` (else `t`'s own)."""
        start, origin = self.pieces[self.piece(t) if piece is None else piece]
        return origin + (t - start)

    def span(self, start: float, end: float) -> tuple[float, float]:
        """A word's start and end through one stretch (that of its middle), so no word
        spans the silence left out between two stretches."""
        piece = self.piece((start + end) / 2)
        return self(start, piece), self(end, piece)


@dataclass(frozen=True)
class Window:
    spans: tuple[tuple[int, int], ...]  # (first sample, one past the last) of each stretch, in order

    @property
    def start(self) -> int:
        return self.spans[0][0]

    @property
    def end(self) -> int:
        return self.spans[-1][1]

    @property
    def offset(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def seconds(self) -> float:
        """Seconds of audio the model hears (the stretches, not the silence between them)."""
        return sum(e - s for s, e in self.spans) / SAMPLE_RATE

    def samples(self, audio: np.ndarray) -> np.ndarray:
        if len(self.spans) == 1:
            return audio[self.start : self.end]
        return np.concatenate([audio[s:e] for s, e in self.spans])

    def time_map(self) -> TimeMap:
        pieces, at = [], 0
        for s, e in self.spans:
            pieces.append((at / SAMPLE_RATE, s / SAMPLE_RATE))
            at += e - s
        return TimeMap(tuple(pieces))

    def to_message(self) -> list[list[int]]:
        return [[s, e] for s, e in self.spans]

    @classmethod
    def from_message(cls, value: Sequence[Any]) -> Window:
        """A window as the prepare step sends it: a list of [start, end] stretches; a bare
        [start, end] (what earlier versions sent) is one stretch."""
        if len(value) == 2 and all(isinstance(v, int) for v in value):
            return cls(((int(value[0]), int(value[1])),))
        return cls(tuple((int(s), int(e)) for s, e in value))


def split_windows(samples: np.ndarray, max_seconds: float = MAX_WINDOW_SECONDS) -> list[Window]:
    """Windows of at most `max_seconds` of speech covering the speech, in order.

    Audio that fits one window is one window, silence and all (what the model sees
    unbatched). Longer audio is cut into stretches of speech by Silero VAD, with faster-whisper's
    batched pipeline's settings (a stretch of speech longer than a window is cut at its last
    short pause), and consecutive stretches are packed into a window while their speech fits;
    stretches with no speech are left out.
    """
    limit = int(max_seconds * SAMPLE_RATE)
    if len(samples) == 0:
        return []
    if len(samples) <= limit:
        return [Window(((0, len(samples)),))]
    from faster_whisper.vad import VadOptions, get_speech_timestamps

    speech = get_speech_timestamps(samples, VadOptions(max_speech_duration_s=max_seconds, min_silence_duration_ms=160))
    windows: list[Window] = []
    spans: list[tuple[int, int]] = []
    length = 0
    for seg in speech:
        s = int(seg["start"])
        e = min(int(seg["end"]), s + limit)
        if spans and length + (e - s) > limit:
            windows.append(Window(tuple(spans)))
            spans, length = [], 0
        if spans and s <= spans[-1][1]:  # padded stretches that touch are one stretch
            first, last = spans[-1]
            spans[-1] = (first, max(e, last))
            length += max(0, e - last)
        else:
            spans.append((s, e))
            length += e - s
    if spans:
        windows.append(Window(tuple(spans)))
    return windows
