"""Admission at the front door (see models.access.admission): disk floor, per-client rate, the
queue budget and the key's monthly quota (models.access.quotas), checked before an upload is
read, then again once its priority (and, in web.uploads, its audio's length) is known."""
from __future__ import annotations

import logging

from flask import current_app, g, request

from models.access import quotas
from models.access.admission import Backlog, RateLimited, check_disk, check_queue, rate_limiter

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
    """Before the body is read: refuse when the disk is low, the client is over its rate,
    the queue is past even the high-priority budget, or the key's monthly quota is spent."""
    rt = current_app.extensions["whisperq"]
    check_disk(rt)
    limiter = _limiter()
    if limiter is not None:
        try:
            g.ratelimit_headers = limiter.hit(client_key())
        except RateLimited:
            raise
        except Exception as exc:  # Redis away: serve rather than refuse everyone
            log.warning("rate limit not checked: %s", exc)
    check_queue(rt, "high")
    who = g.get("principal")
    if who is not None and request.headers.get("Idempotency-Key") is None:  # a retry gets its job back, not 429
        quotas.check(rt, who.owner, tier=who.tier)


def admit_priority(priority: str) -> None:
    """Once the priority is known: the key's tier must allow it (403), normal and low may
    not use the high reserve, and a key may not hold more than its share of the queue."""
    from .auth import current

    who = current()
    who.check_priority(priority)
    if priority != "high" or who.owner is not None:
        check_queue(current_app.extensions["whisperq"], priority, owner=who.owner)


def admit_batch(priority: str, seconds: list[float]) -> None:
    """A batch of jobs of `seconds` each (a URL's at WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS until
    its length is known): its priority as for one job, and the queue budget and the key's
    share with all its jobs in. The whole batch gets in, or none of it: where its jobs sent
    one after another, the longest last, would all have got in."""
    from .auth import current

    who = current()
    who.check_priority(priority)
    ahead = Backlog(len(seconds) - 1, sum(seconds) - max(seconds))
    check_queue(current_app.extensions["whisperq"], priority, owner=who.owner, ahead=ahead)


def add_rate_headers(response):
    headers = getattr(g, "ratelimit_headers", None)
    if headers:
        response.headers.update(headers)
    return response
