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
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from models.errors import ClaimLost, JobCancelled, JobTimeLimitExceeded, TransientJobError
from models.jobs import ledger
from models.jobs.analyses import needs_audio
from models.jobs.claims import Claim, holder_id, kept, release_claim
from models.jobs.metrics import observe_batch
from models.jobs.operations import begin_inference, cancel_running, complete_job, get_job, record_progress
from models.jobs.record import Stage
from models.jobs.throughput import metered
from models.pipeline.messages import Prepared
from models.speech.audio import SAMPLE_RATE
from models.speech.batching import Batcher
from models.speech.engines import batch_size, parallel_batches
from models.speech.segments import Segment, Transcript

if TYPE_CHECKING:
    from collections.abc import Sequence

    from models.runtime import Runtime
    from models.speech.windows import Window

log = logging.getLogger(__name__)


def build_batcher(rt: Runtime, model: str | None = None) -> Batcher:
    """A model's batcher in this process (Runtime.batcher_for); the model loads in its thread
    on the first batch."""
    settings = rt.settings

    def run_batch(key: Any, payloads: list[Any]) -> Any:
        # The engine is the one the windows' jobs began on (a hot swap: models.registry.swaps).
        language, task, words, prompt, temperature, hotwords, engine = key
        # Passed only when asked for: an engine without them still serves the rest.
        extra = {k: v for k, v in (("prompt", prompt), ("temperature", temperature), ("hotwords", hotwords)) if v}
        return engine.transcribe_batch(
            [p[0] for p in payloads], [p[1] for p in payloads], language, task, word_timestamps=words, **extra
        )

    measured = metered(
        run_batch, model or settings.default_model, parallel_batches(settings), batch_size(settings), SAMPLE_RATE
    )
    return Batcher(
        measured,
        max_batch=batch_size(settings),
        max_wait=settings.batch_wait_ms / 1000,
        on_batch=observe_batch,
        parallel=parallel_batches(settings),
    )


def batcher_stats(rt: Runtime) -> dict[str, Any]:
    """The batchers' figures (one batcher per model this process serves), taken together."""
    batchers = rt.built("batcher")
    if len(batchers) == 1:
        stats: dict[str, Any] = batchers[0].stats()
        return stats
    out: dict[str, Any] = {"batches": 0, "windows": 0, "pending": 0, "recent_sizes": [], "running_jobs": []}
    for batcher in batchers:
        stats = batcher.stats()
        for key in ("batches", "windows", "pending", "recent_sizes", "running_jobs"):
            out[key] += stats[key]
    return out


# Jobs this process is transcribing now, each with an event set when its run ends.
_running: dict[str, threading.Event] = {}
_running_lock = threading.Lock()


