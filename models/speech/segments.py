"""A transcript's shape (segments, words) and how timed words become subtitle segments.

Both engines decode a window's text without timestamp tokens, as faster-whisper's batched
pipeline does. With timestamp tokens, a window decoded once loses words: Whisper often
stops at a timestamp seconds before a full window ends, or leaves its last sentence without
a closing timestamp, and only a sequential decoder (which seeks back and decodes again)
gets those words back. Timing comes instead from the cross-attention alignment of the
decoded words (the same one that gives word timestamps), and segments are cut from it
here, the way subtitle guidelines cut cues: at a sentence's end, at a pause, and before a
cue grows past two lines or seven seconds.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from models.speech.windows import TimeMap

MAX_CUE_SECONDS = 7.0
MAX_CUE_CHARS = 84  # two lines of 42 characters
PAUSE_SECONDS = 0.8  # a silence this long between words starts a new cue
SENTENCE_END = (".", "。", "!", "！", "?", "？")
CLAUSE_END = (",", "，", ";", "；", ":", "：", "、")


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    text: str
    # With word timestamps: ({"word", "start", "end", "probability"}, ...)
    words: tuple[dict[str, Any], ...] | None = None
    # The language it was decoded in, where the model found it window by window (multilingual
    # models, no language asked for).
    language: str | None = None
    # How sure the model was, as Whisper reports it: the mean log-probability of the window's
    # tokens and the probability that the window holds no speech (both the window's: it is
    # decoded in one pass), and the gzip compression ratio of this segment's text (over 2.4: a
    # repetition loop).
    avg_logprob: float | None = None
    no_speech_prob: float | None = None
    compression_ratio: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"start": self.start, "end": self.end, "text": self.text}
        if self.words is not None:
            out["words"] = [dict(w) for w in self.words]
        if self.language is not None:
            out["language"] = self.language
        for name in ("avg_logprob", "no_speech_prob", "compression_ratio"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def compression_ratio(text: str) -> float:
    """The gzip compression ratio of a text, as Whisper computes it."""
    data = text.encode("utf-8")
    return round(len(data) / len(zlib.compress(data)), 3) if data else 0.0


def scored(segments: Sequence[Segment], avg_logprob: float | None, no_speech_prob: float | None) -> list[Segment]:
    """A window's segments with its scores, and each its own compression ratio."""
    return [
        replace(
            s,
            avg_logprob=None if avg_logprob is None else round(float(avg_logprob), 4),
            no_speech_prob=None if no_speech_prob is None else round(float(no_speech_prob), 4),
            compression_ratio=compression_ratio(s.text),
        )
        for s in segments
    ]


def confidence(segments: Iterable[dict[str, Any]]) -> float | None:
    """A transcript's confidence from 0 to 1: the mean per-token probability of its segments
    (exp of their avg_logprob), weighted by each segment's length; None without scores."""
    total = weight = 0.0
    for s in segments:
        logprob = s.get("avg_logprob")
        if logprob is None:
            continue
        length = max(0.1, float(s.get("end", 0.0)) - float(s.get("start", 0.0)))
        total += math.exp(min(0.0, float(logprob))) * length
        weight += length
    return round(total / weight, 4) if weight else None


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str | None
    duration: float
    segments: tuple[Segment, ...] = field(default_factory=tuple)
    # How sure the model was of the language: the detection's probability, 1.0 where the
    # language was given or the model knows only one (as faster-whisper reports it).
    language_probability: float | None = None

    @classmethod
    def from_segments(
        cls,
        segments: Sequence[Segment],
        language: str | None,
        duration: float,
        language_probability: float | None = None,
    ) -> Transcript:
        ordered = tuple(sorted(segments, key=lambda s: (s.start, s.end)))
        return cls(
            " ".join(s.text for s in ordered if s.text), language, round(duration, 3), ordered, language_probability
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "text": self.text,
            "language": self.language,
            "duration": self.duration,
            "segments": [s.to_dict() for s in self.segments],
        }
        if self.language_probability is not None:
            out["language_probability"] = round(self.language_probability, 4)
        return out


@dataclass(frozen=True)
class TimedWord:
    """A decoded word (with its leading space, punctuation attached) and its time in the recording."""

    text: str
    start: float
    end: float
    probability: float


