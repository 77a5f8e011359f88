"""The web's part of admission: the per-client rate (by key, else address) and, before a body
is read, what the one door (models.pipeline.door) can refuse without it. Everything after
the body is the door's."""

from __future__ import annotations

from flask import current_app, g, request

from models.access.admission import check_rate
from models.pipeline.door import check_before_body


def client_key() -> str:
    """Who is asking: the API key when there is one, else the address. A bearer that is no
    key (anonymous use ignores it) earns no bucket of its own: a new random one per
    request would otherwise be a fresh rate limit each time."""
    found = g.get("principal")
    if found is not None and found.owner is not None:
        return "key:" + found.owner
    return "addr:" + (request.remote_addr or "unknown")


def admit_submission() -> None:
    """Before the body is read: the client's rate here, then what the one door refuses before
    any body (models.pipeline.door.check_before_body: disk floor, queue budget, spent quota)."""
    rt = current_app.extensions["whisperq"]
    g.ratelimit_headers = check_rate(rt.settings, g.principal.tier, client_key())
    check_before_body(rt, g.principal, idempotent=request.headers.get("Idempotency-Key") is not None)


def add_rate_headers(response):
    headers = getattr(g, "ratelimit_headers", None)
    if headers:
        response.headers.update(headers)
    return response
