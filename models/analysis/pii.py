"""Personal data in a text, by rules: e-mail addresses (written, and spoken as Whisper writes
them: "john dot smith at example dot com"), phone numbers (Google's libphonenumber, the
``phonenumbers`` package installed as ``phonenumberslite``), card numbers (Luhn), IBANs (ISO 7064
mod 97), US SSNs (the SSA's rules), IP addresses (``ipaddress``) and runs of spoken digits
("four one one one", "oh five five five", and the digit groups Whisper writes for them). No
model, nothing downloaded. ``find`` gives each entity's kind and place; redaction
(models.analysis.redaction) decides what to do with them.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

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
