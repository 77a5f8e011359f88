"""Worker-side metrics: job latencies, outcomes, retries, batches and real-time factor,
observed in the worker process where they happen (tasks.metrics serves them).

Job facts come from the Job row's own transitions: a listener on the SQLAlchemy session
notes each change of a job's status or stage as it is flushed and observes it once the
transaction commits. A rolled-back change counts nothing, and every path that moves a
job (the tasks, retries, the sweeper, a cancel at a window boundary) is counted with no
code of its own. Nothing here raises into a job: a metrics error is logged and dropped.
Only worker processes enable it; the web process serves cluster-wide gauges instead.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from config import PRIORITIES
from models.db import utcnow
from models.jobs.record import Job, JobStatus, Stage

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Histogram
    from sqlalchemy.orm import Session
    from sqlalchemy.orm.attributes import History

log = logging.getLogger(__name__)

_LONG = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, float("inf"))
_SHORT = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, float("inf"))
_BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128, 256, float("inf"))
_BATCH_WAITS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, float("inf"))
_RTF = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 5, float("inf"))
_WER = (0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, float("inf"))
_NOTES = "whisperq_metrics"


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        def histogram(
            name: str, doc: str, buckets: tuple[float, ...], labels: list[str] | tuple[str, ...] = ()
        ) -> Histogram:
            return Histogram(name, doc, list(labels), buckets=buckets, registry=registry)

        self.wait = histogram(
            "whisperq_job_wait_seconds",
            "Queue wait until preparation starts (first attempt), by priority",
            _LONG,
            ["priority"],
        )
        self.prepare = histogram("whisperq_job_prepare_seconds", "Preparation: fetch, decode, split", _SHORT)
        self.inference = histogram(
            "whisperq_job_inference_seconds",
            "Inference wall time per completed job, batcher wait included, by model",
            _LONG,
            ["model"],
        )
        self.end_to_end = histogram(
            "whisperq_job_end_to_end_seconds",
            "Created to COMPLETED, by priority and model",
            _LONG,
            ["priority", "model"],
        )
        self.rtf = histogram(
            "whisperq_real_time_factor", "Inference wall time over audio duration per job, by model", _RTF, ["model"]
        )
        self.batch_size = histogram("whisperq_batch_size", "Windows per inference call", _BATCH_SIZES)
        self.batch_wait = histogram(
            "whisperq_batch_wait_seconds", "Wait of a batch's oldest window before its inference call", _BATCH_WAITS
        )
        self.finished = Counter(
            "whisperq_jobs_finished",
            "Jobs that reached a final state in this worker, by model",
            ["status", "model"],
            registry=registry,
        )
        self.retries = Counter(
            "whisperq_job_retries", "Attempts sent back to the queue after a failure", registry=registry
        )
        self.shadow_wer = histogram(
            "whisperq_shadow_wer",
            "Word error rate of a shadow model's transcript against "
            "the primary's, per job (0: they agree word for word)",
            _WER,
            ["primary", "candidate"],
        )
        self.purged = Counter(
            "whisperq_retention_deleted",
            "What retention deleted (models.maintenance.retention), by kind",
            ["kind"],
            registry=registry,
        )
        self.analyses = Counter(
            "whisperq_analyses_finished",
            "Analyses (models.analysis) that ended in this worker, by analysis and status (DONE, FAILED)",
            ["analysis", "status"],
            registry=registry,
        )
        self.engine_passes = Counter(
            "whisperq_engine_passes",
            "Engine passes over a job's windows, by how they ended (models.jobs.ledger): stored, discarded "
            "(duplicate work: a claim taken over, a transcript already stored), cancelled, failed",
            ["model", "outcome"],
            registry=registry,
        )
        self.dropped = Counter(
            "whisperq_messages_dropped",
            "Messages a worker dropped unread: not signed by this deployment, or not for its queues "
            "(tasks.broker.signing), by task and reason",
            ["task", "reason"],
            registry=registry,
        )
        self.analysis_seconds = histogram(
            "whisperq_analysis_seconds", "Time of one analysis's run, by analysis", _SHORT, ["analysis"]
        )
        # Every series from the start, so that rate() sees the first job too.
        for tier in PRIORITIES:
            self.wait.labels(tier)
        self._models: set[str] = set()

    def model(self, name: str | None) -> str:
        """A model's label; its series are made the first time it is seen (from zero)."""
        name = name or ""
        if name not in self._models:
            self._models.add(name)
            for tier in PRIORITIES:
                self.end_to_end.labels(tier, name)
            for status in JobStatus:
                if status.finished:
                    self.finished.labels(status.value, name)
        return name


