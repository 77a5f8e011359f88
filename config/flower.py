"""How `whisperq flower` starts Flower: address, auth, persistent state, broker API.

Credentials go to Flower through its own environment variables (FLOWER_BASIC_AUTH,
FLOWER_BROKER_API), never on the command line, so `ps` does not show them.
"""

from __future__ import annotations

import ipaddress
import sys
from urllib.parse import urlsplit

from .celeryconfig import is_redis, is_sqs
from .env import ConfigError
from .files import private_dir
from .settings import Settings


def is_loopback(address: str) -> bool:
    """True for an address only this machine reaches (an empty address means all interfaces)."""
    if address.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def broker_api(settings: Settings) -> str | None:
    """RabbitMQ's management API for Flower's broker tab: FLOWER_BROKER_API, or derived
    from CELERY_BROKER_URL (same host and credentials, port 15672). Redis needs none."""
    if settings.flower_broker_api:
        return settings.flower_broker_api
    url = settings.broker_url
    if not url or is_redis(url) or url.startswith("memory"):
        return None
    parts = urlsplit(url)
    secure = parts.scheme == "amqps"
    user = parts.username or "guest"
    password = parts.password or "guest"  # still percent-encoded, as a URL needs them
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if secure else 'http'}://{user}:{password}@{host}:{15671 if secure else 15672}/api/"


# Why `whisperq flower` does not start on SQS (and `whisperq run` leaves it out there).
NOT_ON_SQS = (
    "Flower shows what workers report through the broker's broadcast (remote control) and events, and SQS "
    "carries neither: on SQS watch /metrics, `whisperq status` and the workers' logs instead "
    "(docs/deployment/sqs.md)"
)


def flower_command(settings: Settings, environ: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run Flower; ConfigError when it would be open to the
    network without a password, or could show nothing (SQS)."""
    if settings.broker_url and is_sqs(settings.broker_url):
        raise ConfigError(NOT_ON_SQS)
    address = settings.flower_address
    if not settings.flower_basic_auth and not is_loopback(address):
        raise ConfigError(
            f"FLOWER_ADDRESS={address or '(all interfaces)'} is reachable from other machines but "
            "FLOWER_BASIC_AUTH is not set: set FLOWER_BASIC_AUTH=user:password (several separated by "
            "commas), or keep FLOWER_ADDRESS=127.0.0.1"
        )
    env = dict(environ)
    for name, value in (("FLOWER_BASIC_AUTH", settings.flower_basic_auth), ("FLOWER_BROKER_API", broker_api(settings))):
        # Flower reads these itself; an empty value would turn into an empty password.
        if value:
            env[name] = value
        else:
            env.pop(name, None)
    private_dir(settings.data_dir)
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tasks.worker",
        "flower",
        f"--address={address}",
        f"--port={settings.flower_port}",
        f"--max_tasks={settings.flower_max_tasks}",
        "--persistent=True",
        f"--db={settings.data_dir / 'flower.db'}",
    ]
    return argv, env
