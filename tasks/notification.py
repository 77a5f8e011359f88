"""`whisperq.notify` (notification pool): deliver one completion webhook (see models.delivery.notify)."""

from __future__ import annotations

from celery import shared_task

from models.delivery.notify import deliver_pending
from tasks.app import runtime
from tasks.broker.signing import check


def transcript_url(settings, job_id: str) -> str:
    return f"{settings.base_url()}/v1/jobs/{job_id}/transcript?format=json"


@shared_task(name="whisperq.notify", bind=True, acks_late=True, ignore_result=True, max_retries=None)
def notify(self, delivery_id: str) -> None:
    check(self)  # only the service's own deliveries, on the notify pool
    rt = runtime()
    delay = deliver_pending(rt, delivery_id, lambda job_id: transcript_url(rt.settings, job_id))
    if delay is not None:
        # The next attempt is another message, due after the backoff.
        raise self.retry(countdown=delay)
