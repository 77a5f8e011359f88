"""Who owns an MQTT request's job, and submitting it through the API's own code: web.admission
(disk floor, rate, queue budget, quota, the tier's priorities) and web.uploads (submit_url and
submit_path: the same checks, the same job row, the same publish), in a request context of
the bridge's own app, as POST /v1/jobs runs them.

Ownership: WHISPERQ_MQTT_CLIENTS maps a client's name to an API key (`*` for any other
client); its jobs are that key's, with its tier, rate limit, queue share and webhook secret.
A client with no key acts anonymously where WHISPERQ_ALLOW_ANONYMOUS is on, else is refused.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from flask import Flask, g
from sqlalchemy.exc import InterfaceError, OperationalError

from config import ConfigError
from config.mqtt import MqttSettings
from models.access.apikeys import Principal, find_key, principal_for_key_id
from models.delivery.mqtt_replies import request_id
from models.errors import BrokerUnavailable, WhisperqError
from models.jobs.idempotency import KEEP, IdempotencyKey
from models.jobs.record import Job, utcnow
from models.runtime import Runtime

from ..admission import admit_priority, admit_submission
from ..auth import anonymous
from ..uploads import submit_path, submit_url
from .requests import Refused, Request

# What passes by itself: the request is kept (not acknowledged) and tried again.
TRANSIENT = (BrokerUnavailable, OperationalError, InterfaceError, ConnectionError, TimeoutError)


def resolve_keys(rt: Runtime, mq: MqttSettings) -> dict[str, str]:
    """Each configured client's API key id (WHISPERQ_MQTT_CLIENTS names a key by its id or its
    start, as `whisperq keys list` shows them); a key that is not there stops the bridge."""
    out = {}
    for name, ident in mq.clients:
        try:
            key = find_key(rt, ident)
        except WhisperqError as exc:
            raise ConfigError(f"WHISPERQ_MQTT_CLIENTS: {name}={ident}: {exc}") from None
        if key.revoked_at is not None:
            raise ConfigError(f"WHISPERQ_MQTT_CLIENTS: {name}={ident}: that key ({key.name}) is revoked; name another")
        out[name] = key.id
    return out


def principal_for(rt: Runtime, keys: dict[str, str], req: Request) -> Principal:
    """Whom the request acts for: its client's key (checked again now: it may have been revoked)."""
    key_id = keys.get(req.client, keys.get("*"))
    if key_id is None:
        if rt.settings.allow_anonymous:
            return anonymous(rt.settings)
        raise Refused("unauthorized", f"the MQTT client {req.client!r} has no API key on this service; an operator maps "
                      f"it to one in WHISPERQ_MQTT_CLIENTS ({req.client}=KEY_ID)", req.reply_topic, req.correlation_id)
    found = principal_for_key_id(rt, key_id)
    if found is None:
        raise Refused("unauthorized", f"the API key of the MQTT client {req.client!r} was revoked; an operator maps it to "
                      "another in WHISPERQ_MQTT_CLIENTS", req.reply_topic, req.correlation_id)
    return found


@contextmanager
def request_context(app: Flask, client: str | None = None, method: str = "GET") -> Iterator[None]:
    """A request context of the bridge's app: for the API's own functions (admission reads the
    principal and the client's address from it, job_body builds its URLs with it)."""
    rt = app.extensions["whisperq"]
    with app.test_request_context("/v1/jobs", method=method, base_url=rt.settings.base_url(),
                                  environ_base={"REMOTE_ADDR": f"mqtt:{client}" if client else "mqtt"}):
        yield


def idempotency_key(req: Request) -> str:
    """The API's idempotency key for a request: its client's and correlation id's."""
    return "mqtt:" + request_id(req.client, req.correlation_id)


def submit(app: Flask, req: Request, who: Principal) -> tuple[Job, bool]:
    """The request's job (new, or the one made when it came before); Refused for what the API
    would answer with a 4xx (or 429/503 with a time to come back); TRANSIENT errors pass up."""
    rt, celery = app.extensions["whisperq"], app.extensions["celery"]
    key = idempotency_key(req)
    door = submit_url if req.source == "audio_url" else submit_path
    try:
        with request_context(app, req.client, method="POST"):
            g.principal = who
            seen = _seen(rt, key)
            if not seen:  # a request seen before gets its job back, whatever the queue holds now
                admit_submission()
            return door(rt, celery, req.body, idempotency_key=key, admit=None if seen else admit_priority,
                        owner=who.owner, default_priority=who.default_priority())
    except TRANSIENT:
        raise
    except WhisperqError as exc:
        retry_after = getattr(exc, "retry_after", None) or (5 if exc.http_status == 503 else None)
        raise Refused(exc.code, str(exc), req.reply_topic, req.correlation_id,
                      int(retry_after) if retry_after is not None else None) from None


def _seen(rt: Runtime, key: str) -> bool:
    with rt.db.session() as session:
        row = session.get(IdempotencyKey, key)
        return row is not None and row.created_at >= utcnow() - KEEP