def placed(where: float | TimeMap) -> TimeMap:
    """A window's place in the recording: its TimeMap, or the offset of a contiguous window."""
    return where if isinstance(where, TimeMap) else TimeMap.at(where)


def window_words(
    aligned: Iterable[tuple[str, float, float, float]], where: float | TimeMap, duration: float
) -> list[TimedWord]:
    """An alignment's (word, start, end, probability), times relative to a window of
    `duration` s, as words of the recording: kept inside the window, in order, placed
    where the window's audio lies in the recording.

    Cross-attention timing stretches a word that follows silence back into the silence and
    a word that ends a sentence on into the pause after it; such words are cut to twice the
    window's median word length (at most 1.4 s), as faster-whisper and whisper do.
    """
    words = [
        (w, min(max(0.0, float(s)), duration), min(max(0.0, float(e)), duration), float(p))
        for w, s, e, p in aligned
        if w
    ]
    lengths = sorted(e - s for _, s, e, _ in words if e > s)
    longest = 2 * min(0.7, lengths[len(lengths) // 2]) if lengths else 1.4
    place = placed(where)
    out: list[TimedWord] = []
    previous = 0.0
    for i, (text, start, end, prob) in enumerate(words):
        start = previous = max(start, previous)
        end = max(end, start)
        if end - start > longest:
            after_pause = i == 0 or words[i - 1][0].rstrip().endswith(SENTENCE_END)
            if after_pause:
                start = end - longest
            elif text.rstrip().endswith(SENTENCE_END):
                end = start + longest
        start, end = place.span(start, end)
        out.append(TimedWord(text, round(start, 3), round(end, 3), round(prob, 3)))
    return out


def cues(words: Sequence[TimedWord], with_words: bool = False) -> list[Segment]:
    """Timed words cut into segments a subtitle can show: a new one after a sentence's end
    or a pause, and one that would pass MAX_CUE_CHARS or MAX_CUE_SECONDS is broken in two.
    Every word lands in exactly one segment, in order."""
    out: list[Segment] = []
    current: list[TimedWord] = []

    def flush(upto: int) -> None:
        taken = current[:upto]
        del current[:upto]
        text = "".join(w.text for w in taken).strip()
        if text:
            kept = (
                tuple(
                    {"word": w.text.strip(), "start": w.start, "end": w.end, "probability": w.probability}
                    for w in taken
                    if w.text.strip()
                )
                if with_words
                else None
            )
            out.append(Segment(taken[0].start, taken[-1].end, text, kept))

    for word in words:
        if current and word.start - current[-1].end >= PAUSE_SECONDS:
            flush(len(current))
        current.append(word)
        text = "".join(w.text for w in current).strip()
        if len(current) > 1 and (len(text) > MAX_CUE_CHARS or current[-1].end - current[0].start > MAX_CUE_SECONDS):
            flush(_break(current))
        if word.text.rstrip().endswith(SENTENCE_END):
            flush(len(current))
    if current:
        flush(len(current))
    return out


def _break(words: Sequence[TimedWord]) -> int:
    """How many of `words` the first part of an over-long cue takes: up to its last clause
    mark, else up to the word boundary nearest the middle of its text."""
    clause = [i for i, w in enumerate(words[:-1]) if w.text.rstrip().endswith(CLAUSE_END)]
    if clause:
        return clause[-1] + 1
    total = sum(len(w.text) for w in words)
    at, best = 0, 1
    best_distance: float = total
    for i, w in enumerate(words[:-1], start=1):
        at += len(w.text)
        if abs(total / 2 - at) < best_distance:
            best, best_distance = i, abs(total / 2 - at)
    return best


def window_segments(
    text: str,
    aligned: Sequence[tuple[str, float, float, float]],
    where: float | TimeMap,
    duration: float,
    with_words: bool = False,
) -> list[Segment]:
    """A decoded window as segments. Should the alignment give no words for text it has,
    the text is still kept, as one segment over the whole window."""
    segments = cues(window_words(aligned, where, duration), with_words)
    if not segments and text.strip():
        place = placed(where)
        segments = [Segment(round(place(0.0), 3), round(place(duration), 3), text.strip(), () if with_words else None)]
    return segments
