"""Configuration: one Settings object from the environment, and Celery's configuration."""
from .celeryconfig import (
    INFERENCE_QUEUE,
    NOTIFY_QUEUE,
    PREPARE_QUEUE,
    broker_priority,
    celery_config,
)
from .languages import LANGUAGES
from .priorities import PRIORITIES, Priority
from .files import private_dir
from .env import ConfigError
from .settings import Settings

__all__ = [
    "Settings", "ConfigError", "PRIORITIES", "Priority", "LANGUAGES", "private_dir", "celery_config", "broker_priority",
    "PREPARE_QUEUE", "INFERENCE_QUEUE", "NOTIFY_QUEUE",
]
