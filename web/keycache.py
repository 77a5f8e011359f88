"""Who a key is, from memory for a second: a poll should not cost a key lookup.

A key is checked by its SHA-256 (fast: it has 256 bits of entropy) and one indexed read of
its row (models.access.apikeys.authenticate); that read was a third of a status poll's CPU.
Each web process keeps the principal of a key it has verified for RECHECK seconds, then
reads the row again: a key revoked elsewhere (`whisperq keys revoke`, another web process)
is refused within a second, and one revoked in this process at once (its row's flush
empties the cache). Only keys that passed are kept: an unknown key always reaches the
database, as before.
"""

from __future__ import annotations

import threading
import time

from sqlalchemy import event
from sqlalchemy.orm import Session

from models.access.apikeys import ApiKey, Principal, authenticate, digest, principal_for_key_id
from models.runtime import Runtime

RECHECK = 1.0  # seconds a verified key is trusted without reading its row
_SWEEP_AT = 10_000


class KeyCache:
    def __init__(self):
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str, str], tuple[Principal, float]] = {}

    def by_token(self, rt: Runtime, token: str) -> Principal:
        """authenticate(), remembered: BadKey (401) for an unknown or revoked key."""
        return self._lookup(rt, ("token", digest(token)), lambda: authenticate(rt, token))

    def by_key_id(self, rt: Runtime, key_id: str) -> Principal | None:
        """principal_for_key_id() (a signed-in browser), remembered; None once revoked."""
        return self._lookup(rt, ("id", key_id), lambda: principal_for_key_id(rt, key_id))

    def _lookup(self, rt: Runtime, what: tuple[str, str], read):
        key = (rt.db.url, *what)
        now = time.monotonic()
        with self._lock:
            hit = self._known.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        found = read()
        if found is not None:
            with self._lock:
                if len(self._known) >= _SWEEP_AT:
                    self._known = {k: v for k, v in self._known.items() if v[1] > now}
                self._known[key] = (found, now + RECHECK)
        return found

    def clear(self) -> None:
        with self._lock:
            self._known.clear()


keys = KeyCache()


def _forget_keys(session: Session, _context) -> None:
    if any(isinstance(obj, ApiKey) for obj in (*session.new, *session.dirty, *session.deleted)):
        keys.clear()


def _forget_keys_bulk(state) -> None:
    if (state.is_update or state.is_delete) and state.bind_mapper is not None and state.bind_mapper.class_ is ApiKey:
        keys.clear()


if not event.contains(Session, "after_flush", _forget_keys):
    event.listen(Session, "after_flush", _forget_keys)
    event.listen(Session, "do_orm_execute", _forget_keys_bulk)
