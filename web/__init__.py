"""The ways in and the command line. ``app`` is the Flask app factory (``create_app``): the
JSON API (``api``, ``batches``, ``usage``, ``admin``, the OpenAI endpoint ``openai_api``, their
OpenAPI document ``openapi*``), the upload page (``pages``), health checks and metrics; the
request side of the one door (``uploads``, ``admission``, ``auth``) and the caches a poll
reads (``keycache``, ``statuscache``, ``waits``). Beside it: ``cli`` (the `whisperq`
command), ``mqtt`` (the MQTT bridge), ``rpc`` (the gRPC service), ``server`` and ``wsgi``
(gunicorn), ``supervise`` (`whisperq run`'s process manager).

May import config, models and tasks; nothing imports web."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app as create_app


def __getattr__(name: str) -> Any:
    """`from web import create_app`, imported on first use: importing the package (gunicorn's
    master does, for web.server's worker class) loads nothing of the app, so that the gevent
    worker patches ``ssl`` before any client library (botocore, urllib3) imports it."""
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module 'web' has no attribute {name!r}")
