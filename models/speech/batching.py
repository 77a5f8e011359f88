"""Dynamic batching across jobs, in the manner of Triton's dynamic batcher.

Jobs running in a worker's threads submit their windows; a batcher thread takes the
most urgent window waiting, gathers up to `max_batch` windows that can share an
inference call (same language and task), waiting at most `max_wait` for more to
arrive, and runs one call. `parallel` such threads run batches side by side (on a CPU,
one per core: see models.speech.engines.parallel_batches). Each window has its own future, so a
failure belongs to the window that caused it: a batch that raises is split and retried
window by window.

What a batcher does is observable from outside its threads, for operators and for tests
that must wait for an event rather than sleep: `stats()["running_jobs"]` names the jobs whose
windows are in the model now, and a batch is recorded (`stats()`, the log line naming its
jobs) before its windows' results are handed out, so whoever has a result can already see
the batch that made it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from config.priorities import Priority

log = logging.getLogger(__name__)


@dataclass(order=True)
class _Item:
    rank: int
    seq: int
    key: Hashable = field(compare=False)
    payload: Any = field(compare=False)
    job_id: str = field(compare=False)
    enqueued: float = field(compare=False)
    future: Future[Any] = field(compare=False)


@dataclass
class BatchRecord:
    size: int
    jobs: int
    wait_ms: float
    run_ms: float
    # A full batch was already waiting when the batcher became free: the model did not
    # wait for work (the pool holds enough jobs for the next batch to fill meanwhile).
    ready: bool = False


class Batcher:
    """`run_batch(key, payloads) -> results` is called from one thread, one batch at a time."""

    def __init__(
        self,
        run_batch: Callable[[Hashable, list[Any]], Sequence[Any]],
        max_batch: int = 8,
        max_wait: float = 0.05,
        history: int = 1000,
        on_batch: Callable[[BatchRecord], None] | None = None,
        parallel: int = 1,
    ):
        if max_batch < 1 or parallel < 1:
            raise ValueError("max_batch and parallel must be at least 1")
        self.run_batch = run_batch
        self.on_batch = on_batch  # told of every batch record (metrics); must not raise
        self.max_batch = max_batch
        self.max_wait = max_wait
        self._pending: list[_Item] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._closed = False
        self.parallel = parallel
        self.records: deque[BatchRecord] = deque(maxlen=history)
        self.batches = 0
        self.windows = 0
        self._count_lock = threading.Lock()
        self._running: dict[int, list[str]] = {}  # batch -> its job ids, while the model runs it
        self._threads = [
            threading.Thread(target=self._loop, name=f"whisperq-batcher-{n}", daemon=True) for n in range(parallel)
        ]
        for thread in self._threads:
            thread.start()

    def submit(
        self, key: Hashable, payloads: Sequence[Any], priority: str = "normal", job_id: str = ""
    ) -> list[Future[Any]]:
        rank = Priority.rank_of(priority)
        now = time.monotonic()
        futures = []
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is shut down")
            for payload in payloads:
                fut: Future[Any] = Future()
                self._pending.append(_Item(rank, next(self._seq), key, payload, job_id, now, fut))
                futures.append(fut)
            self._cond.notify_all()
        return futures

    def cancel(self, futures: Sequence[Future[Any]]) -> int:
        """Withdraw windows that have not been batched yet (a job that timed out or stopped)."""
        wanted = {id(f) for f in futures}
        with self._cond:
            before = len(self._pending)
            self._pending = [i for i in self._pending if id(i.future) not in wanted]
            removed = before - len(self._pending)
        for fut in futures:
            fut.cancel()
        return removed

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def running_jobs(self) -> list[str]:
        """The jobs whose windows are in the model now."""
        with self._count_lock:
            return sorted({job_id for jobs in self._running.values() for job_id in jobs})

    def stats(self) -> dict[str, Any]:
        records = list(self.records)
        sizes = [r.size for r in records]
        return {
            "running_jobs": self.running_jobs(),
            "batches": self.batches,
            "windows": self.windows,
            "pending": self.pending(),
            "max_batch": self.max_batch,
            "parallel": self.parallel,
            "max_wait_ms": self.max_wait * 1000,
            "recent_sizes": sizes[-200:],
            "recent_wait_ms": [round(r.wait_ms, 1) for r in records[-200:]],
            "recent_ready": [r.ready for r in records[-200:]],
            "mean_size": (sum(sizes) / len(sizes)) if sizes else 0.0,
        }

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=10)

    # The batcher thread.

    def _take(self) -> tuple[list[_Item], bool] | None:
        """The next batch, and whether a full one was already waiting when this thread
        became free; None once the batcher is closed."""
        with self._cond:
            ready = len(self._pending) >= self.max_batch
            while not self._pending:
                if self._closed:
                    return None
                self._cond.wait()
            first = min(self._pending)
            deadline = first.enqueued + self.max_wait
            while True:
                same = sorted(i for i in self._pending if i.key == first.key)
                remaining = deadline - time.monotonic()
                if len(same) >= self.max_batch or remaining <= 0 or self._closed:
                    break
                self._cond.wait(remaining)
                if first not in self._pending:  # withdrawn, or taken by another thread, while we waited
                    return [], ready
            batch = same[: self.max_batch]
            taken = {id(i) for i in batch}
            self._pending = [i for i in self._pending if id(i) not in taken]
            return batch, ready

    def _loop(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            batch, ready = taken
            batch = [i for i in batch if i.future.set_running_or_notify_cancel()]
            if batch:
                self._run(batch, ready)

    def _run(self, batch: list[_Item], ready: bool = False) -> None:
        started = time.monotonic()
        wait_ms = (started - min(i.enqueued for i in batch)) * 1000
        try:
            results = self._call(batch)
            if len(results) != len(batch):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} inputs")
        except Exception as exc:
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
            else:
                log.warning("batch of %d failed (%s); retrying its windows one by one", len(batch), exc)
                for item in batch:
                    self._run_one(item)
            return
        self._record(batch, wait_ms, (time.monotonic() - started) * 1000, ready)
        for item, result in zip(batch, results, strict=True):
            item.future.set_result(result)

    def _run_one(self, item: _Item) -> None:
        started = time.monotonic()
        try:
            (result,) = self._call([item])
        except Exception as exc:
            item.future.set_exception(exc)
            return
        self._record([item], 0.0, (time.monotonic() - started) * 1000)
        item.future.set_result(result)

    def _call(self, batch: list[_Item]) -> list[Any]:
        """run_batch on these windows, with their jobs listed in `running_jobs` meanwhile."""
        with self._count_lock:
            self._running[id(batch)] = [i.job_id for i in batch if i.job_id]
        try:
            return list(self.run_batch(batch[0].key, [i.payload for i in batch]))
        finally:
            with self._count_lock:
                del self._running[id(batch)]

    def _record(self, batch: list[_Item], wait_ms: float, run_ms: float, ready: bool = False) -> None:
        jobs = len({i.job_id for i in batch})
        record = BatchRecord(len(batch), jobs, wait_ms, run_ms, ready)
        with self._count_lock:
            self.records.append(record)
            self.batches += 1
            self.windows += len(batch)
        if self.on_batch is not None:
            try:
                self.on_batch(record)
            except Exception:
                log.warning("batch record not passed on", exc_info=True)
        log.info(
            "batch: %d windows from %d jobs (%s), waited %.0f ms, ran %.0f ms",
            len(batch),
            jobs,
            ", ".join(sorted({i.job_id for i in batch if i.job_id})),
            wait_ms,
            run_ms,
        )
