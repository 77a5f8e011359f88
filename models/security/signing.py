"""The messages the service sends itself, signed: an HMAC-SHA256, under a key derived from the
deployment's keyring (the same keys that seal its data), over the task's name and its
arguments, carried in the message's `whisperq_mac` header as ``wqm1:KEY_ID:BASE64``.

A worker acts on a message of its own kind (prepared -> infer, a shadow, an analysis, a
webhook delivery, beat's periodic passes, a job the service queued) only when its signature
holds; anything else is dropped before a job is read (tasks.broker.signing). The key id travels
with the signature, so messages signed before a key rotation verify while the old key is
configured. A producer outside the service (a raw message) signs nothing: its message may
only create a new job (models.pipeline.preparation).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

from models.security.crypto import DecryptionError, Keyring, current_keyring

PREFIX = "wqm1"
HEADER = "whisperq_mac"


def canonical(task: str, args: Any, kwargs: Any) -> bytes:
    """What is signed: the task's name and its arguments as JSON carries them (a tuple is a list),
    keys sorted, so the sender's Python values and the receiver's decoded ones agree."""
    return json.dumps([task, args, kwargs], sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(task: str, args: Any, kwargs: Any, keyring: Keyring | None = None) -> str:
    keyring = keyring or current_keyring()
    key_id = keyring.active
    mac = hmac.new(keyring.mac_key(key_id), canonical(task, args, kwargs), hashlib.sha256).digest()
    return f"{PREFIX}:{key_id}:{base64.b64encode(mac).decode()}"


def verify(token: object, task: str, args: Any, kwargs: Any, keyring: Keyring | None = None) -> str | None:
    """None where `token` signs this task with these arguments under a configured key; else why not."""
    if not isinstance(token, str) or not token:
        return "unsigned"
    parts = token.split(":")
    if len(parts) != 3 or parts[0] != PREFIX:
        return "malformed signature"
    keyring = keyring or current_keyring()
    try:
        key = keyring.mac_key(parts[1])
        given = base64.b64decode(parts[2], validate=True)
    except (DecryptionError, ValueError):
        return "signed with a key this deployment does not have"
    wanted = hmac.new(key, canonical(task, args, kwargs), hashlib.sha256).digest()
    return None if hmac.compare_digest(given, wanted) else "bad signature"
