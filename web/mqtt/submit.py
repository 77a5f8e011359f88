"""Who owns an MQTT request's job, and submitting it through the one door
(models.pipeline.door), as every other way in does: no Flask request, no web code.

Ownership: WHISPERQ_MQTT_CLIENTS maps a client's name to an API key (`*` for any other
client); its jobs are that key's, with its tier, rate limit, queue share, input directories
and webhook secret. A client with no key acts anonymously where WHISPERQ_ALLOW_ANONYMOUS is
on, else is refused. A request's idempotency key is its client's and correlation id's, in
the door's `mqtt` namespace: no HTTP client can name it.
"""

from __future__ import annotations

from flask import Flask

from config import ConfigError
from config.mqtt import MqttSettings
from models.access.apikeys import Principal, find_key
from models.delivery.mqtt_replies import request_id
from models.errors import DATABASE_AWAY, BrokerUnavailable, WhisperqError
from models.jobs.record import Job
from models.pipeline import door, intake
from models.runtime import Runtime

from .requests import Refused, Request

# What passes by itself: the request is kept (not acknowledged) and tried again.
TRANSIENT: tuple[type[Exception], ...] = (BrokerUnavailable, *DATABASE_AWAY, ConnectionError, TimeoutError)


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
    """Whom the request acts for: the one door's `identify` on its client's key (checked again
    now: it may have been revoked), else anonymous use where it is allowed."""
    key_id = keys.get(req.client, keys.get("*"))
    try:
        return door.identify(
            rt,
            key_id=key_id,
            what=f"the MQTT client {req.client!r}",
            how=f"the MQTT client {req.client!r} has none; an operator maps it to one in WHISPERQ_MQTT_CLIENTS "
            f"({req.client}=KEY_ID)",
        )
    except WhisperqError as exc:
        raise Refused("unauthorized", str(exc), req.reply_topic, req.correlation_id) from None


def idempotency_key(req: Request) -> str:
    """A request's idempotency key, before the door scopes it: its client's and correlation id's."""
    return request_id(req.client, req.correlation_id)


def submit(app: Flask, req: Request, who: Principal) -> tuple[Job, bool]:
    """The request's job (new, or the one made when it came before); Refused for what the API
    would answer with a 4xx (or 429/503 with a time to come back); TRANSIENT errors pass up."""
    rt = app.extensions["whisperq"]
    audio = {req.source: req.body.get(req.source, "")}  # the door refuses what is not a string, or empty
    sub = door.Submission(
        who,
        "mqtt",
        fields={k: v for k, v in req.body.items() if k not in ("audio_url", "path")},
        idempotency_key=idempotency_key(req),
        **audio,
    )
    try:
        # a request seen before gets its job back, whatever the queue holds now
        door.gate(rt, who, "mqtt:" + req.client, "mqtt", sub.idempotency_key)
        return intake.submit(rt, sub)
    except TRANSIENT:
        raise
    except WhisperqError as exc:
        retry_after = getattr(exc, "retry_after", None) or (5 if exc.http_status == 503 else None)
        raise Refused(
            exc.code,
            str(exc),
            req.reply_topic,
            req.correlation_id,
            int(retry_after) if retry_after is not None else None,
        ) from None
