"""PII redaction (``redact``): finds e-mail addresses, phone numbers, card numbers and spoken
digit runs in a transcript, and hides them from what the job's clients get.

``run`` finds the entities and says only where they are (segment, character offsets, times,
kind), never what they were: its output is what clients may see. ``apply`` replaces each
entity's characters in its segment's text by a tag such as ``[PHONE_NUMBER]``, rebuilds the
transcript's text from its segments, and folds the words an entity overlaps into one word that
carries the tag.

The recognisers are rules, not a model: Google's libphonenumber (the ``phonenumbers`` package,
installed as ``phonenumberslite``, the build without the geocoder and carrier data) for phone
numbers, and regular expressions with the checks that make them precise for the rest (Luhn for
cards, ISO 7064 mod 97 for IBANs, the SSA's rules for SSNs, ``ipaddress`` for IP addresses).
Whisper writes what people say, so it also knows the spoken forms: "john dot smith at example
dot com" is an e-mail address, and "four one one one, one one one one" or "oh five five five" a
run of digits (which, read as digits, is a card number where it passes Luhn, or a phone number
where libphonenumber calls it valid). Digit words are English ones.

Entities are found in the segments' texts joined with a space, so one a segment boundary cuts
in two (a pause in the middle of a phone number) is found too; it is listed once per segment
it touches.
"""

from __future__ import annotations

import bisect
import copy
import importlib.util
import ipaddress
import json
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from models.errors import InvalidRequest

if TYPE_CHECKING:
    import numpy as np

NAME = "redact"
VERSION = "1"
NEEDS_AUDIO = False
# phonenumberslite is in the main install (install_requires): pure Python, ~5 MB, no dependencies.
EXTRA: str | None = None

EMAIL = "EMAIL_ADDRESS"
PHONE = "PHONE_NUMBER"
CARD = "CREDIT_CARD"
DIGITS = "SPOKEN_DIGITS"
IBAN = "IBAN_CODE"
SSN = "US_SSN"
IP = "IP_ADDRESS"

# Every kind, in the order outputs list them.
KINDS: tuple[str, ...] = (EMAIL, PHONE, CARD, DIGITS, IBAN, SSN, IP)
# Two entities that overlap are hidden as one, of the longer one's kind; between two of one
# length, of the earlier kind here.
_PRECEDENCE: tuple[str, ...] = (CARD, IBAN, EMAIL, SSN, PHONE, IP, DIGITS)
DEFAULT_KINDS: tuple[str, ...] = (EMAIL, PHONE, CARD, DIGITS)

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

# The region libphonenumber reads numbers without a country code as, by transcript language
# (numbers written with +CC are found whatever the language).
_REGIONS: dict[str, tuple[str, ...]] = {
    "en": ("US", "GB"),
    "de": ("DE",),
    "fr": ("FR",),
    "es": ("ES",),
    "it": ("IT",),
    "nl": ("NL",),
    "pt": ("BR", "PT"),
    "pl": ("PL",),
    "sv": ("SE",),
    "ja": ("JP",),
}


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
# Recognisers: each yields (kind, start, end) in a text.

Span = tuple[str, int, int]

# E-mail addresses, written ("jane.doe@example.com") or spoken ("john dot smith at example dot
# com", "jane.doe at example.com"). The parts' alternatives never start alike and their repeats
# are bounded, so no backtracking blows up.
_LOCAL_WORD = r"[a-z0-9]+"
_LOCAL_JOIN = r"(?:[._%+-]|\s+(?:dot|underscore|dash|hyphen)\s+)"
_DOMAIN_WORD = r"[a-z0-9]+(?:-[a-z0-9]+)*"
_WRITTEN_EMAIL = re.compile(
    rf"(?<![\w.%+-]){_LOCAL_WORD}(?:{_LOCAL_JOIN}{_LOCAL_WORD}){{0,10}}\s*@\s*{_DOMAIN_WORD}(?:\.{_DOMAIN_WORD}){{0,6}}\.[a-z]{{2,24}}\b",
    re.IGNORECASE,
)
# spoken: " at " for "@", and the domain must end in a top-level domain people say
_TLDS = (
    "com|org|net|edu|gov|mil|int|io|co|uk|us|ca|au|nz|ie|in|de|fr|es|it|nl|be|ch|at|se|no|dk|fi|pl|pt|br|mx|jp|"
    "cn|kr|ru|info|biz|me|ai|dev|app|tv|eu|email|online|xyz"
)
_SPOKEN_EMAIL = re.compile(
    rf"(?<![\w.%+-])(?P<local>{_LOCAL_WORD}(?:{_LOCAL_JOIN}{_LOCAL_WORD}){{0,10}})\s+at\s+"
    rf"{_DOMAIN_WORD}(?:(?:\.|\s+dot\s+){_DOMAIN_WORD}){{0,6}}(?:\.|\s+dot\s+)(?:{_TLDS})\b",
    re.IGNORECASE,
)
# "look at example dot com", "I work at acme.com": a website, not an address
_NOT_LOCAL = set(
    "i me you him her it us them we they he she this that here there is am are was were be been look looks "
    "looking looked work works worked working live lives lived living stay stayed meet met find found based "
    "available up in on out and or but so not just go went us sign signed shop log logged check visit".split()
)


