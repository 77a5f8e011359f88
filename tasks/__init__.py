"""The Celery tasks, and the app they run on (tasks.app).

``from tasks import transcribe; transcribe.delay(path)`` works in any process: the task
resolves, on first use, to this process's app (the one ``init_celery`` built, or one from the
environment). Tasks import nothing of ``web``."""
from celery.local import Proxy

from .app import celery_for, get_celery, init_celery
from . import notify as _notify_tasks  # noqa: F401 - importing declares the tasks
from . import retention as _retention_tasks  # noqa: F401
from . import transcribe as _transcribe_tasks  # noqa: F401


def _bound(name: str) -> Proxy:
    return Proxy(lambda: get_celery().tasks[name])


transcribe = _bound("whisperq.transcribe")
infer = _bound("whisperq.infer")
notify = _bound("whisperq.notify")
retention = _bound("whisperq.retention")


def __getattr__(name: str):
    if name == "celery_app":  # the process's app, built on first use
        return get_celery()
    raise AttributeError(f"module 'tasks' has no attribute {name!r}")


__all__ = ["celery_app", "celery_for", "get_celery", "init_celery", "transcribe", "infer", "notify", "retention"]
