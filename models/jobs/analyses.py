"""Each analysis (models.analysis) a job asked for, run once after its transcript is stored (a JobAnalysis row).

An analysis that hides what the transcript said (redaction: `HIDES`) is the exception: it runs
where the transcript is stored, before it is (`hide_before_storing`), for a partial transcript
(a cancel mid-job) too, so the words it hides are never stored; where it fails, the job fails
and keeps no text. Its row is DONE from the start, and the analysis pool never runs it.

The inference pool stores the transcript of a job that asked for analyses without finishing
the job (stage `analysis`), makes a PENDING row per analysis and publishes one
`whisperq.analyze` message each (tasks.analysis). The analysis pool runs one: RUNNING, the
module's `run`, then its output stored under the row's lock, once: a second delivery (a
killed worker's message handed out again) finds it DONE and does nothing. A failure for good
marks it FAILED with why. When every analysis of the job is DONE or FAILED, the outputs are
merged into the stored transcript (models.analysis.merged: redaction replaces what it hides,
so the original is not kept), the prepared audio kept for them is deleted, and the job is
COMPLETED: its webhook and its batch see it then.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from models.analysis import analysis, hides, merged
from models.errors import PermanentJobError
from models.jobs import metrics
from models.jobs.record import AnalysisStatus, Job, JobAnalysis, JobStatus, Stage, utcnow
from models.storage import prepared_ref

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from models.runtime import Runtime

log = logging.getLogger(__name__)

# A PENDING analysis whose message was not taken in this long, or a RUNNING one past this
# (with no worker left to finish it), is published again by the sweeper.
STALE = timedelta(minutes=10)


def begin_analyses(job: Job) -> list[str]:
    """Rows for the analyses `job` asked for (in its session; the transcript is stored): the
    names to publish."""
    have = {run.name for run in job.analysis_runs}
    now = utcnow()
    for name, params in (job.analyses or {}).items():
        if name not in have:
            job.analysis_runs.append(
                JobAnalysis(job_id=job.id, name=name, params=params, status=AnalysisStatus.PENDING.value, queued_at=now)
            )
    job.stage = Stage.ANALYSIS.value
    return [run.name for run in job.analysis_runs if not run.finished]


# What a transcript is, as the engine gives it; what an analysis adds beside it goes to result_extra.
TRANSCRIPT = ("text", "language", "duration", "segments", "model", "language_probability")


def hide_before_storing(job: Job, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`data` (a transcript about to be stored, whole or partial) with every analysis of `job`
    that hides (redaction) applied, each one's row DONE with its output (in the job's session,
    locked by the caller); and what they add beside the transcript (its `redacted` counts).
    Raises PermanentJobError where one fails: the caller stores no text at all."""
    extra: dict[str, Any] = {}
    for name in hides(job.analyses):
        module, params = analysis(name), dict((job.analyses or {})[name] or {})
        started = time.perf_counter()
        try:
            output = module.run(data, params, None)
            data = module.apply(data, output, params)
        except Exception as exc:
            log.warning("job %s: %s failed before the transcript was stored; none is kept", job.id, name, exc_info=True)
            raise PermanentJobError(
                f"{name} failed ({type(exc).__name__}: {str(exc)[:200]}); no transcript was kept, since a job that "
                f"asks for {name} keeps no text it could not {name}"
            ) from None
        run = next((r for r in job.runs() if r.name == name), None)
        if run is None:
            run = JobAnalysis(job_id=job.id, name=name, params=params, queued_at=utcnow())
            job.analysis_runs.append(run)
        run.status, run.output, run.version, run.error = AnalysisStatus.DONE.value, output, module.VERSION, None
        run.started_at, run.finished_at = run.started_at or utcnow(), utcnow()
        run.seconds, run.attempts, run.runs = (
            time.perf_counter() - started,
            (run.attempts or 0) + 1,
            (run.runs or 0) + 1,
        )
        extra.update({k: v for k, v in data.items() if k not in TRANSCRIPT})
    return data, extra


def needs_audio(job: Job) -> bool:
    """Whether an analysis the job asked for reads its audio (the prepared samples are kept)."""
    return any(analysis(name).NEEDS_AUDIO for name in job.analyses or {})


def _locked(session: Session, job_id: str, name: str) -> tuple[Job | None, JobAnalysis | None]:
    job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
    run = session.get(JobAnalysis, (job_id, name)) if job is not None else None
    return job, run


def _transcript(job: Job) -> dict[str, Any]:
    return {
        "text": job.result_text or "",
        "language": job.result_language,
        "duration": job.audio_duration,
        "segments": list(job.result_segments or []),
    }


