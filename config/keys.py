"""Parsing WHISPERQ_ENCRYPTION_KEYS: ``KEYID:BASE64KEY[,KEYID:BASE64KEY...]``. What the keys
do (encryption at rest) is models.security.crypto's; reading them is configuration's, so config
imports nothing of the product."""

from __future__ import annotations

import base64
import binascii
import re

KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
KEY_BYTES = 32
GENERATE_HINT = (
    'generate a key with `whisperq encryption new-key` (or `python -c "import base64,os; '
    "print('k1:' + base64.b64encode(os.urandom(32)).decode())\"`)"
)


def parse_keys(text: str) -> list[tuple[str, bytes]]:
    """``KEYID:BASE64KEY[,KEYID:BASE64KEY...]``: the first encrypts, all decrypt."""
    out: list[tuple[str, bytes]] = []
    for n, entry in enumerate((e.strip() for e in (text or "").split(",")), 1):
        if not entry:
            continue
        key_id, sep, b64 = entry.partition(":")
        key_id, b64 = key_id.strip(), b64.strip()
        if not sep or not key_id or not b64:
            raise ValueError(f"entry {n} is not KEYID:BASE64KEY; separate keys with commas and {GENERATE_HINT}")
        if not KEY_ID.match(key_id):
            raise ValueError(f"entry {n}: key id {key_id!r} must be 1 to 32 letters, digits, '-' or '_'")
        key = _b64decode(b64)
        if key is None or len(key) != KEY_BYTES:
            got = "not base64" if key is None else f"{len(key)} bytes"
            raise ValueError(
                f"key {key_id!r} is {got}; a key is {KEY_BYTES} random bytes in base64 (44 characters): "
                + GENERATE_HINT
            )
        if len(set(key)) < 8:  # all zeros, one byte repeated, a pattern: no key at all
            raise ValueError(
                f"key {key_id!r} is not random (its {KEY_BYTES} bytes take fewer than 8 values); " + GENERATE_HINT
            )
        if any(key_id == seen for seen, _ in out):
            raise ValueError(f"key id {key_id!r} appears twice; give each key its own id")
        out.append((key_id, key))
    if not out:
        raise ValueError(f"no key given; set KEYID:BASE64KEY, {GENERATE_HINT}")
    return out


def _b64decode(text: str) -> bytes | None:
    """Standard or URL-safe base64, padding optional; None when it is not base64."""
    padded = text + "=" * (-len(text) % 4)
    try:
        return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None
