"""The Celery tasks, and the app they run on.

- ``app`` - the process's one Celery app and the worker's runtime; ``broker`` - the runtime's
  broker seam (publishing, queue depths, the sweep); ``worker`` - the worker entry point
  (``celery -A tasks.worker``) and its signals; ``metrics`` - the workers' own metrics.
- ``transcription`` - declares ``whisperq.transcribe`` (preparation pool), ``whisperq.infer``
  (inference pool) and ``whisperq.shadow``; ``analysis`` - ``whisperq.analyze`` (analysis pool:
  speakers, redaction); ``notification`` - ``whisperq.notify`` (webhooks);
  ``periodic`` - beat's ``whisperq.sweep`` and ``whisperq.retention``.

The task modules are named apart from the tasks: ``tasks.transcribe``, ``tasks.infer``,
``tasks.notify`` and ``tasks.retention`` are the tasks themselves (proxies below).
``from tasks import transcribe; transcribe.delay(path)`` works in any process: the task
resolves, on first use, to this process's app (the one ``init_celery`` built, or one from the
environment). Tasks import ``models`` and ``config``, nothing of ``web``."""

from celery.local import Proxy

from . import analysis as _analysis  # noqa: F401 - importing declares the tasks
from . import notification as _notification  # noqa: F401
from . import periodic as _periodic  # noqa: F401
from . import transcription as _transcription  # noqa: F401
from .app import celery_for, get_celery, init_celery


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


__all__ = ["celery_app", "celery_for", "get_celery", "infer", "init_celery", "notify", "retention", "transcribe"]
