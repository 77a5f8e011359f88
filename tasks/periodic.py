"""Beat's periodic tasks, on the preparation queue: `whisperq.sweep` (every
WHISPERQ_SWEEP_INTERVAL: stuck, orphaned and expired jobs; see models.jobs.sweeper) and
`whisperq.retention` (every WHISPERQ_RETENTION_INTERVAL: delete what ended jobs no longer need
once their retention has passed; see models.maintenance.retention)."""

from __future__ import annotations

from celery import shared_task

from models.maintenance.retention import run_retention
from tasks.app import runtime
from tasks.broker.signing import check


@shared_task(name="whisperq.sweep", bind=True, ignore_result=True)
def sweep(self) -> dict:
    """Beat's periodic pass over stuck, orphaned and expired jobs (see models.jobs.sweeper)."""
    from .broker import run_sweep

    check(self)  # beat's, signed: no producer runs a pass
    report = run_sweep(self.app)
    return {k: (len(v) if isinstance(v, list) else v) for k, v in vars(report).items()}


@shared_task(name="whisperq.retention", bind=True, ignore_result=True)
def retention(self) -> dict:
    check(self)  # beat's, signed: no producer deletes anything
    return run_retention(runtime())
