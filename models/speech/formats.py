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


def _cues(result: dict[str, Any]) -> Iterator[tuple[float, float, str]]:
    for seg in result.get("segments") or []:
        text = " ".join(str(seg.get("text", "")).split())
        if text:
            yield float(seg["start"]), max(float(seg["end"]), float(seg["start"])), text


def to_txt(result: dict[str, Any]) -> str:
    return (result.get("text") or "").strip() + "\n"


def to_json(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False, indent=2) + "\n"


def to_srt(result: dict[str, Any]) -> str:
    """SubRip: numbered cues from 1, `HH:MM:SS,mmm` times, a blank line after each cue."""
    blocks = [
        f"{n}\n{_clock(start, ',')} --> {_clock(end, ',')}\n{text}\n"
        for n, (start, end, text) in enumerate(_cues(result), start=1)
    ]
    return "\n".join(blocks)


def to_vtt(result: dict[str, Any]) -> str:
    """WebVTT: a `WEBVTT` header, then `HH:MM:SS.mmm` cues; `-->` may not appear in text."""
    blocks = ["WEBVTT\n"]
    for start, end, text in _cues(result):
        blocks.append(f"{_clock(start, '.')} --> {_clock(end, '.')}\n{text.replace('-->', '->')}\n")
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
