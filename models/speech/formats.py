"""Transcript exports: plain text, JSON, SubRip (SRT) and WebVTT."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

FORMATS = ("txt", "json", "srt", "vtt")
MIME_TYPES = {
    "txt": "text/plain; charset=utf-8",
    "json": "application/json",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


def _clock(seconds: float, sep: str) -> str:
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{sep}{millis:03d}"


def _cues(result: dict[str, Any]) -> Iterator[tuple[float, float, str, str | None]]:
    for seg in result.get("segments") or []:
        text = " ".join(str(seg.get("text", "")).split())
        if text:
            speaker = seg.get("speaker")
            yield float(seg["start"]), max(float(seg["end"]), float(seg["start"])), text, speaker


def _speaker(label: str) -> str:
    return f"Speaker {label}"


def to_txt(result: dict[str, Any]) -> str:
    """The text; with speakers (the speakers analysis), one paragraph per turn, each prefixed by
    who spoke ("Speaker A: ...")."""
    if not any(seg.get("speaker") for seg in result.get("segments") or []):
        return (result.get("text") or "").strip() + "\n"
    turns: list[tuple[str | None, list[str]]] = []
    for _start, _end, text, speaker in _cues(result):
        if turns and turns[-1][0] == speaker:
            turns[-1][1].append(text)
        else:
            turns.append((speaker, [text]))
    return "\n\n".join(f"{_speaker(who) + ': ' if who else ''}{' '.join(texts)}" for who, texts in turns) + "\n"


def to_json(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False, indent=2) + "\n"


def to_srt(result: dict[str, Any]) -> str:
    """SubRip: numbered cues from 1, `HH:MM:SS,mmm` times, a blank line after each cue."""
    blocks = [
        f"{n}\n{_clock(start, ',')} --> {_clock(end, ',')}\n{'[' + _speaker(who) + '] ' if who else ''}{text}\n"
        for n, (start, end, text, who) in enumerate(_cues(result), start=1)
    ]
    return "\n".join(blocks)


def to_vtt(result: dict[str, Any]) -> str:
    """WebVTT: a `WEBVTT` header, then `HH:MM:SS.mmm` cues; `-->` may not appear in text. With
    speakers, each cue is a voice span (`<v Speaker A>`), and `<`, `&` are escaped as cue text must be."""
    blocks = ["WEBVTT\n"]
    for start, end, text, who in _cues(result):
        text = text.replace("-->", "->")
        if who:
            text = f"<v {_speaker(who)}>{text.replace('&', '&amp;').replace('<', '&lt;')}"
        blocks.append(f"{_clock(start, '.')} --> {_clock(end, '.')}\n{text}\n")
    return "\n".join(blocks)


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "txt": to_txt,
    "json": to_json,
    "srt": to_srt,
    "vtt": to_vtt,
}


def render(result: dict[str, Any], fmt: str) -> str:
    try:
        return RENDERERS[fmt](result)
    except KeyError:
        raise ValueError(f"format {fmt!r} is not one of: {', '.join(FORMATS)}") from None
