"""Configuration: one Settings object from the environment, checked once at start, and what is
built from it. Imports nothing of ``models``, ``tasks`` or ``web``.

- ``settings`` - the Settings object; each setting declared once (``declare``), read typed
  (``env``), checked across values (``checks``), listed in the generated reference
  (``reference``). Parts it reads: ``registry`` (the models served, aliases and shadows:
  parsing only; the rest of the registry is ``models.registry``), ``keys`` (encryption keys),
  ``secrets``, ``allow`` (outbound allow-lists), ``priorities``, ``languages``.
- ``celeryconfig`` - Celery's configuration (queues, routes, priorities); ``embedded`` - the
  embedded Redis broker; ``flower`` - how Flower is started; ``files`` - the data dir's
  private files.
- ``mqtt`` and ``grpc`` - the settings of the optional bridges, read only by them;
  ``logs`` and ``tracing``.
"""

from .celeryconfig import (
    INFERENCE_QUEUE,
    NOTIFY_QUEUE,
    PREPARE_QUEUE,
    broker_priority,
    celery_config,
)
from .env import ConfigError
from .files import private_dir
from .languages import LANGUAGES
from .priorities import PRIORITIES, Priority
from .settings import Settings

__all__ = [
    "INFERENCE_QUEUE",
    "LANGUAGES",
    "NOTIFY_QUEUE",
    "PREPARE_QUEUE",
    "PRIORITIES",
    "ConfigError",
    "Priority",
    "Settings",
    "broker_priority",
    "celery_config",
    "private_dir",
]
