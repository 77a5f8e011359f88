"""The Celery app and the tasks. Tasks import no web code."""
from .app import celery_app
from .notify import notify
from .retention import retention
from .transcribe import infer, transcribe

__all__ = ["celery_app", "transcribe", "infer", "notify", "retention"]