def _emails(text: str) -> Iterable[Span]:
    for m in _WRITTEN_EMAIL.finditer(text):
        yield EMAIL, m.start(), m.end()
    for m in _SPOKEN_EMAIL.finditer(text):
        local = m.group("local")
        if local.lower() in _NOT_LOCAL:
            continue
        yield EMAIL, m.start(), m.end()


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_number(digits: str) -> bool:
    return 13 <= len(digits) <= 19 and len(set(digits)) > 1 and _luhn(digits)


# digit groups joined by single spaces or hyphens: "4111 1111 1111 1111", "4111-1111-...", "4111111111111111"
_DIGIT_GROUPS = re.compile(r"(?<![\w.-])\d+(?:[ -]\d+)*(?![\w])")


def _cards(text: str) -> Iterable[Span]:
    """The longest run of whole digit groups (13 to 19 digits) in a group sequence that passes Luhn."""
    for m in _DIGIT_GROUPS.finditer(text):
        groups = [(g.start() + m.start(), g.end() + m.start()) for g in re.finditer(r"\d+", m.group())]
        i = 0
        while i < len(groups):
            found, digits = None, ""
            for j in range(i, len(groups)):  # at most 19 digits: a few groups
                digits += text[groups[j][0] : groups[j][1]]
                if len(digits) > 19:
                    break
                if _card_number(digits):
                    found = j + 1  # the longest that passes
            if found is None:
                i += 1
            else:
                yield CARD, groups[i][0], groups[found - 1][1]
                i = found


_IBAN_CANDIDATE = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,32}")


def _iban_valid(code: str) -> bool:
    moved = code[4:] + code[:4]
    number = "".join(str(int(ch, 36)) for ch in moved)
    return int(number) % 97 == 1


def _ibans(text: str) -> Iterable[Span]:
    for m in _IBAN_CANDIDATE.finditer(text):
        chars = [(m.start() + i, ch) for i, ch in enumerate(m.group()) if ch != " "]
        for n in range(min(34, len(chars)), 14, -1):
            end = chars[n - 1][0] + 1
            if end < len(text) and text[end].isalnum():
                continue  # ends inside a group
            if _iban_valid("".join(ch for _, ch in chars[:n])):
                yield IBAN, m.start(), end
                break


_SSN = re.compile(r"(?<![\w-])(\d{3})([- ]?)(\d{2})\2(\d{4})(?![\w-])")


def _ssns(text: str) -> Iterable[Span]:
    for m in _SSN.finditer(text):
        area, group, serial = m.group(1), m.group(3), m.group(4)
        if area in ("000", "666") or area.startswith("9") or group == "00" or serial == "0000":
            continue
        if len(set(area + group + serial)) == 1 or area + group + serial == "123456789":
            continue
        yield SSN, m.start(), m.end()


_IPV4 = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?![\w]|\.\d)")
_IPV6 = re.compile(r"(?<![\w:])[0-9a-f]{0,4}(?::[0-9a-f]{0,4}){2,7}(?![\w:])", re.IGNORECASE)


def _ips(text: str) -> Iterable[Span]:
    for m in _IPV4.finditer(text):
        try:
            ipaddress.IPv4Address(m.group())
        except ValueError:
            continue
        yield IP, m.start(), m.end()
    for m in _IPV6.finditer(text):
        candidate = m.group()
        if sum(c.isalnum() for c in candidate) < 3:
            continue
        try:
            ipaddress.IPv6Address(candidate)
        except ValueError:
            continue
        yield IP, m.start(), m.end()


