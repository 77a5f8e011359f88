"""The one rule for secret settings: a value copied from an example (it still says CHANGE-ME)
or too short to be secret stops every process at start, with the setting's name and how to
make a real one. Unset is fine (the service then generates or goes without, see
config.settings); only a bad value is refused. No message ever repeats the value."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from .env import ConfigError

# CHANGE-ME, as the examples in deploy/ write it, and its spellings (changeme, change_me).
PLACEHOLDER = re.compile(r"change[-_ ]?me", re.IGNORECASE)
MIN_LENGTH = 16
MIN_DISTINCT = 6  # 'aaaaaaaaaaaaaaaa' is long enough and no secret
GENERATE = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'

# Settings field -> its variable, and how to make a good value where the generic way is not one.
TOKENS: dict[str, str] = {
    "admin_token": "WHISPERQ_ADMIN_TOKEN",
    "secret_key": "WHISPERQ_SECRET_KEY",
    "metrics_token": "WHISPERQ_METRICS_TOKEN",
    "webhook_secret": "WHISPERQ_WEBHOOK_SECRET",
}
HINTS: dict[str, str] = {
    "WHISPERQ_WEBHOOK_SECRET": (
        'set it to whsec_ followed by base64 of 32 random bytes (`python -c "import base64,os; '
        "print('whsec_' + base64.b64encode(os.urandom(32)).decode())\"`), or unset it"
    ),
    "WHISPERQ_ENCRYPTION_KEYS": (
        'make a key with `whisperq encryption new-key` (or `python -c "import base64,os; '
        "print('k1:' + base64.b64encode(os.urandom(32)).decode())\"`)"
    ),
}
# URLs that may carry a password. Their passwords must match a server's, so only the
# example's placeholder is refused here, not a short one (a local guest:guest is fine).
URLS: dict[str, str] = {
    "broker_url": "CELERY_BROKER_URL",
    "result_backend": "CELERY_RESULT_BACKEND",
    "database_url": "DATABASE_URL",
    "redis_url": "WHISPERQ_REDIS_URL",
    "flower_broker_api": "FLOWER_BROKER_API",
}


def weakness(value: str) -> str | None:
    """Why `value` cannot be a secret, or None when it can."""
    if PLACEHOLDER.search(value):
        return "is still the example's placeholder (CHANGE-ME)"
    if len(value) < MIN_LENGTH:
        return f"is shorter than {MIN_LENGTH} characters, too short to be secret"
    if len(set(value)) < MIN_DISTINCT:
        return f"has fewer than {MIN_DISTINCT} different characters, too simple to be secret"
    return None


def refuse(name: str, why: str, subject: str = "the value") -> ConfigError:
    """The error for a bad secret: the setting, what is wrong (never the value), how to make one."""
    hint = HINTS.get(name) or (
        f"set it to a random value of at least {MIN_LENGTH} characters, such as the output "
        f"of `{GENERATE}`" + (", or unset it" if subject == "the value" else "")
    )
    return ConfigError(f"{name}: {subject} {why}; {hint}")


def check_secret(name: str, value: str | None) -> None:
    """One secret setting (a token, a password): placeholder, short or simple values are refused."""
    if value is None:
        return
    why = weakness(value)
    if why:
        raise refuse(name, why)


def check_basic_auth(name: str, value: str | None) -> None:
    """user:password[,user:password...]: each password is a secret."""
    for pair in (value or "").split(","):
        user, _, password = pair.strip().partition(":")
        why = weakness(password) if password else None
        if why:
            raise refuse(name, why, f"the password of user {user!r}")


def check_url(name: str, value: str | None) -> None:
    """A URL's password must not be the example's placeholder (it is the server's as well)."""
    if not value or "://" not in value:
        return
    try:
        password = urlsplit(value).password
    except ValueError:
        password = None
    if password is None and "@" in value:  # what urlsplit does not split (several hosts, odd ports)
        creds = value.split("://", 1)[1].rsplit("@", 1)[0]
        password = creds.partition(":")[2] or None
    if password is not None and PLACEHOLDER.search(unquote(password)):
        raise ConfigError(
            f"{name}: the URL's password is still the example's placeholder (CHANGE-ME); give the server a random "
            f"password (such as the output of `{GENERATE}`) and put the same one in {name}"
        )


def check_encryption_keys(name: str, value: str | None) -> None:
    """Keys are checked for form by config.keys; a key that spells the placeholder is refused here."""
    if value and PLACEHOLDER.search(value):
        raise refuse(name, "is still the example's placeholder (CHANGE-ME)")


def check_secrets(values: Mapping[str, Any]) -> None:
    """Every secret among the settings read from the environment (config.checks.check_values)."""
    for field, name in TOKENS.items():
        check_secret(name, values.get(field))
    check_basic_auth("FLOWER_BASIC_AUTH", values.get("flower_basic_auth"))
    check_encryption_keys("WHISPERQ_ENCRYPTION_KEYS", values.get("encryption_keys"))
    for field, name in URLS.items():
        check_url(name, values.get(field))
