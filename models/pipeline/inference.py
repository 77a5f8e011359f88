"""Inference in a worker process: one engine, one batcher, many jobs at once.

The inference pool runs Celery's threads pool: each thread holds one job, submits its
windows to the process's batcher and waits; the batcher's single thread feeds the model.
Celery enforces time limits only in the prefork and gevent pools, so the wait here has
its own deadline, scaled by the job's audio duration.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from models.errors import JobTimeLimitExceeded, TransientJobError
from models.jobs.metrics import observe_batch
from models.jobs.operations import begin_inference, cancel_running, complete_job, count_engine_run, get_job, record_progress
from models.pipeline.messages import Prepared
from models.speech.audio import SAMPLE_RATE
from models.speech.batching import Batcher
from models.speech.engines import Transcript, batch_size, parallel_batches

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)


def build_batcher(rt: Runtime) -> Batcher:
    """The batcher of a process (Runtime.batcher); the model loads in its thread on the first batch."""
    settings = rt.settings

    def run_batch(key, payloads):
        language, task, words, prompt, temperature = key
        # Passed only when asked for: an engine without them still serves the rest.
        extra = {k: v for k, v in (("prompt", prompt), ("temperature", temperature)) if v}
        return rt.engine.transcribe_batch([p[0] for p in payloads], [p[1] for p in payloads], language, task,
                                          word_timestamps=words, **extra)

    return Batcher(run_batch, max_batch=batch_size(settings), max_wait=settings.batch_wait_ms / 1000,
                   on_batch=observe_batch, parallel=parallel_batches(settings))


def batcher_stats(rt: Runtime) -> dict[str, Any]:
    batcher = rt.built("batcher")
    return batcher.stats() if batcher is not None else {"batches": 0, "windows": 0, "pending": 0, "recent_sizes": []}


# Jobs this process is transcribing now, each with an event set when its run ends.
_running: dict[str, threading.Event] = {}
_running_lock = threading.Lock()


def infer_job(rt: Runtime, prepared: Prepared, batcher: Batcher, worker: str | None = None,
              worker_id: str | None = None) -> dict:
    """Transcribe a prepared job through the batcher and store its transcript, once.

    Progress is recorded window by window; a cancel takes effect at the next window
    boundary and keeps what was transcribed. Raises TransientJobError (time limit,
    prepared audio gone) or whatever the engine raised; the task decides between a retry
    and the dead-letter store.

    A second message for a job this process is already transcribing (the same message
    delivered twice, or prepared twice) runs nothing: it waits for that run and answers
    with what it stored, so the engine goes through a job once (jobs.engine_runs).
    """
    job_id = prepared.job_id
    with _running_lock:
        running = _running.get(job_id)
        if running is None:
            _running[job_id] = threading.Event()
    if running is not None:
        log.info("job %s: already being transcribed in this worker; this delivery waits for that run", job_id)
        running.wait(rt.settings.time_limit(prepared.duration))
        return get_job(rt, job_id).result() or {"job_id": job_id, "duplicate_of_a_run_in_progress": True}
    try:
        return _infer(rt, prepared, batcher, worker, worker_id)
    finally:
        with _running_lock:
            _running.pop(job_id).set()


def _infer(rt: Runtime, prepared: Prepared, batcher: Batcher, worker: str | None,
           worker_id: str | None) -> dict:
    job_id = prepared.job_id
    done = begin_inference(rt, job_id, worker, worker_id)
    if done is not None:
        log.info("job %s already COMPLETED; duplicate delivery ignored", job_id)
        return done
    duration = prepared.duration
    limit = rt.settings.time_limit(duration)
    futures = []
    try:
        samples = rt.storage.load_samples(prepared.samples_ref)
    except FileNotFoundError as exc:
        raise TransientJobError("the prepared audio is missing; the job will be prepared again") from exc
    windows = prepared.windows
    chunks = [(w.samples(samples), w.time_map()) for w in windows]
    try:
        language = prepared.language
        if chunks:
            language = rt.engine.language_of(chunks[0][0], language)
        language = language or "en"
        # Windows share a batch only when they are decoded the same way.
        key = (language,) + prepared.decoding
        futures = batcher.submit(key, chunks, priority=prepared.priority, job_id=job_id)
        deadline = time.monotonic() + limit
        segments = []
        for n, fut in enumerate(futures):
            segments.extend(fut.result(timeout=max(0.0, deadline - time.monotonic())))
            done_seconds = windows[n].end / SAMPLE_RATE
            if record_progress(rt, job_id, done_seconds) and n + 1 < len(futures):
                batcher.cancel(futures[n + 1:])
                partial = Transcript.from_segments(segments, language, duration)
                result = cancel_running(rt, job_id, partial.to_dict())
                rt.storage.delete(prepared.samples_ref)
                log.info("job %s: cancelled after %.1f of %.1f s; partial transcript kept", job_id, done_seconds, duration)
                return result
    except FutureTimeout:
        batcher.cancel(futures)
        raise JobTimeLimitExceeded(f"the job passed its time limit of {limit:.0f} s") from None
    except BaseException:
        batcher.cancel(futures)
        raise
    transcript = Transcript.from_segments(segments, language, duration)
    count_engine_run(rt, job_id)
    result, stored = complete_job(rt, job_id, transcript.to_dict())
    rt.storage.delete(prepared.samples_ref)
    if stored:
        log.info("job %s: transcript stored (%.1f s of audio, %d windows)", job_id, duration, len(futures))
    else:
        log.info("job %s: transcript already stored by another delivery; kept that one", job_id)
    return result