def _phones(text: str, regions: Sequence[str]) -> Iterable[Span]:
    import phonenumbers  # ~25 ms

    for region in regions:
        for match in phonenumbers.PhoneNumberMatcher(text, region, max_tries=1_000_000):
            yield PHONE, match.start, match.end
    # a local number ("555-0132"), which libphonenumber wants an area code for
    for m in re.finditer(r"(?<![\w-])\d{3}-\d{4}(?![\w-])", text):
        yield PHONE, m.start(), m.end()


def _valid_phone(digits: str, regions: Sequence[str]) -> bool:
    import phonenumbers

    for region in regions:
        try:
            number = phonenumbers.parse(digits, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number):
            return True
    return False


# Spoken digits as Whisper writes them: "four one one one, one one one one", "4 1 1 1",
# "oh five five five", "double five". A run counts with at least 4 spoken (or single) digits;
# digit groups next to them ("oh five five five 0132") are part of the run. Tokens are apart by
# spaces, commas, hyphens or an ellipsis; a sentence's end ends the run.
_WORDS = {
    "zero": "0",
    "oh": "0",
    "o": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
}
_DIGIT_WORD = "|".join(sorted(_WORDS, key=len, reverse=True))
_TOKEN = rf"(?:(?:double|triple)\s+(?:{_DIGIT_WORD}|\d)\b|(?:{_DIGIT_WORD})\b|\d+(?![\w]))"
_SPOKEN_RUN = re.compile(
    rf"(?<![\w.-]){_TOKEN}(?:(?:\s*(?:[,-]|\.{{2,}}|…)\s*|\s+){_TOKEN})*",
    re.IGNORECASE,
)
_ONE_TOKEN = re.compile(rf"(?:(double|triple)\s+)?({_DIGIT_WORD}|\d+)(?![\w])", re.IGNORECASE)


# A number written as a number (thousands separated, or with decimals) is not a digit run.
_QUANTITY = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+")


def _spoken(text: str, kinds: Sequence[str], regions: Sequence[str]) -> Iterable[Span]:
    for m in _SPOKEN_RUN.finditer(text):
        digits = []
        spoken = groups = 0
        for t in _ONE_TOKEN.finditer(m.group()):
            times = {"double": 2, "triple": 3}.get((t.group(1) or "").lower(), 1)
            token = t.group(2).lower()
            value = _WORDS.get(token, token)
            if token in _WORDS or len(token) == 1:
                spoken += times
            digits.append(value * times)
            groups += 1
        # Whisper often writes spoken digits as groups ("415-55-0132", "111-111-11"), dropping
        # or merging some: two or more groups of seven digits or more are a run too.
        written = groups >= 2 and len("".join(digits)) >= 7 and not _QUANTITY.fullmatch(m.group().strip())
        if spoken < 4 and not written:
            continue
        number = "".join(digits)
        if CARD in kinds and _card_number(number):
            yield CARD, m.start(), m.end()
        elif PHONE in kinds and 7 <= len(number) <= 15 and _valid_phone(number, regions):
            yield PHONE, m.start(), m.end()
        elif DIGITS in kinds:
            yield DIGITS, m.start(), m.end()


def find(text: str, kinds: Sequence[str], language: str | None = None) -> list[Span]:
    """The entities of `kinds` in `text`: (kind, start, end), sorted, overlaps merged into one span
    (of the longest part's kind)."""
    regions = _REGIONS.get((language or "").lower().split("-")[0], ("US",))
    found: list[Span] = []
    if EMAIL in kinds:
        found += _emails(text)
    if CARD in kinds:
        found += _cards(text)
    if IBAN in kinds:
        found += _ibans(text)
    if SSN in kinds:
        found += _ssns(text)
    if PHONE in kinds:
        found += _phones(text, regions)
    if IP in kinds:
        found += _ips(text)
    if CARD in kinds or PHONE in kinds or DIGITS in kinds:
        found += _spoken(text, kinds, regions)
    found.sort(key=lambda s: (s[1], -s[2]))
    merged: list[tuple[int, int, list[Span]]] = []
    for span in found:
        if merged and span[1] < merged[-1][1]:
            start, end, parts = merged[-1]
            merged[-1] = (start, max(end, span[2]), [*parts, span])
        else:
            merged.append((span[1], span[2], [span]))
    out = []
    for start, end, parts in merged:
        kind = min(parts, key=lambda s: (-(s[2] - s[1]), _PRECEDENCE.index(s[0])))[0]
        out.append((kind, start, end))
    return out


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
