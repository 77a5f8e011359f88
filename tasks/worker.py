"""Worker entry point: `celery -A tasks.worker worker`."""
from celery.signals import worker_process_init
from celery.worker.control import inspect_command

from models.inference import batcher_stats
from models.runtime import reset_runtime
from tasks import celery_app as app  # noqa: F401 - Celery finds `app`


@worker_process_init.connect
def _fresh_connections(**_kwargs) -> None:
    # A forked child must not share the parent's database connections.
    reset_runtime()


@inspect_command(name="batcher_stats")
def _batcher_stats(state, **_kwargs) -> dict:
    """`celery inspect batcher_stats`: batch sizes and waits of an inference worker."""
    return batcher_stats()
