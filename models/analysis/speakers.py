"""Who spoke when, as an analysis (`speakers=true`, `speakers=3`, `speakers=2-4`): the turns come
from models.analysis.diarization (speech found in the audio, voices embedded by Resemblyzer,
clustered with scikit-learn).

Speakers are "A", "B", ... in the order they first speak. `run`'s output is the speakers and
their turns; `apply` labels the transcript from the turns by time (each word: the speaker whose
turns it overlaps most, or in a pause the nearest turn's), so it holds whatever an analysis
applied before it did to the words (redaction folds several into one), splits a segment where
its words change speaker, and adds the speakers and their turns.

Torch, Resemblyzer, webrtcvad and scikit-learn (the `speakers` extra) are imported inside `run`
only: the web process checks `missing()` without loading them.
"""

from __future__ import annotations

import copy
import importlib.util
import re
from typing import Any

import numpy as np

from models.analysis.diarization import MAX_SPEAKERS, diarize
from models.errors import InvalidRequest

NAME = "speakers"
VERSION = "2"
NEEDS_AUDIO = True
HIDES = False
EXTRA = "speakers"

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")
HOW = "speakers must be true, a count from 1 to 20, or a range like 2-4 (or min=2,max=4)"


def missing() -> str | None:
    needed = ("torch", "resemblyzer", "sklearn", "webrtcvad")
    absent = [name for name in needed if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    return (
        f"speaker diarization needs {', '.join(absent)}: install torch's CPU build first "
        "(`pip install torch==2.13.0`), then `pip install 'whisperq[speakers]'`"
    )


# -- parse ---------------------------------------------------------------------------------------


def _count(value: Any, original: Any) -> int:
    if isinstance(value, bool):
        raise InvalidRequest(f"{HOW}, not {original!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or not 1 <= value <= MAX_SPEAKERS:
        raise InvalidRequest(f"{HOW}, not {original!r}")
    return value


def _range(low: Any, high: Any, original: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if low is not None:
        out["min_speakers"] = _count(low, original)
    if high is not None:
        out["max_speakers"] = _count(high, original)
    if not out:
        raise InvalidRequest(f"{HOW}, not {original!r}")
    if out.get("min_speakers", 1) > out.get("max_speakers", MAX_SPEAKERS):
        raise InvalidRequest(f"speakers: the minimum is above the maximum in {original!r}")
    if out.get("min_speakers") == out.get("max_speakers"):
        return {"speakers": out["min_speakers"]}
    return out


def parse(value: Any) -> dict[str, Any] | None:
    """true -> {} (the count found), N -> {"speakers": N}, a range -> min/max; false -> None.

    As a string, "1" is "true" (a form's checkbox); ask for exactly one speaker with the number 1.
    """
    if value is None or value is False:
        return None
    if value is True:
        return {}
    if isinstance(value, int | float):
        return {"speakers": _count(value, value)}
    if isinstance(value, dict):
        unknown = set(value) - {"min", "max"}
        if unknown:
            raise InvalidRequest(f"{HOW}, not {value!r}")
        return _range(value.get("min"), value.get("max"), value)
    if not isinstance(value, str):
        raise InvalidRequest(f"{HOW}, not {value!r}")
    text = value.strip().lower()
    if text in FALSE:
        return None
    if text in TRUE:
        return {}
    if text.isdigit():
        return {"speakers": _count(text, value)}
    found = re.fullmatch(r"(\d+)\s*(?:-|\.\.|to)\s*(\d+)", text)
    if found:
        return _range(found.group(1), found.group(2), value)
    parts = [p.strip() for p in re.split(r"[,;&\s]+", text) if p.strip()]
    if parts and all(re.fullmatch(r"(min|max)\s*[=:]\s*\d+", p) for p in parts):
        pairs = dict(re.split(r"\s*[=:]\s*", p) for p in parts)
        if len(pairs) == len(parts):
            return _range(pairs.get("min"), pairs.get("max"), value)
    raise InvalidRequest(f"{HOW}, not {value!r}")


def given(params: dict[str, Any]) -> Any:
    """The option's value that parse() turns back into `params` (what a re-run sends): True,
    a count, or {"min": a, "max": b} (either side alone)."""
    if "speakers" in params:
        return int(params["speakers"])
    sides = (("min", "min_speakers"), ("max", "max_speakers"))
    bounds = {key: int(params[name]) for key, name in sides if name in params}
    return bounds or True


# -- run ---------------------------------------------------------------------------------------


def _word_spans(result: dict[str, Any]) -> list[tuple[float, float]]:
    """The transcript's timed units (its words, else its segments): speech where the detector
    found none (audio it cannot read, such as speech under loud music)."""
    spans = []
    for seg in result.get("segments") or []:
        units = seg.get("words") if isinstance(seg.get("words"), list) and seg.get("words") else [seg]
        for u in units:
            start = float(u["start"])
            spans.append((start, max(float(u["end"]), start)))
    return spans


def run(result: dict[str, Any], params: dict[str, Any], samples: np.ndarray | None) -> dict[str, Any]:
    """Who spoke when, over the audio: the speakers and their turns."""
    if samples is None:
        raise ValueError("speaker diarization needs the job's audio")
    return diarize(samples, params, _word_spans(result))


# -- apply ---------------------------------------------------------------------------------------


class _Turns:
    """The turns, to ask who spoke over a span of time."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.names = sorted({str(t["speaker"]) for t in turns})
        self.who = np.array([self.names.index(str(t["speaker"])) for t in turns], dtype=int)
        self.starts = np.array([float(t["start"]) for t in turns])
        self.ends = np.array([max(float(t["end"]), float(t["start"])) for t in turns])

    def speaker(self, start: float, end: float) -> str | None:
        """The speaker whose turns overlap [start, end] most; none overlapping (a word in a
        pause), the speaker of the nearest turn."""
        if not len(self.who):
            return None
        end = max(end, start)
        overlap = np.clip(np.minimum(self.ends, end) - np.maximum(self.starts, start), 0.0, None)
        if overlap.sum() > 0:
            return self.names[int(np.bincount(self.who, weights=overlap, minlength=len(self.names)).argmax())]
        distance = np.maximum(self.starts - end, start - self.ends)
        return self.names[int(self.who[int(distance.argmin())])]


def _piece(seg: dict[str, Any], words: list[dict[str, Any]], speaker: str | None) -> dict[str, Any]:
    out = {k: copy.deepcopy(v) for k, v in seg.items() if k != "words"}
    out["words"] = words
    out["start"] = words[0]["start"]
    out["end"] = words[-1]["end"]
    # Words are stored stripped ("hello", models.speech.segments.cues): joined with spaces.
    out["text"] = " ".join(str(w["word"]).strip() for w in words if str(w["word"]).strip())
    if "compression_ratio" in out:
        from models.speech.segments import compression_ratio

        out["compression_ratio"] = compression_ratio(out["text"])
    out["speaker"] = speaker
    return out


def apply(result: dict[str, Any], output: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A new transcript: every word with the speaker whose turn it overlaps most (by time: an
    analysis applied before this one, redaction, may have merged words), every segment
    without words likewise, a segment split where its words change speaker, and the speakers
    and their turns at the top."""
    out = copy.deepcopy(result)
    turns = _Turns(output.get("turns") or [])
    labelled: list[dict[str, Any]] = []
    for seg in out.get("segments") or []:
        seg_words = seg.get("words") if isinstance(seg.get("words"), list) else None
        if not seg_words:
            seg["speaker"] = turns.speaker(float(seg["start"]), float(seg["end"]))
            labelled.append(seg)
            continue
        runs: list[list[dict[str, Any]]] = []
        for w in seg_words:
            w["speaker"] = turns.speaker(float(w["start"]), float(w["end"]))
            if runs and w["speaker"] == runs[-1][-1]["speaker"]:
                runs[-1].append(w)
            else:
                runs.append([w])
        if len(runs) == 1:  # one voice: the segment as it was, labelled
            seg["speaker"] = runs[0][0]["speaker"]
            labelled.append(seg)
        else:
            labelled.extend(_piece(seg, r, r[0]["speaker"]) for r in runs)
    out["segments"] = labelled
    out["speakers"] = list(output.get("speakers") or [])
    out["turns"] = copy.deepcopy(output.get("turns") or [])
    return out
