"""`whisperq.analyze` (analysis pool): one analysis of one job, after its transcript is stored
(models.jobs.analyses). It retries on its own with the jobs' backoff and attempts, and fails
alone: a failure for good leaves the job's transcript delivered, with why the analysis failed.
"""

from __future__ import annotations

import logging

from celery import Task, shared_task, states
from celery.exceptions import Reject

from models.analysis import MODULES
from models.errors import JobCancelled, PermanentJobError, WhisperqError
from models.jobs.analyses import fail_analysis, run_analysis
from models.jobs.record import AnalysisStatus, Job, JobAnalysis, JobStatus
from models.pipeline.door import keeps_result
from models.retry import Verdict, classify
from tasks.app import runtime
from tasks.broker.signing import check

log = logging.getLogger(__name__)


@shared_task(name="whisperq.analyze", bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def analyze(self, job_id: str, name: str) -> None:
    check(self)  # only the inference pool's hand-off (or the sweeper's), on the analysis pool
    if not isinstance(job_id, str) or not isinstance(name, str) or name not in MODULES:
        raise Reject(f"an analysis message for {name!r} of job {job_id!r} was dropped: no such analysis", requeue=False)
    rt = runtime()
    try:
        outcome = run_analysis(rt, job_id, name)
    except Exception as exc:
        reason = str(exc) if isinstance(exc, WhisperqError) else f"{type(exc).__name__}: {exc}"
        with rt.db.session() as session:
            run = session.get(JobAnalysis, (job_id, name))
            attempts = run.attempts if run is not None else 0
            pending = run is not None and run.status == AnalysisStatus.RUNNING.value
        if not pending:
            return
        if classify(exc) is Verdict.PERMANENT or rt.job_retries.exhausted(attempts):
            log.warning("job %s: analysis %s failed after %d attempt(s)", job_id, name, attempts, exc_info=True)
            fail_analysis(rt, job_id, name, reason)
            _deliver(self, rt, job_id)
            return
        delay = rt.job_retries.backoff(attempts)
        log.warning(
            "job %s: analysis %s failed (%s); attempt %d again in %.0f s", job_id, name, reason, attempts + 1, delay
        )
        raise self.retry(countdown=delay, max_retries=None) from exc
    log.info("job %s: analysis %s %s", job_id, name, outcome)
    _deliver(self, rt, job_id)


def _deliver(task: Task, rt, job_id: str) -> None:
    """A transcribe.delay() job that is finished: its end to the result backend under the job's
    id, where its caller's r.get() waits (the inference task stored nothing for it): the merged
    result once COMPLETED, the reason once cancelled or failed. Stored again by a later
    analysis's message, the same."""
    with rt.db.session() as session:
        job = session.get(Job, job_id)
        if job is None or not keeps_result(job) or not job.state.finished:
            return
        if job.state is JobStatus.COMPLETED:
            task.backend.store_result(job_id, job.result(), states.SUCCESS)
            return
        why = job.error or f"the job is {job.status}"
        error = JobCancelled(why) if job.state is JobStatus.CANCELLED else PermanentJobError(why)
    task.backend.mark_as_failure(job_id, error)
