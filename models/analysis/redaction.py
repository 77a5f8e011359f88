"""PII redaction (``redact``): finds e-mail addresses, phone numbers, card numbers and spoken
digit runs in a transcript, and hides them from what the job's clients get.

``run`` finds the entities and says only where they are (segment, character offsets, times,
kind), never what they were: its output is what clients may see. ``apply`` replaces each
entity's characters in its segment's text by a tag such as ``[PHONE_NUMBER]``, rebuilds the
transcript's text from its segments, and folds the words an entity overlaps into one word that
carries the tag.

What counts as each kind, written or spoken, is models.analysis.pii's (rules, no model).

Entities are found in the segments' texts joined with a space, so one a segment boundary cuts
in two (a pause in the middle of a phone number) is found too; it is listed once per segment
it touches.
"""

from __future__ import annotations

import bisect
import copy
import importlib.util
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from models.analysis.pii import CARD, DEFAULT_KINDS, DIGITS, EMAIL, IBAN, IP, KINDS, PHONE, SSN, find
from models.errors import InvalidRequest

if TYPE_CHECKING:
    import numpy as np

NAME = "redact"
VERSION = "1"
NEEDS_AUDIO = False
HIDES = True  # run before the transcript is stored (models.analysis.base)
# phonenumberslite is in the main install (install_requires): pure Python, ~5 MB, no dependencies.
EXTRA: str | None = None

ALIASES: dict[str, str] = {
    "email": EMAIL,
    "email_address": EMAIL,
    "phone": PHONE,
    "phone_number": PHONE,
    "card": CARD,
    "credit_card": CARD,
    "digits": DIGITS,
    "spoken_digits": DIGITS,
    "iban": IBAN,
    "iban_code": IBAN,
    "ssn": SSN,
    "us_ssn": SSN,
    "ip": IP,
    "ip_address": IP,
}
_ON = {"pii", "true", "1", "yes", "on"}
_OFF = {"", "false", "0", "no", "off", "none"}


def _accepted() -> str:
    return "pii (email, phone, card, digits), all, or a comma-separated list (or JSON list) of: " + ", ".join(
        sorted({"email", "phone", "card", "digits", "ssn", "iban", "ip", *KINDS})
    )


def missing() -> str | None:
    if importlib.util.find_spec("phonenumbers") is None:
        return "PII redaction needs the phonenumbers library: pip install phonenumberslite"
    return None


def parse(value: Any) -> dict[str, Any] | None:
    """`redact` as a door received it -> {"kinds": [...]}, or None where it means "not asked"."""
    if value is None or value is False:
        return None
    if value is True:
        return {"kinds": list(DEFAULT_KINDS)}
    if isinstance(value, dict):
        if set(value) != {"kinds"}:
            raise InvalidRequest(f"redact: send {_accepted()}")
        value = value["kinds"]
    items: list[Any]
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                loaded = json.loads(text)
            except ValueError:
                raise InvalidRequest(f"redact: {text[:40]!r} is not a JSON list; send {_accepted()}") from None
            if not isinstance(loaded, list):
                raise InvalidRequest(f"redact: send {_accepted()}")
            items = loaded
        elif text.lower() in _OFF:
            return None
        else:
            items = text.split(",")
    elif isinstance(value, list | tuple):
        items = list(value)
    else:
        raise InvalidRequest(f"redact: send {_accepted()}, not {type(value).__name__}")
    chosen: set[str] = set()
    for item in items:
        if not isinstance(item, str):
            raise InvalidRequest(f"redact: {item!r} is not a kind; send {_accepted()}")
        key = re.sub(r"[\s-]+", "_", item.strip()).lower()
        if not key:
            continue
        if key in _ON:
            chosen.update(DEFAULT_KINDS)
        elif key == "all":
            chosen.update(KINDS)
        elif key in ALIASES:
            chosen.add(ALIASES[key])
        else:
            raise InvalidRequest(f"redact: unknown kind {item.strip()[:40]!r}; send {_accepted()}")
    if not chosen:
        return None
    return {"kinds": [k for k in KINDS if k in chosen]}


def _kinds(params: dict[str, Any] | None) -> list[str]:
    asked = (params or {}).get("kinds")
    if not asked:
        return list(DEFAULT_KINDS)
    return [k for k in KINDS if k in set(asked)]


# ---------------------------------------------------------------------------------------------


def _word_places(text: str, words: Sequence[dict[str, Any]]) -> list[tuple[int, int] | None]:
    """Where each word lies in its segment's text (they are in order), None where it is not found."""
    places: list[tuple[int, int] | None] = []
    at = 0
    for w in words:
        token = str(w.get("word", "")).strip()
        where = text.find(token, at) if token else -1
        if where < 0:
            places.append(None)
            continue
        places.append((where, where + len(token)))
        at = where + len(token)
    return places


