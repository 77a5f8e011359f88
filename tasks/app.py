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
from models.runtime import Runtime, get_runtime

_app: Celery | None = None
_lock = threading.Lock()


def celery_for(settings: Settings) -> Celery:
    """A Celery app configured for these settings, with no effect on the process."""
    app = Celery("whisperq", set_as_current=False)
    app.config_from_object(celery_config(settings))
    app.conf.whisperq_settings = settings
    from tasks.broker.transport import transport_class

    special = transport_class(app.conf.broker_url).celery_transport()  # SQS: models.compat's channel
    if special is not None:
        app.conf.broker_transport = special
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
    """A worker's (or a transcribe.delay() caller's) runtime, from the environment, publishing
    through this process's app."""
    rt = get_runtime()
    if rt.broker is None:
        from tasks.broker import CeleryBroker

        rt.broker = CeleryBroker()  # this process's app, whenever it is built
    return rt


def start_process(settings: Settings, *, broker_now: bool = True) -> Runtime:
    """The one place a process that is not a worker builds what it runs on: its Celery app
    (this process's, init_celery) and its runtime over the same settings, publishing through
    that app, its tables upgraded. The web (web.create_app, and with it the gRPC door and the
    MQTT bridge) and the command line start here; workers get theirs from `runtime()`.
    `broker_now=False` (the command line): the app is built on the first message, so a
    command that sends none needs no broker configured."""
    from tasks.broker import CeleryBroker

    rt = Runtime(settings, broker=CeleryBroker(init_celery(settings) if broker_now else None))
    rt.db.upgrade()
    return rt
