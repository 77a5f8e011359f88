"""Long-polls: one reader per web process for every client waiting on a job.

Each client waiting (`GET /v1/jobs/<id>?wait=N`) registers the state of its job it holds
(the first part of the ETag, web.api.job_state); every STEP one thread (a greenlet under the
gevent worker) loads all the jobs being waited on in one query and wakes the clients whose
job's state changed. A thousand waiting clients cost one query per step, not a thousand.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from sqlalchemy import select

from models.jobs.record import Job
from models.runtime import Runtime

log = logging.getLogger(__name__)

STEP = 0.5  # seconds between looks


class JobWatch:
    def __init__(self, fingerprint: Callable[[Runtime, Job], str], step: float = STEP):
        self.fingerprint, self.step = fingerprint, step
        self._lock = threading.Lock()
        self._waiting: dict[tuple[int, str], list[tuple[threading.Event, str, Runtime]]] = {}
        self._thread: threading.Thread | None = None

    def wait(self, rt: Runtime, job_id: str, tag: str, timeout: float) -> None:
        """Return once the job's state is no longer `tag` (or it is gone), or after `timeout`."""
        entry = (threading.Event(), tag, rt)
        key = (id(rt), job_id)
        with self._lock:
            self._waiting.setdefault(key, []).append(entry)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="whisperq-job-watch", daemon=True)
                self._thread.start()
        try:
            entry[0].wait(timeout)
        finally:
            with self._lock:
                entries = self._waiting.get(key, [])
                if entry in entries:
                    entries.remove(entry)
                if not entries:
                    self._waiting.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(self.step)
            with self._lock:
                if not self._waiting:
                    self._thread = None
                    return
                waiting = {key: list(entries) for key, entries in self._waiting.items()}
            try:
                self._look(waiting)
            except Exception:  # the database may be away for a moment: the clients' time-outs still hold
                log.warning("long-polls not checked this time", exc_info=True)

    def _look(self, waiting) -> None:
        by_runtime: dict[int, tuple[Runtime, list[str]]] = {}
        for (rt_id, job_id), entries in waiting.items():
            by_runtime.setdefault(rt_id, (entries[0][2], []))[1].append(job_id)
        for rt_id, (rt, ids) in by_runtime.items():
            with rt.db.session() as session:
                jobs = {job.id: job for job in session.scalars(select(Job).where(Job.id.in_(ids)))}
                for job_id in ids:
                    job = jobs.get(job_id)
                    now = None if job is None or job.deleted_at is not None else self.fingerprint(rt, job)
                    for event, tag, _rt in waiting[(rt_id, job_id)]:
                        if now != tag:
                            event.set()