def _times(segment: dict[str, Any], start: int, end: int) -> tuple[float, float]:
    text = str(segment.get("text") or "")
    words = segment.get("words") or []
    if words:
        hit = [
            w
            for w, place in zip(words, _word_places(text, words), strict=True)
            if place is not None and place[0] < end and place[1] > start
        ]
        if hit:
            return round(float(hit[0]["start"]), 3), round(float(hit[-1]["end"]), 3)
    s0, s1 = float(segment.get("start", 0.0)), float(segment.get("end", 0.0))
    length = max(1, len(text))
    return round(s0 + (s1 - s0) * start / length, 3), round(s0 + (s1 - s0) * end / length, 3)


def run(result: dict[str, Any], params: dict[str, Any], samples: np.ndarray | None) -> dict[str, Any]:
    kinds = _kinds(params)
    segments = result.get("segments") or []
    # the segments' texts joined by a space: an entity a segment boundary cuts is found whole
    texts = [str(s.get("text") or "") for s in segments]
    offsets = []
    at = 0
    for t in texts:
        offsets.append(at)
        at += len(t) + 1
    joined = " ".join(texts)
    entities = []
    for kind, start, end in find(joined, kinds, result.get("language")):
        for i in range(bisect.bisect_right(offsets, start) - 1, len(texts)):
            if offsets[i] >= end:
                break
            s, e = max(start, offsets[i]) - offsets[i], min(end, offsets[i] + len(texts[i])) - offsets[i]
            if s >= e:
                continue
            time_start, time_end = _times(segments[i], s, e)
            entities.append(
                {"kind": kind, "segment": i, "start": s, "end": e, "time_start": time_start, "time_end": time_end}
            )
    return {"kinds": kinds, "entities": entities, "count": len(entities)}


def _redacted_words(text: str, words: list[dict[str, Any]], spans: list[tuple[int, int, str]]) -> list[dict[str, Any]]:
    """The segment's words with those that overlap a span folded into one word carrying the tag,
    keeping what of the first and last word lies outside the span ("[EMAIL_ADDRESS]."), the first
    word's start and the last word's end.

    A word not found in the text (words and text that disagree) is hidden where its characters
    are part of, or hold, something a span hides."""
    places = _word_places(text, words)
    secrets = [text[s:e].lower() for s, e, _ in spans]

    def hits(i: int) -> set[int]:
        place = places[i]
        if place is None:
            token = re.sub(r"^\W+|\W+$", "", str(words[i].get("word", ""))).lower()
            return {k for k, secret in enumerate(secrets) if token and (token in secret or secret in token)}
        return {k for k, (s, e, _) in enumerate(spans) if s < place[1] and e > place[0]}

    def render(i: int, j: int) -> str:
        first, last = places[i], places[j]
        if first is None or last is None:
            return spans[min(hits(i) or hits(j))][2]
        start, end = first[0], last[1]
        out, at = [], start
        for s, e, tag in spans:
            if e <= start or s >= end:
                continue
            out += [text[at : max(s, start)], tag]
            at = min(e, end)
        out.append(text[at:end])
        return "".join(out)

    out: list[dict[str, Any]] = []
    i = 0
    while i < len(words):
        covered = hits(i)
        if not covered:
            out.append(copy.deepcopy(words[i]))
            i += 1
            continue
        j = i
        # take the next word while a span runs on into it
        while j + 1 < len(words) and hits(j + 1) & covered:
            j += 1
            covered = hits(j)
        word = copy.deepcopy(words[i])
        word["word"] = render(i, j)
        word["end"] = words[j].get("end", word.get("end"))
        probabilities = [w["probability"] for w in words[i : j + 1] if w.get("probability") is not None]
        if probabilities:
            word["probability"] = min(probabilities)
        out.append(word)
        i = j + 1
    return out


def apply(result: dict[str, Any], output: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    new = copy.deepcopy(result)
    segments = new.get("segments") or []
    by_segment: dict[int, list[tuple[int, int, str]]] = {}
    for entity in output.get("entities") or []:
        i = int(entity["segment"])
        if 0 <= i < len(segments):
            by_segment.setdefault(i, []).append((int(entity["start"]), int(entity["end"]), f"[{entity['kind']}]"))
    for i, spans in by_segment.items():
        segment = segments[i]
        text = str(segment.get("text") or "")
        merged: list[tuple[int, int, str]] = []  # overlaps merged, clipped to the text
        for s, e, tag in sorted((max(0, s), min(len(text), e), tag) for s, e, tag in spans):
            if s >= e:
                continue
            if merged and s < merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], e), merged[-1][2])
            else:
                merged.append((s, e, tag))
        if not merged:
            continue
        if segment.get("words"):
            segment["words"] = _redacted_words(text, segment["words"], merged)
        pieces, at = [], 0
        for s, e, tag in merged:
            pieces += [text[at:s], tag]
            at = e
        pieces.append(text[at:])
        segment["text"] = "".join(pieces)
    if segments:
        new["text"] = " ".join(str(s.get("text")) for s in segments if s.get("text"))
    new["redacted"] = {"kinds": list(output.get("kinds") or []), "count": int(output.get("count") or 0)}
    return new


def given(params: dict[str, Any]) -> str:
    """The option's value that parses back to `params` (a re-run asks for what its original did)."""
    return ",".join(params.get("kinds") or [])