def run_analysis(rt: Runtime, job_id: str, name: str) -> str:
    """Run one analysis of one job, once; returns what happened (for the log): "done",
    "skipped" (nothing to do: done already, or the job moved on), or raises what the module
    raised (the task decides between a retry and FAILED)."""
    module = analysis(name)
    with rt.db.session(write=True) as session:
        job, run = _locked(session, job_id, name)
        if job is None or run is None or run.finished:
            return "skipped"
        if job.state is not JobStatus.PROCESSING or job.stage != Stage.ANALYSIS.value:
            return "skipped"
        run.status = AnalysisStatus.RUNNING.value
        run.started_at = utcnow()
        run.attempts += 1
        transcript, params = _transcript(job), dict(run.params or {})
    samples = None
    if module.NEEDS_AUDIO:
        try:
            samples = rt.storage.load_samples(prepared_ref(job_id))
        except FileNotFoundError:
            raise PermanentJobError(f"{name}: the job's prepared audio is gone; re-run the job to analyse it") from None
    started = time.perf_counter()
    output = module.run(transcript, params, samples)
    seconds = time.perf_counter() - started
    with rt.db.session(write=True) as session:
        job, run = _locked(session, job_id, name)
        if job is None or run is None or run.status == AnalysisStatus.DONE.value:
            return "skipped"
        run.status, run.output, run.version = AnalysisStatus.DONE.value, output, module.VERSION
        run.error, run.finished_at, run.seconds = None, utcnow(), seconds
        run.runs += 1
        _finish_if_done(rt, session, job)
    metrics.observe_analysis(name, AnalysisStatus.DONE.value, seconds)
    log.info("job %s: analysis %s done in %.2f s", job_id, name, seconds)
    return "done"


def fail_analysis(rt: Runtime, job_id: str, name: str, reason: str) -> None:
    """The analysis failed for good: the job goes on without it (its transcript delivered)."""
    with rt.db.session(write=True) as session:
        job, run = _locked(session, job_id, name)
        if job is None or run is None or run.finished:
            return
        run.status, run.error, run.finished_at = AnalysisStatus.FAILED.value, reason, utcnow()
        _finish_if_done(rt, session, job)
    metrics.observe_analysis(name, AnalysisStatus.FAILED.value)
    log.warning("job %s: analysis %s failed: %s", job_id, name, reason)


def _finish_if_done(rt: Runtime, session: Session, job: Job) -> None:
    session.flush()
    session.refresh(job, ["analysis_runs"])
    if job.state is not JobStatus.PROCESSING or job.stage != Stage.ANALYSIS.value:
        return
    if not all(run.finished for run in job.analysis_runs):
        return
    hidden = set(hides(job.analyses))  # applied before the transcript was stored: in it already
    done = {
        run.name: (run.params or {}, run.output or {})
        for run in job.analysis_runs
        if run.status == "DONE" and run.name not in hidden
    }
    out = merged(_transcript(job), done)
    job.replace_transcript(out["text"], out["segments"])
    added = {k: v for k, v in out.items() if k not in ("text", "language", "duration", "segments")}
    job.result_extra = {**(job.result_extra or {}), **added} or None
    if needs_audio(job):
        rt.storage.delete(prepared_ref(job.id))
    job.finish()


def stale_analyses(rt: Runtime) -> list[tuple[str, str, str, float | None]]:
    """(job id, analysis, priority, audio seconds) of each analysis whose message seems lost:
    PENDING or RUNNING for longer than STALE plus its time limit, its job still waiting for it."""
    now = utcnow()
    out = []
    with rt.db.session() as session:
        rows = session.execute(
            select(JobAnalysis, Job)
            .join(Job, Job.id == JobAnalysis.job_id)
            .where(
                JobAnalysis.status.in_([AnalysisStatus.PENDING.value, AnalysisStatus.RUNNING.value]),
                Job.status == JobStatus.PROCESSING.value,
                Job.stage == Stage.ANALYSIS.value,
            )
        ).all()
        for run, job in rows:
            since = run.started_at or run.queued_at or now
            if since < now - STALE - timedelta(seconds=rt.settings.analysis_time_limit(job.audio_duration)):
                out.append((job.id, run.name, job.priority, job.audio_duration))
    return out


def touch(rt: Runtime, job_id: str, name: str) -> None:
    """The sweeper published the analysis again: it counts as queued from now."""
    with rt.db.session(write=True) as session:
        run = session.get(JobAnalysis, (job_id, name))
        if run is not None and not run.finished:
            run.queued_at, run.started_at = utcnow(), None
