"""The MQTT bridge's settings (`whisperq mqtt`, docs/clients/mqtt.md). Only the bridge reads them,
and `whisperq run`, which starts the bridge's Procfile line only where WHISPERQ_MQTT_URL is
set; like Settings, a bad value stops the bridge at start with a message naming the variable."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from .env import ConfigError, Env
from .secrets import check_url

URL_VARIABLE = "WHISPERQ_MQTT_URL"
PROTOCOLS = ("5", "3.1.1")
QUEUE_VARIABLE = "WHISPERQ_MQTT_QUEUE"
MAX_QUEUE = 65535  # MQTT v5's largest Receive Maximum
CLIENT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}


@dataclass(frozen=True)
class MqttSettings:
    host: str
    port: int
    tls: bool
    username: str | None
    password: str | None
    client_id: str  # fixed: the broker keeps this client's session (its subscription, its unacked requests)
    request_topic: str  # one `+` level: the requesting client's name
    reply_prefix: str  # replies go under PREFIX/<client name>
    clients: tuple[tuple[str, str], ...]  # (client name or "*", API key id or start) whose key owns its jobs
    ca_file: str | None
    protocol: str
    session_expiry_seconds: int
    # Requests the bridge holds at once (read, not yet taken); with that many it reads no more, and
    # the broker keeps the rest. Also its MQTT v5 Receive Maximum.
    queue: int = 100

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> MqttSettings:
        env = Env(os.environ if environ is None else environ)
        url = env.url(URL_VARIABLE, None, schemes=tuple(_DEFAULT_PORTS))
        if url is None:
            raise ConfigError(
                f"{URL_VARIABLE} is not set, so the MQTT bridge has no broker to connect to: set it to "
                "mqtt://USER:PASSWORD@HOST:1883 (mqtts:// for TLS), or do not start `whisperq mqtt`"
            )
        check_url(URL_VARIABLE, url)  # not the example's password (config.secrets)
        parts = urlsplit(url)
        try:
            port = parts.port or _DEFAULT_PORTS[parts.scheme.lower()]
        except ValueError:
            raise ConfigError(f"{URL_VARIABLE} has a malformed port; use mqtt://USER:PASSWORD@HOST:1883") from None
        if not parts.hostname or parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ConfigError(
                f"{URL_VARIABLE} must be mqtt://[USER:PASSWORD@]HOST[:PORT] (or mqtts://), with no path "
                "or query; percent-encode a password's special characters"
            )
        expiry = env.duration("WHISPERQ_MQTT_SESSION_EXPIRY", 7 * 86400.0)
        settings = cls(
            host=parts.hostname,
            port=port,
            tls=parts.scheme.lower() == "mqtts",
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            client_id=env.str("WHISPERQ_MQTT_CLIENT_ID", "whisperq-bridge"),
            request_topic=env.str("WHISPERQ_MQTT_REQUEST_TOPIC", "whisperq/requests/+"),
            reply_prefix=env.str("WHISPERQ_MQTT_REPLY_PREFIX", "whisperq/replies").rstrip("/"),
            clients=_clients(env.raw("WHISPERQ_MQTT_CLIENTS")),
            ca_file=env.str("WHISPERQ_MQTT_CA", None),
            protocol=env.choice("WHISPERQ_MQTT_PROTOCOL", "5", PROTOCOLS),
            session_expiry_seconds=int(min(expiry, 0xFFFFFFFF)) if expiry is not None else 0xFFFFFFFF,
            queue=_queue(env),
        )
        settings._check()
        return settings

    def _check(self) -> None:
        levels = self.request_topic.split("/")
        if (
            levels.count("+") != 1
            or "#" in self.request_topic
            or self.request_topic.startswith("$")
            or any(("+" in level and level != "+") for level in levels)
        ):
            raise ConfigError(
                f"WHISPERQ_MQTT_REQUEST_TOPIC={self.request_topic!r} must have exactly one '+' level (the "
                "requesting client's name) and no '#', such as whisperq/requests/+"
            )
        if not self.reply_prefix or any(c in self.reply_prefix for c in "+#\0") or self.reply_prefix.startswith("$"):
            raise ConfigError(
                f"WHISPERQ_MQTT_REPLY_PREFIX={self.reply_prefix!r} must be a topic without wildcards, "
                "such as whisperq/replies"
            )
        if not 1 <= len(self.client_id) <= 128 or not self.client_id.isprintable():
            raise ConfigError("WHISPERQ_MQTT_CLIENT_ID must be 1 to 128 printable characters, the same on every start")
        if self.ca_file is not None and not os.path.isfile(self.ca_file):
            raise ConfigError(
                f"WHISPERQ_MQTT_CA={self.ca_file!r} is not a file; point it at the CA bundle (PEM) that "
                "signed the broker's certificate, or unset it for the system's"
            )
        if self.ca_file is not None and not self.tls:
            raise ConfigError(f"WHISPERQ_MQTT_CA is set but {URL_VARIABLE} is not mqtts://; use mqtts:// for TLS")

    @property
    def name_level(self) -> int:
        """Which level of a request's topic is the client's name (the `+`)."""
        return self.request_topic.split("/").index("+")

    def client_of(self, topic: str) -> str | None:
        """The requesting client's name from a request's topic (None if the topic does not match)."""
        levels, pattern = topic.split("/"), self.request_topic.split("/")
        if len(levels) != len(pattern) or any(p not in ("+", level) for p, level in zip(pattern, levels, strict=True)):
            return None
        return levels[self.name_level]

    def reply_topic(self, client: str) -> str:
        """Where a client's replies go unless it names a topic under it."""
        return f"{self.reply_prefix}/{client}"

    def describe(self) -> dict[str, str]:
        auth = f"{self.username}:***@" if self.password else (f"{self.username}@" if self.username else "")
        return {
            "broker": f"{'mqtts' if self.tls else 'mqtt'}://{auth}{self.host}:{self.port}",
            "client_id": self.client_id,
            "request_topic": self.request_topic,
            "reply_prefix": self.reply_prefix,
            "protocol": self.protocol,
            "queue": str(self.queue),
            "clients": ",".join(f"{n}={k}" for n, k in self.clients),
        }


def configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the bridge has a broker to connect to (WHISPERQ_MQTT_URL is set)."""
    return Env(os.environ if environ is None else environ).raw(URL_VARIABLE) is not None


def _queue(env: Env) -> int:
    try:
        return env.int(QUEUE_VARIABLE, 100, 1, MAX_QUEUE)
    except ConfigError as exc:
        raise ConfigError(
            f"{exc}: how many requests the MQTT bridge holds at once (the broker keeps the rest until there is room)"
        ) from None


def _clients(value: str | None) -> tuple[tuple[str, str], ...]:
    """WHISPERQ_MQTT_CLIENTS: NAME=KEY pairs, comma separated; NAME `*` for any other client."""
    out = []
    for entry in (e.strip() for e in (value or "").split(",")):
        if not entry:
            continue
        name, sep, key = (part.strip() for part in entry.partition("="))
        if not sep or not key or not (name == "*" or CLIENT_NAME.match(name)):
            raise ConfigError(
                f"WHISPERQ_MQTT_CLIENTS has {entry!r}; list NAME=KEY_ID pairs separated by commas "
                "(NAME: the client's topic level, letters, digits, '.', '_' or '-', or * for any other "
                "client; KEY_ID: an API key's id from `whisperq keys list`)"
            )
        out.append((name, key))
    return tuple(out)
