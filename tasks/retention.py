"""`whisperq.retention` (beat, every WHISPERQ_RETENTION_INTERVAL): delete what ended jobs
no longer need once their retention has passed (see models.maintenance.retention)."""
from __future__ import annotations

from celery import shared_task

from models.maintenance.retention import run_retention
from tasks.app import runtime


@shared_task(name="whisperq.retention", bind=True, ignore_result=True)
def retention(self) -> dict:
    return run_retention(runtime())
