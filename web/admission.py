"""The web's part of admission: before a body is read, the one door's gate
(models.pipeline.door.gate: the client's rate by key, else address, the disk floor, the queue,
a spent quota), with the rate limit's headers on the answer. Everything after the body is the
door's too."""

from __future__ import annotations

from flask import current_app, g, request

from models.pipeline.door import client_bucket, gate


def client_key() -> str:
    """Who is asking, for what counts per client (the rate, held polls): the API key when there
    is one, else the address."""
    return client_bucket(g.principal, request.remote_addr or "unknown")


def admit_submission(namespace: str) -> None:
    """Before the body is read: the door's gate for this request (`namespace`: its door, whose
    Idempotency-Key it is)."""
    rt = current_app.extensions["whisperq"]
    g.ratelimit_headers = gate(
        rt, g.principal, request.remote_addr or "unknown", namespace, request.headers.get("Idempotency-Key")
    )


def add_rate_headers(response):
    headers = getattr(g, "ratelimit_headers", None)
    if headers:
        response.headers.update(headers)
    return response
