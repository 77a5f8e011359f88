"""Long-polls and the status cache: one reader per web process for every job clients follow.

Each client waiting (`GET /v1/jobs/<id>?wait=N`) registers the state of its job it holds
(the first part of the ETag, web.api.job_state); every STEP one thread (a greenlet under the
gevent worker) loads all the jobs being waited on, and every job whose answer the status
cache holds (web.statuscache), in one query, wakes the clients whose job's state changed and
confirms or drops the cached answers. A thousand waiting or polling clients cost one query
per step, not a thousand. The thread ends when nobody waits and nothing is cached.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from models.jobs.record import Job
from models.runtime import Runtime

from .statuscache import StatusCache

log = logging.getLogger(__name__)

STEP = 0.5  # seconds between looks
# What a job's state is a digest of (web.api.job_state): status, stage, progress, attempts,
# errors; its webhook deliveries too where it has a callback. The reader loads these columns
# of the jobs it looks at, not whole rows (their sealed transcripts, their analyses' rows).
STATE_FIELDS = (
    "status",
    "stage",
    "progress_seconds",  # with status and audio_duration, the progress
    "attempts",
    "error",
    "next_attempt_at",
    "finished_at",
    "result_purged_at",
    "audio_duration",
    "corrected_at",
)
# callback_url is sealed: whether it is set is all a state needs (its token, under the name).
_LOOKED_AT = [
    *(getattr(Job, name) for name in ("id", "deleted_at", *STATE_FIELDS)),
    Job.callback_url_token.label("callback_url"),
]


class JobWatch:
    def __init__(self, fingerprint: Callable[[Runtime, Any], str], cache: StatusCache, step: float = STEP):
        """`fingerprint(rt, job)` reads STATE_FIELDS, `id` and `callback_url` of `job` (a Job, or
        the reader's row of those columns)."""
        self.fingerprint, self.cache, self.step = fingerprint, cache, step
        self._lock = threading.Lock()
        self._waiting: dict[tuple[int, str], list[tuple[threading.Event, str, Runtime]]] = {}
        self._thread: threading.Thread | None = None
        cache.on_entry = self.keep

    def wait(self, rt: Runtime, job_id: str, tag: str, timeout: float) -> bool:
        """Return once the job's state is no longer `tag` (or it is gone): True; or after
        `timeout`: False."""
        entry = (threading.Event(), tag, rt)
        key = (id(rt), job_id)
        with self._lock:
            self._waiting.setdefault(key, []).append(entry)
        self.keep()
        try:
            return entry[0].wait(timeout)
        finally:
            with self._lock:
                entries = self._waiting.get(key, [])
                if entry in entries:
                    entries.remove(entry)
                if not entries:
                    self._waiting.pop(key, None)

    def keep(self) -> None:
        """Make sure the reader runs."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="whisperq-job-watch", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.step)
            with self._lock:
                cached = self.cache.watched()
                if not self._waiting and not cached:
                    self._thread = None
                    return
                waiting = {key: list(entries) for key, entries in self._waiting.items()}
            try:
                self._look(waiting, cached)
            except Exception:  # the database may be away for a moment: the clients' time-outs still hold
                log.warning("long-polls and cached job states not checked this time", exc_info=True)

    def _look(self, waiting, cached) -> None:
        by_runtime: dict[int, tuple[Runtime, set[str]]] = {}
        for (rt_id, job_id), entries in waiting.items():
            by_runtime.setdefault(rt_id, (entries[0][2], set()))[1].add(job_id)
        for job_id, held in cached.items():
            by_runtime.setdefault(id(held.rt), (held.rt, set()))[1].add(job_id)
        for rt_id, (rt, ids) in by_runtime.items():
            at = time.monotonic()
            with rt.db.session() as session:
                rows = {row.id: row for row in session.execute(select(*_LOOKED_AT).where(Job.id.in_(ids)))}
                for job_id in ids:
                    row = rows.get(job_id)
                    now = None if row is None or row.deleted_at is not None else self.fingerprint(rt, row)
                    for event, tag, _rt in waiting.get((rt_id, job_id), ()):
                        if now != tag:
                            event.set()
                    held = cached.get(job_id)
                    if held is not None and held.rt is rt:
                        self.cache.confirm(held, now, at)
