"""Reading an MQTT request: who sent it (its topic's `+` level), where its replies go, its
correlation id, and the API's fields it carries. Whatever is wrong is a `Refused` whose
message says what to fix, sent to a topic of the requesting client's own."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from config.mqtt import CLIENT_NAME, MqttSettings
from models.delivery.mqtt_replies import MAX_CORRELATION, MAX_TOPIC
from models.pipeline.request import FIELDS

MAX_PAYLOAD = 64 * 1024  # as the API's JSON body (web.app.MAX_BODY_BYTES): an audio reference and options
# The largest packet a request the bridge takes makes: the largest payload, with room for the
# fixed header, the topic, the packet id and the properties a request carries (a response topic
# and correlation data: MAX_TOPIC and MAX_CORRELATION, with room to spare). The broker's
# max_packet_size must be no smaller (deploy/mosquitto/whisperq.conf).
MAX_PACKET = MAX_PAYLOAD + 4 * 1024
ENVELOPE = ("reply_to", "correlation_id")
SOURCES = ("audio_url", "path", "audio_ref")  # audio_ref: another name for path, as transcribe.delay() calls it
EXAMPLE = '{"path": "/srv/inbox/call.flac", "correlation_id": "call-1"}'


class Refused(Exception):
    """A request answered with an error reply (and acknowledged: sending it again as it is
    would be refused again)."""

    def __init__(
        self,
        code: str,
        message: str,
        reply_topic: str,
        correlation_id: str | None = None,
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.code, self.reply_topic = code, reply_topic
        self.correlation_id, self.retry_after = correlation_id, retry_after

    def reply(self) -> dict:
        body: dict[str, Any] = {
            "type": "error",
            "correlation_id": self.correlation_id,
            "error": {"code": self.code, "message": str(self)},
        }
        if self.retry_after is not None:
            body["retry_after"] = self.retry_after
        return body


def too_large(mq: MqttSettings, topic: str, payload: bytes, properties=None, retained: bool = False) -> Refused:
    """The refusal of a request bigger than MAX_PAYLOAD, for where its replies go, without
    parsing it (read_request refuses it first)."""
    if len(payload) <= MAX_PAYLOAD:
        raise ValueError(f"a request of {len(payload)} bytes is not too large")
    try:
        read_request(mq, topic, payload, properties, retained)
    except Refused as refused:
        return refused
    raise AssertionError("read_request took a request bigger than MAX_PAYLOAD")


@dataclass(frozen=True)
class Request:
    client: str
    correlation_id: str
    reply_topic: str
    source: str  # "audio_url" or "path"
    body: dict = field(repr=False)  # the API's fields and the audio's source, as POST /v1/jobs takes them


def read_request(mq: MqttSettings, topic: str, payload: bytes, properties=None, retained: bool = False) -> Request:
    """The request in a message on the request topic, or Refused saying what to fix."""
    client = mq.client_of(topic) or ""
    own = mq.reply_topic(client)
    if not CLIENT_NAME.match(client):
        raise Refused(
            "invalid_request",
            f"the client's name {client!r} (the topic level after the request topic's "
            "prefix) must be 1 to 64 letters, digits, '.', '_' or '-'",
            own,
        )
    given, correlation = _v5(properties, "CorrelationData"), None
    if isinstance(given, (bytes, bytearray)):
        try:
            correlation = bytes(given).decode("utf-8")
        except UnicodeDecodeError:
            raise Refused(
                "invalid_request",
                "the MQTT correlation data must be UTF-8 text (or send correlation_id in the request)",
                own,
            ) from None
    if retained:
        raise Refused(
            "invalid_request",
            "requests must not be retained: publish them without the retain flag (and "
            "clear this one with an empty retained message on its topic)",
            own,
            correlation,
        )
    if len(payload) > MAX_PAYLOAD:
        raise Refused(
            "too_large",
            f"the request is {len(payload)} bytes; the limit is {MAX_PAYLOAD // 1024} KiB "
            "(audio goes by reference: an audio_url, or a path under WHISPERQ_INPUT_DIRS)",
            own,
            correlation,
        )
    try:
        body = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(
            "invalid_request",
            f"the request is not JSON ({exc}); send a JSON object such as {EXAMPLE}",
            own,
            correlation,
        ) from None
    if not isinstance(body, dict):
        raise Refused("invalid_request", f"the request must be a JSON object such as {EXAMPLE}", own, correlation)
    correlation = _correlation(body.get("correlation_id", correlation), correlation, own)
    reply_topic = _reply_topic(mq, client, body.get("reply_to", _v5(properties, "ResponseTopic")), correlation)
    body = {k: v for k, v in body.items() if k not in ENVELOPE}
    unknown = sorted(set(body) - set(FIELDS) - set(SOURCES))
    if unknown:
        raise Refused(
            "invalid_request",
            f"unknown field(s) {', '.join(repr(u) for u in unknown)}; "
            "a request has one of "
            f"'audio_url' or 'path' (or 'audio_ref'), the options {', '.join(repr(f) for f in FIELDS)}, "
            "and 'correlation_id' and 'reply_to'",
            reply_topic,
            correlation,
        )
    sources = [s for s in SOURCES if s in body]
    if len(sources) != 1:
        raise Refused(
            "invalid_request",
            "give the audio as exactly one of 'audio_url' (an http(s) URL) or 'path' "
            f"(a file under WHISPERQ_INPUT_DIRS){'' if sources else ', such as ' + EXAMPLE}",
            reply_topic,
            correlation,
        )
    if sources == ["audio_ref"]:
        body["path"] = body.pop("audio_ref")
    return Request(client, correlation, reply_topic, "audio_url" if sources == ["audio_url"] else "path", body)


def _v5(properties, name: str):
    return getattr(properties, name, None) if properties is not None else None


def _correlation(value, from_properties: str | None, own: str) -> str:
    if from_properties is not None and value != from_properties:
        raise Refused(
            "invalid_request",
            "the request's correlation_id and its MQTT correlation data differ; send one, or the same in both",
            own,
            from_properties,
        )
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_CORRELATION or not value.isprintable():
        raise Refused(
            "invalid_request",
            f"correlation_id is {'missing' if value is None else 'not valid'}: give each "
            f"request an id of its own, 1 to {MAX_CORRELATION} printable characters (or MQTT v5 correlation "
            "data); it comes back on every reply, and a request sent again with it makes no second job",
            own,
            value if isinstance(value, str) else None,
        )
    return value


def _reply_topic(mq: MqttSettings, client: str, value, correlation: str) -> str:
    """The client's own reply topic, or one under it: a client may not make the bridge publish
    on another's topics."""
    own = mq.reply_topic(client)
    if value is None:
        return own
    if (
        not isinstance(value, str)
        or not (value == own or value.startswith(own + "/"))
        or len(value) > MAX_TOPIC
        or any(c in value for c in "+#\0")
    ):
        raise Refused(
            "forbidden",
            f"reply_to must be {own} or a topic under {own}/ (at most {MAX_TOPIC} characters, "
            "no wildcards): replies go to the requesting client's own topics",
            own,
            correlation,
        )
    return value