_lock = threading.Lock()
_registry: CollectorRegistry | None = None
_metrics: _Metrics | None = None
_enabled = False


def registry() -> CollectorRegistry:
    """The registry that holds this process's worker metrics."""
    global _registry
    if _registry is None:
        from prometheus_client import CollectorRegistry

        with _lock:
            if _registry is None:
                _registry = CollectorRegistry(auto_describe=True)
    return _registry


def _get() -> _Metrics:
    # Built on first use, after tasks.metrics has chosen multiprocess mode or not.
    global _metrics
    if _metrics is None:
        reg = registry()
        with _lock:
            if _metrics is None:
                _metrics = _Metrics(reg)
    return _metrics


def enabled() -> bool:
    return _enabled


def enable() -> None:
    """Observe jobs and batches in this process from now on (a worker; a test)."""
    global _enabled
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    with _lock:
        if _enabled:
            return
        event.listen(Session, "after_flush", _after_flush)
        event.listen(Session, "after_commit", _after_commit)
        event.listen(Session, "after_rollback", _after_rollback)
        _enabled = True
    _get()


def disable() -> None:
    global _enabled
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    with _lock:
        if not _enabled:
            return
        event.remove(Session, "after_flush", _after_flush)
        event.remove(Session, "after_commit", _after_commit)
        event.remove(Session, "after_rollback", _after_rollback)
        _enabled = False


def observe_batch(record: Any) -> None:
    """A batch ran (models.speech.batching.BatchRecord)."""
    if not _enabled:
        return
    try:
        m = _get()
        m.batch_size.observe(record.size)
        m.batch_wait.observe(max(0.0, record.wait_ms / 1000))
    except Exception:
        log.warning("metrics: batch not recorded", exc_info=True)


def observe_shadow(primary: str | None, candidate: str, wer: float) -> None:
    """A shadow transcript was compared with its job's (models.jobs.shadows)."""
    if not _enabled:
        return
    try:
        _get().shadow_wer.labels(primary or "", candidate).observe(wer)
    except Exception:
        log.warning("metrics: shadow agreement not recorded", exc_info=True)


def observe_analysis(name: str, status: str, seconds: float | None = None) -> None:
    """An analysis ended (models.jobs.analyses): DONE in `seconds`, or FAILED."""
    if not _enabled:
        return
    try:
        m = _get()
        m.analyses.labels(name, status).inc()
        if seconds is not None:
            m.analysis_seconds.labels(name).observe(seconds)
    except Exception:
        log.warning("metrics: analysis not recorded", exc_info=True)


def observe_engine_pass(model: str, outcome: str) -> None:
    """An engine pass ended (models.jobs.ledger)."""
    if not _enabled:
        return
    try:
        _get().engine_passes.labels(model, outcome).inc()
    except Exception:
        log.warning("metrics: engine pass not recorded", exc_info=True)


def observe_dropped(task: str, reason: str) -> None:
    """A message dropped before it was read (tasks.broker.signing)."""
    if not _enabled:
        return
    try:
        _get().dropped.labels(task, reason).inc()
    except Exception:
        log.warning("metrics: dropped message not recorded", exc_info=True)


def count_purged(counts: dict[str, int]) -> None:
    """A retention pass ran (models.maintenance.retention): what it deleted, by kind."""
    if not _enabled:
        return
    try:
        m = _get()
        for kind, n in counts.items():
            if n:
                m.purged.labels(kind).inc(n)
    except Exception:
        log.warning("metrics: retention counts not recorded", exc_info=True)


def _seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return max(0.0, (later - earlier).total_seconds())


def _old(history: History) -> Any:
    return history.deleted[0] if history.deleted else None


