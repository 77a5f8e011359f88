"""Worker entry point: `celery -A tasks.worker worker`."""
from celery.signals import worker_process_init

from models.runtime import reset_runtime
from tasks import celery_app as app  # noqa: F401 - Celery finds `app`


@worker_process_init.connect
def _fresh_connections(**_kwargs) -> None:
    # A forked child must not share the parent's database connections.
    reset_runtime()
