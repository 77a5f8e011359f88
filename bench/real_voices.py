"""Real voices for bench/speakers.py: a real two-person recording with its reference turns
(bench/recordings/real-speakers: pyannote.audio's sample, MIT), and conversations mixed from
its two real voices, with overlapping speech.

A mixed conversation is cut from the recording's stretches where exactly one person speaks
(its RTTM says who): pieces of 1 to 4 s of each voice in turn, laid out with a gap of -1.0 to
+0.6 s between them, so about a third of the changes overlap (both voices summed, as two
people talking over each other on one microphone). The reference is where each piece lies.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent / "recordings" / "real-speakers"
RATE = 16000
REAL = "real: two people (recorded)"
MIXED = "real voices mixed, overlapping"
PIECE = (1.0, 4.0)
GAP = (-1.0, 0.6)
MIN_SOLO = 0.6


def reference() -> list[tuple[str, float, float]]:
    turns = []
    for line in (HERE / "sample.rttm").read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "SPEAKER":
            start, length = float(parts[3]), float(parts[4])
            turns.append((parts[7], start, start + length))
    return turns


def recording() -> np.ndarray:
    from models.speech import audio

    return audio.decode(str(HERE / "sample.wav"))


def solo(turns: list[tuple[str, float, float]], duration: float) -> dict[str, list[tuple[float, float]]]:
    """Each voice's stretches where it alone speaks (at least MIN_SOLO long), on a 10 ms grid."""
    step = 0.01
    n = int(duration / step)
    who = [set() for _ in range(n)]
    for voice, start, end in turns:
        for i in range(int(start / step), min(n, int(end / step))):
            who[i].add(voice)
    out: dict[str, list[tuple[float, float]]] = {}
    run_voice, run_start = None, 0
    for i in range(n + 1):
        voice = next(iter(who[i])) if i < n and len(who[i]) == 1 else None
        if voice != run_voice:
            if run_voice is not None and (i - run_start) * step >= MIN_SOLO:
                out.setdefault(run_voice, []).append((run_start * step, i * step))
            run_voice, run_start = voice, i
    return out


def mixed(samples: np.ndarray, rng: random.Random, seconds: float) -> tuple[np.ndarray, list[tuple[str, float, float]]]:
    """A conversation of the two real voices taking turns, some overlapping: samples and turns."""
    pool = solo(reference(), len(samples) / RATE)
    voices = sorted(pool)
    out = np.zeros(int((seconds + 10) * RATE), dtype=np.float32)
    turns: list[tuple[str, float, float]] = []
    at, k = 0.3, rng.randrange(len(voices))
    while at < seconds:
        voice = voices[k % len(voices)]
        k += 1
        start, end = rng.choice(pool[voice])
        length = min(end - start, rng.uniform(*PIECE))
        first = rng.uniform(start, end - length)
        piece = samples[int(first * RATE) : int((first + length) * RATE)]
        begin = int(at * RATE)
        out[begin : begin + len(piece)] += piece
        turns.append((voice, at, at + len(piece) / RATE))
        at = max(0.3, at + len(piece) / RATE + rng.uniform(*GAP))
    out = out[: int((turns[-1][2] + 0.5) * RATE)]
    return out * (0.5 / float(np.abs(out).max())), turns


def conversations(size: str, seed: int, conversation: Any) -> list[Any]:
    """The recording itself, and (full size) four mixes of its voices, as `conversation`s
    (bench/speakers.py's Conversation: setting, count, samples, turns)."""
    samples = recording()
    out = [conversation(REAL, 2, samples, reference())]
    if size == "full":
        rng = random.Random(seed)
        for _ in range(4):
            mix, turns = mixed(samples, rng, 60.0)
            out.append(conversation(MIXED, 2, mix, turns))
    return out