def _notes_for(job: Job) -> list[tuple[Any, ...]]:
    """What a flushed change of this job means for the metrics, as notes to observe on commit."""
    from sqlalchemy import inspect

    attrs = inspect(job).attrs
    notes: list[tuple[Any, ...]] = []
    status, stage = attrs.status.history, attrs.stage.history
    old, new = _old(status), job.status
    if status.added and old is not None and old != new:
        priority = job.priority or "normal"
        if new == JobStatus.PROCESSING.value and old == JobStatus.PENDING.value and job.attempts == 1:
            notes.append(("wait", priority, _seconds(job.started_at, job.waiting_since())))
        elif new == JobStatus.PENDING.value and old == JobStatus.PROCESSING.value:
            notes.append(("retry",))
        elif JobStatus(new).finished:
            notes.append(("finished", new, job.model))
            if new == JobStatus.COMPLETED.value:
                infer = _seconds(job.finished_at, job.infer_started_at)
                notes.append(
                    (
                        "completed",
                        priority,
                        _seconds(job.finished_at, job.created_at),
                        infer,
                        infer / job.audio_duration if infer is not None and job.audio_duration else None,
                        job.model,
                    )
                )
    if stage.added and _old(stage) == Stage.PREPARE and job.stage == Stage.QUEUED:
        notes.append(("prepared", _seconds(utcnow(), job.started_at)))
    return notes


def _after_flush(session: Session, _context: Any) -> None:
    try:
        for obj in session.dirty:
            if isinstance(obj, Job):
                notes = _notes_for(obj)
                if notes:
                    session.info.setdefault(_NOTES, []).extend(notes)
    except Exception:
        log.warning("metrics: a job's change was not noted", exc_info=True)


def _after_rollback(session: Session) -> None:
    session.info.pop(_NOTES, None)


def _after_commit(session: Session) -> None:
    notes = session.info.pop(_NOTES, None)
    if not notes:
        return
    try:
        m = _get()
        for note in notes:
            kind = note[0]
            if kind == "wait" and note[2] is not None:
                m.wait.labels(note[1]).observe(note[2])
            elif kind == "retry":
                m.retries.inc()
            elif kind == "finished":
                m.finished.labels(note[1], m.model(note[2])).inc()
            elif kind == "prepared" and note[1] is not None:
                m.prepare.observe(note[1])
            elif kind == "completed":
                _, priority, total, infer, rtf, model = note
                model = m.model(model)
                if total is not None:
                    m.end_to_end.labels(priority, model).observe(total)
                if infer is not None:
                    m.inference.labels(model).observe(infer)
                if rtf is not None:
                    m.rtf.labels(model).observe(rtf)
    except Exception:
        log.warning("metrics: job observations dropped", exc_info=True)


class GPUMemory:
    """`whisperq_gpu_memory_bytes{device, kind}` at scrape time, where the speech engine
    runs on CUDA: from torch where it is loaded and initialised, else from NVML
    (`pip install nvidia-ml-py`). Never initialises CUDA itself; absent on a CPU.
    `engines` gives the engines this process has loaded."""

    def __init__(self, engines: Callable[[], list[Any]]):
        self.engines = engines

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            values = _gpu_memory(self.engines())
        except Exception:
            log.debug("metrics: GPU memory not read", exc_info=True)
            values = []
        if values:
            family = GaugeMetricFamily(
                "whisperq_gpu_memory_bytes", "CUDA memory of this worker process", labels=["device", "kind"]
            )
            for device, kind, value in values:
                family.add_metric([str(device), kind], float(value))
            yield family


def _gpu_memory(engines: list[Any]) -> list[tuple[int, str, float]]:
    torch = sys.modules.get("torch")  # read only where the engine imported it
    out: list[tuple[int, str, float]] = []
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            out.append((i, "allocated", torch.cuda.memory_allocated(i)))
            out.append((i, "reserved", torch.cuda.memory_reserved(i)))
        return out
    if not any(getattr(engine, "device", None) == "cuda" for engine in engines):
        return out
    try:
        import pynvml
    except ImportError:
        return out
    import os

    pynvml.nvmlInit()
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mine = [
                p.usedGpuMemory
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                if p.pid == os.getpid() and p.usedGpuMemory is not None
            ]
            if mine:
                out.append((i, "process", sum(mine)))
            else:  # in a container NVML may not see our pid: the device's total use instead
                out.append((i, "device_used", pynvml.nvmlDeviceGetMemoryInfo(handle).used))
    finally:
        pynvml.nvmlShutdown()
    return out
