"""Each polled job's answer, from memory: a poll of an unchanged job touches no database.

A status read builds the job's body once (its record, place in the queue, estimates, links)
and keeps it here with its ETag. The next read of the same job is answered from memory
while the job is known unchanged; `If-None-Match` that matches gets a bodiless 304.

Known unchanged means: the one reader per web process (web.waits.JobWatch, already looking
at every long-polled job) also loads the state's columns of every job held here, in one query
a step (0.5 s), and drops those whose state (web.api.job_state) moved; an entry it has not confirmed for STALE
seconds (the database away, the reader not started yet) is read afresh. A change made in
this process (a cancel, a delete, a correction, a revoked key) drops the entry at once,
from the session's flush, so a client reads its own writes; a change made by a worker or
another web process shows within a step. Moving in the queue rebuilds the body from the
job held here, without reading it again (the place comes from the per-process queue
snapshot, models.jobs.eta), and so does an age of BODY_AGE (estimates drift).

Authorization is checked on every read against the owner of the row the entry was built
from: an entry never answers a key the database would not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from models.delivery.notify import WebhookDelivery
from models.jobs.record import Job
from models.runtime import Runtime

STALE = 1.0  # seconds an entry is trusted after the reader last confirmed it
BODY_AGE = 10.0  # seconds before a cached body's estimates are worked out again
IDLE = 60.0  # seconds without a read before an entry is dropped (and no longer watched)
MAX_ENTRIES = 20_000


@dataclass
class Entry:
    rt: Runtime
    job: Job  # detached, as loaded when the entry was built (its state unchanged since)
    state: str  # web.api.job_state of `job`
    place: int | None
    body: dict[str, Any]
    payload: bytes  # the body as sent
    host: str  # the links in the body are this host's
    built: float
    checked: float
    read: float

    @property
    def etag(self) -> str:
        """`STATE.PLACE`: the job itself (web.api.job_state) and its place in the queue; not the
        estimates, which move with the clock."""
        return f"{self.state}.{'-' if self.place is None else self.place}"


class StatusCache:
    def __init__(self):
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self.on_entry: Callable[[], None] = lambda: None  # the reader starts (web.waits.JobWatch.keep)

    def get(self, rt: Runtime, job_id: str) -> Entry | None:
        """The job's entry while it is known unchanged, else None."""
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(job_id)
        if entry is None or entry.rt.db.url != rt.db.url or now - entry.checked > STALE:
            return None
        entry.read = now
        return entry

    def put(self, entry: Entry) -> Entry:
        with self._lock:
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.pop(min(self._entries, key=lambda k: self._entries[k].read))
            self._entries[entry.job.id] = entry
        self.on_entry()
        return entry

    def drop(self, job_id: str) -> None:
        with self._lock:
            self._entries.pop(job_id, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def watched(self) -> dict[str, Entry]:
        """The entries to confirm now; entries nobody read for IDLE seconds are dropped."""
        now = time.monotonic()
        with self._lock:
            for job_id in [k for k, e in self._entries.items() if now - e.read > IDLE]:
                del self._entries[job_id]
            return dict(self._entries)

    def confirm(self, entry: Entry, state: str | None, at: float) -> None:
        """The reader found the job's state at `at` (None: gone): keep the entry if it is the
        same, else drop it. An entry replaced meanwhile is left alone."""
        with self._lock:
            if self._entries.get(entry.job.id) is not entry:
                return
            if state is None or state != entry.state:
                del self._entries[entry.job.id]
            else:
                entry.checked = at


cache = StatusCache()


def _forget_flushed(session: Session, _context) -> None:
    """This process changed (or deleted) these jobs or their webhook deliveries: their
    entries go at once, before the change is even committed (a rollback costs a rebuild)."""
    for obj in (*session.new, *session.dirty, *session.deleted):
        if isinstance(obj, Job):
            cache.drop(obj.id)
        elif isinstance(obj, WebhookDelivery):
            cache.drop(obj.job_id)


def _forget_bulk(state) -> None:
    """An UPDATE or DELETE statement on jobs or deliveries names no rows here: drop every entry."""
    if (
        (state.is_update or state.is_delete)
        and state.bind_mapper is not None
        and state.bind_mapper.class_ in (Job, WebhookDelivery)
    ):
        cache.clear()


if not event.contains(Session, "after_flush", _forget_flushed):
    event.listen(Session, "after_flush", _forget_flushed)
    event.listen(Session, "do_orm_execute", _forget_bulk)
