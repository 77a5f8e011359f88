"""The one Celery app of a process, from one factory: the web (``web.create_app``), the
workers (``celery -A tasks.worker``), the command line and ``transcribe.delay()`` callers all
get theirs from here, as Flask's ``celery_init_app`` pattern does.

``celery_for(settings)`` builds an app and touches nothing else; ``init_celery(settings)``
builds the process's app: the default app that the tasks (declared with ``shared_task``)
bind to. A process that never called it gets one from the environment on first use
(``get_celery()``). ``runtime()`` is the worker's models.runtime.Runtime, whose broker seam
(tasks.broker.CeleryBroker) publishes through the process's app.

Building an app connects to nothing: the broker is contacted on the first publish or when a
worker starts. Without CELERY_BROKER_URL it fails with a message saying how to fix that.
"""

from __future__ import annotations

import threading

from celery import Celery

from config import Settings, celery_config
from config.celeryconfig import is_sqs
from models.runtime import Runtime, get_runtime

_app: Celery | None = None
_lock = threading.Lock()


def celery_for(settings: Settings) -> Celery:
    """A Celery app configured for these settings, with no effect on the process."""
    app = Celery("whisperq", set_as_current=False)
    app.config_from_object(celery_config(settings))
    app.conf.whisperq_settings = settings
    if is_sqs(app.conf.broker_url):
        from models.compat import sqs_transport

        # kombu's SQS transport with the queues asked in order and rejected messages kept
        # (models.compat); the URL stays sqs://, so Celery and kombu treat it as SQS
        app.conf.broker_transport = sqs_transport()
    return app


def init_celery(settings: Settings) -> Celery:
    """Build this process's app: the one the tasks (shared_task) bind to."""
    return use_celery(celery_for(settings))


def use_celery(app: Celery) -> Celery:
    """Make `app` this process's app (init_celery's second half)."""
    global _app
    app.set_default()
    app.set_current()
    _app = app
    return app


def current_celery() -> Celery | None:
    """The process's app if one was built, without building one."""
    return _app


def get_celery() -> Celery:
    """This process's app: the one init_celery built, else one from the environment."""
    if _app is None:
        with _lock:
            if _app is None:
                init_celery(Settings.from_env())
    assert _app is not None
    return _app


def runtime() -> Runtime:
    """This process's runtime (from the environment), publishing through this process's app."""
    rt = get_runtime()
    if rt.broker is None:
        from tasks.broker import CeleryBroker

        rt.broker = CeleryBroker()  # this process's app, whenever it is built
    return rt