def infer_job(
    rt: Runtime, prepared: Prepared, batcher: Batcher, worker: str | None = None, worker_id: str | None = None
) -> dict[str, Any] | None:
    """Transcribe a prepared job through the batcher and store its transcript, once.

    Progress is recorded window by window; a cancel takes effect at the next window
    boundary and keeps what was transcribed. Raises TransientJobError (time limit,
    prepared audio gone) or whatever the engine raised; the task decides between a retry
    and the dead-letter store.

    A second message for a job this process is already transcribing (the same message
    delivered twice, or prepared twice) runs nothing: it waits for that run and answers
    with what it stored, so the engine goes through a job once (jobs.engine_runs). One that
    another process is transcribing raises ClaimHeld before anything runs (models.jobs.claims);
    a run whose claim another process took over raises ClaimLost, its transcript discarded.
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


def _infer(
    rt: Runtime, prepared: Prepared, batcher: Batcher, worker: str | None, worker_id: str | None
) -> dict[str, Any] | None:
    job_id = prepared.job_id
    claim, done = begin_inference(rt, job_id, worker, worker_id, holder_id(), rt.settings.claim_lease_seconds)
    try:
        if done is not None:
            log.info("job %s already COMPLETED; duplicate delivery ignored", job_id)
            return done
        with kept(rt, claim, rt.settings.time_limit(prepared.duration)):
            return _transcribe(rt, prepared, batcher, claim, worker)
    finally:
        release_claim(rt, claim)


def _transcribe(
    rt: Runtime, prepared: Prepared, batcher: Batcher, claim: Claim, worker: str | None = None
) -> dict[str, Any] | None:
    """The engine's pass over the job's windows, recorded in the engine ledger as it starts
    and as it ends, however it ends (models.jobs.ledger); a killed process leaves it unended."""
    try:
        samples = rt.storage.load_samples(prepared.samples_ref)
    except FileNotFoundError as exc:
        raise TransientJobError("the prepared audio is missing; the job will be prepared again") from exc
    model = rt.settings.model(prepared.model).name
    pass_id = ledger.begin(
        rt,
        prepared.job_id,
        windows=len(prepared.windows),
        audio_seconds=prepared.duration,
        model=model,
        worker=worker,
        claim_token=claim.token,
    )
    outcome, detail = ledger.FAILED, ""
    try:
        result, outcome = _pass(rt, prepared, batcher, claim, samples)
        detail = "" if outcome != ledger.DISCARDED else "the job's transcript was stored by another pass"
        return result
    except ClaimLost as exc:
        outcome, detail = ledger.DISCARDED, str(exc)
        raise
    except JobCancelled as exc:
        outcome, detail = ledger.CANCELLED, str(exc)
        raise
    except BaseException as exc:
        detail = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        ledger.end(rt, pass_id, outcome, detail, model)


def _pass(
    rt: Runtime, prepared: Prepared, batcher: Batcher, claim: Claim, samples: Any
) -> tuple[dict[str, Any] | None, str]:
    """Transcribe and store: (the result, how the pass ended: stored, discarded or cancelled)."""
    job_id = prepared.job_id
    duration = prepared.duration
    limit = rt.settings.time_limit(duration)
    futures: list[Any] = []
    windows = prepared.windows
    chunks = [(w.samples(samples), w.time_map()) for w in windows]
    engine = rt.engine_for(prepared.model)
    try:
        languages, sureness = window_languages(engine, [c[0] for c in chunks], prepared.language)
        language = _main_language(languages, windows) or "en"
        language_probability = _main_probability(languages, sureness, language)
        futures = [None] * len(chunks)  # each filled below: a Future per window
        for lang in dict.fromkeys(languages):  # windows share a batch only when decoded the same way
            mine = [n for n, found in enumerate(languages) if found == lang]
            submitted = batcher.submit(
                (lang, *prepared.decoding, engine), [chunks[n] for n in mine], priority=prepared.priority, job_id=job_id
            )
            for n, future in zip(mine, submitted, strict=True):
                futures[n] = future
        detected = prepared.language is None and getattr(engine, "multilingual", False)
        deadline = time.monotonic() + limit
        segments: list[Segment] = []
        for n, fut in enumerate(futures):
            found = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            segments.extend([replace(s, language=languages[n]) for s in found] if detected else found)
            done_seconds = windows[n].end / SAMPLE_RATE
            if claim.lost.is_set():  # taken over: what is left of this run would be discarded
                log.warning(
                    "job %s: this run's claim (token %d, %s) was taken over after its lease lapsed; it stops "
                    "here and its transcript is discarded, not stored",
                    job_id,
                    claim.token,
                    claim.holder,
                )
                raise ClaimLost(f"job {job_id}: the claim was taken over by another worker; this run stops")
            if record_progress(rt, job_id, done_seconds) and n + 1 < len(futures):
                batcher.cancel(futures[n + 1 :])
                partial = Transcript.from_segments(segments, language, duration)
                result = cancel_running(rt, job_id, dict(partial.to_dict(), model=made_by(rt, prepared, engine)), claim)
                rt.storage.delete(prepared.samples_ref)
                log.info(
                    "job %s: cancelled after %.1f of %.1f s; partial transcript kept", job_id, done_seconds, duration
                )
                return result, ledger.CANCELLED
    except FutureTimeout:
        batcher.cancel(futures)
        raise JobTimeLimitExceeded(f"the job passed its time limit of {limit:.0f} s") from None
    except BaseException:
        batcher.cancel(futures)
        raise
    transcript = Transcript.from_segments(segments, language, duration, language_probability)
    result, stored = complete_job(rt, job_id, dict(transcript.to_dict(), model=made_by(rt, prepared, engine)), claim)
    if result.get("stage") != Stage.ANALYSIS.value or not needs_audio(get_job(rt, job_id)):
        rt.storage.delete(prepared.samples_ref)  # else kept for the analyses that listen to it
    if stored:
        log.info("job %s: transcript stored (%.1f s of audio, %d windows)", job_id, duration, len(futures))
    else:
        log.info("job %s: transcript already stored by another delivery; kept that one", job_id)
    return result, ledger.STORED if stored else ledger.DISCARDED


def window_languages(engine: Any, chunks: Sequence[Any], asked: str | None) -> tuple[list[str], list[float]]:
    """The language of each window and how sure the model is of it: the one asked for (1.0);
    else, on a multilingual model, the one the model hears in that window (a recording may
    change language); else English (1.0)."""
    if asked or not getattr(engine, "multilingual", False):
        return [asked or "en"] * len(chunks), [1.0] * len(chunks)
    found = [engine.detect_language(chunk, None) for chunk in chunks]
    return [lang for lang, _ in found], [prob for _, prob in found]


def _main_probability(languages: list[str], sureness: list[float], language: str) -> float | None:
    """The transcript's language_probability: the mean over the windows heard in its language."""
    probs = [p for lang, p in zip(languages, sureness, strict=True) if lang == language]
    return round(sum(probs) / len(probs), 4) if probs else None


def _main_language(languages: list[str], windows: Sequence[Window]) -> str | None:
    """The language of the most speech, for the transcript's `language`."""
    seconds: dict[str, float] = {}
    for lang, window in zip(languages, windows, strict=True):
        seconds[lang] = seconds.get(lang, 0.0) + window.seconds
    return max(seconds, key=seconds.__getitem__) if seconds else None


def made_by(rt: Runtime, prepared: Prepared, engine: Any) -> dict[str, Any]:
    """What a result records of the model that made it: name, the version of the weights the
    engine loaded, engine, decoding."""
    spec = rt.settings.model(prepared.model)
    return {
        "name": spec.name,
        "version": getattr(engine, "version", None),
        "engine": spec.engine,
        "device": getattr(engine, "device", None),
        "compute_type": getattr(engine, "compute_type", None),
        "beam_size": spec.beam_size,
        "task": prepared.task,
        "temperature": prepared.temperature,
    }
