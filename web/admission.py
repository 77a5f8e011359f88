"""The web's part of admission: the per-client rate (by key, else address) and, before a body
is read, what the one door (models.pipeline.door) can refuse without it. Everything after
the body is the door's."""
from __future__ import annotations

import logging

from flask import current_app, g, request

from models.access.admission import RateLimited, rate_limiter
from models.pipeline.door import check_before_body

log = logging.getLogger(__name__)

_UNSET = object()


def client_key() -> str:
    """Who is asking: the API key when there is one, else the address. A bearer that is no
    key (anonymous use ignores it) earns no bucket of its own: a new random one per
    request would otherwise be a fresh rate limit each time."""
    found = g.get("principal")
    if found is not None and found.owner is not None:
        return "key:" + found.owner
    return "addr:" + (request.remote_addr or "unknown")


def _rate() -> str | None:
    """The key's tier sets its rate (WHISPERQ_RATE_LIMIT_<TIER>); anonymous use has
    WHISPERQ_RATE_LIMIT."""
    settings = current_app.extensions["whisperq"].settings
    found = g.get("principal")
    if found is not None and found.tier is not None:
        return getattr(settings, f"rate_limit_{found.tier}")
    return settings.rate_limit


def _limiter():
    rate = _rate()
    limiters = current_app.extensions.setdefault("ratelimiters", {})
    limiter = limiters.get(rate, _UNSET)
    if limiter is _UNSET:
        limiter = limiters[rate] = rate_limiter(current_app.extensions["whisperq"].settings, rate)
    return limiter


def admit_submission() -> None:
    """Before the body is read: the client's rate here, then what the one door refuses before
    any body (models.pipeline.door.check_before_body: disk floor, queue budget, spent quota)."""
    rt = current_app.extensions["whisperq"]
    limiter = _limiter()
    if limiter is not None:
        try:
            g.ratelimit_headers = limiter.hit(client_key())
        except RateLimited:
            raise
        except Exception as exc:  # Redis away: serve rather than refuse everyone
            log.warning("rate limit not checked: %s", exc)
    check_before_body(rt, g.principal, idempotent=request.headers.get("Idempotency-Key") is not None)


def add_rate_headers(response):
    headers = getattr(g, "ratelimit_headers", None)
    if headers:
        response.headers.update(headers)
    return response
