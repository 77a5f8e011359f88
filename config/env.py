"""Typed reads of environment variables for Settings: each error names the variable and
says what to set it to."""

from __future__ import annotations

import base64
import builtins
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from .allow import AllowRule, parse_rule
from .keys import parse_keys
from .languages import LANGUAGES

# Read by earlier versions for webhooks and fetches alike; still honoured for both.
LEGACY_ALLOW = "WHISPERQ_WEBHOOK_ALLOW_NETWORKS"

# What a read returns when the variable is unset: the caller's default, often None.
D = TypeVar("D")


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names the variable and how to fix it."""


def parse_rate(text: str) -> tuple[int, int]:
    """'60/minute' -> (60, 60); also second, hour, day, or a number of seconds ('10/30')."""
    count, _, per = text.partition("/")
    units = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
    window = units.get(per.strip().lower().rstrip("s")) or (int(per) if per.strip().isdigit() else 0)
    if not count.strip().isdigit() or int(count) < 1 or window < 1:
        raise ValueError(f"{text!r} is not a rate such as 60/minute")
    return int(count), window


class Env:
    """Typed reads of environment variables; every error names the variable."""

    # Annotations here spell builtins.str, builtins.int, …: the methods str, int, float and bool
    # shadow those names in the class body.

    def __init__(self, environ: Mapping[builtins.str, builtins.str]) -> None:
        self.environ = environ

    def raw(self, name: builtins.str) -> builtins.str | None:
        value = self.environ.get(name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def str(self, name: builtins.str, default: D) -> builtins.str | D:
        value = self.raw(name)
        return default if value is None else value

    def int(self, name: builtins.str, default: builtins.int, low: builtins.int, high: builtins.int) -> builtins.int:
        value = self.raw(name)
        if value is None:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ConfigError(
                f"{name}={value!r} is not a whole number; set it to an integer from {low} to {high}"
            ) from None
        if not low <= number <= high:
            raise ConfigError(f"{name}={number} is out of range; set it to an integer from {low} to {high}")
        return number

    def float(self, name: builtins.str, default: builtins.float, low: builtins.float) -> builtins.float:
        value = self.raw(name)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ConfigError(f"{name}={value!r} is not a number; set it to a number of at least {low}") from None
        if not number >= low:
            raise ConfigError(f"{name}={number} is too small; set it to a number of at least {low}")
        return number

    def choice(self, name: builtins.str, default: builtins.str, choices: tuple[builtins.str, ...]) -> builtins.str:
        value = self.raw(name)
        if value is None:
            return default
        if value.lower() not in choices:
            raise ConfigError(f"{name}={value!r} is not one of: {', '.join(choices)}")
        return value.lower()

    def url(self, name: builtins.str, default: D, schemes: tuple[builtins.str, ...]) -> builtins.str | D:
        value = self.raw(name)
        if value is None:
            return default
        scheme = value.split("://", 1)[0].lower() if "://" in value else ""
        if scheme not in schemes:
            raise ConfigError(
                f"{name} has scheme {scheme or '(none)'!r}; use a URL starting with one of: "
                + ", ".join(f"{s}://" for s in schemes)
            )
        return value

    def basic_auth(self, name: builtins.str) -> builtins.str | None:
        value = self.raw(name)
        if value is None:
            return None
        pairs = [p.strip() for p in value.split(",")]
        for pair in pairs:
            user, sep, password = pair.partition(":")
            if not (user and sep and password):
                raise ConfigError(
                    f"{name} must be user:password, or several separated by commas (user:password,user2:password2); "
                    "a password cannot contain a comma"
                )
        return ",".join(pairs)

    def rate(self, name: builtins.str, default: builtins.str) -> builtins.str | None:
        value = self.raw(name) or default
        if value.lower() in ("off", "none", "0"):
            return None
        try:
            parse_rate(value)
        except ValueError:
            raise ConfigError(
                f"{name}={value!r} is not a rate; set it to a number per second, minute, hour or day "
                "such as 120/minute, or to off"
            ) from None
        return value

    def webhook_secret(self, name: builtins.str) -> builtins.str | None:
        value = self.raw(name)
        if value is not None and value.startswith("whsec_"):
            try:
                key = base64.b64decode(value[len("whsec_") :], validate=True)
            except ValueError:
                key = b""
            if len(key) < 16:
                raise ConfigError(
                    f"{name} starts with whsec_ but the rest is not base64 of at least 16 bytes; set it to "
                    'whsec_ followed by base64 of a random key (such as `python -c "import base64,os; '
                    "print('whsec_' + base64.b64encode(os.urandom(32)).decode())\"`), or unset it"
                )
        return value

    def allow(self, name: builtins.str) -> tuple[AllowRule, ...]:
        """An allow-list (config.allow). WHISPERQ_WEBHOOK_ALLOW_NETWORKS, which older versions
        read for both webhooks and fetches, still counts for both."""
        out: list[AllowRule] = []
        for var in (name, LEGACY_ALLOW):
            for entry in (e.strip() for e in (self.raw(var) or "").split(",")):
                if not entry:
                    continue
                try:
                    rule = parse_rule(entry)
                    if var == LEGACY_ALLOW and rule.host is not None:
                        raise ValueError("it takes networks only")
                except ValueError as exc:
                    raise ConfigError(
                        f"{var} has {entry!r}: {exc}; use comma-separated networks, addresses or host names, each "
                        "with an optional :PORT, such as 10.0.0.0/8:8443,hooks.internal:443"
                    ) from None
                out.append(rule)
        return tuple(out)

    def bool(self, name: builtins.str, default: builtins.bool) -> builtins.bool:
        value = self.raw(name)
        if value is None:
            return default
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{name}={value!r} is not a yes/no value; set it to true or false")

    def duration(self, name: builtins.str, default: builtins.float | None) -> builtins.float | None:
        """Seconds, or a number with s, m, h or d ('90m', '7d'); 'off' keeps things for good."""
        value = self.raw(name)
        if value is None:
            return default
        if value.lower() in ("off", "never", "none"):
            return None
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        number, unit = (value[:-1], value[-1].lower()) if value[-1].lower() in units else (value, "s")
        try:
            seconds = float(number) * units[unit]
        except ValueError:
            seconds = -1.0
        if not seconds >= 0:
            raise ConfigError(
                f"{name}={value!r} is not a duration; set it to seconds or a number with s, m, h or d "
                "(such as 3600, 90m, 7d), or to off"
            )
        return seconds

    def hours(self, name: builtins.str) -> builtins.float | None:
        """A number of hours above 0, or off (unset, 'off', 'none'): a quota."""
        value = self.raw(name)
        if value is None or value.lower() in ("off", "none"):
            return None
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not 0 < number < float("inf"):
            raise ConfigError(
                f"{name}={value!r} is not a number of hours; set it to a number above 0 (such as 10 or 0.5), or to off"
            )
        return number

    def encryption_keys(self, name: builtins.str) -> builtins.str | None:
        value = self.raw(name)
        if value is None:
            return None
        try:
            parse_keys(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from None
        return value

    def language(self, name: builtins.str, default: D) -> builtins.str | D:
        value = self.raw(name)
        if value is None:
            return default
        if value.lower() not in LANGUAGES:
            raise ConfigError(f"{name}={value!r} is not a Whisper language code (such as en, de, fr)")
        return value.lower()


def input_dirs(value: str | None, data_dir: Path) -> tuple[tuple[str | None, Path], ...]:
    """WHISPERQ_INPUT_DIRS: where callers may name files (transcribe.delay(path), MQTT `path`),
    separated by commas: `DIR` is shared by every caller, `KEY=DIR` is the API key KEY's own
    (its id, or the id's first 8 or more characters, as `whisperq keys list` shows it). A file
    in a key's own directory is that key's alone, even inside a shared one. Default: the data
    dir's inbox/, shared. Returns (key or None, directory) pairs."""
    if value is None or not value.strip():
        return ((None, data_dir / "inbox"),)
    dirs: list[tuple[str | None, Path]] = []
    for part in value.replace(os.pathsep, ",").split(","):
        part = part.strip()
        if not part:
            continue
        owner = None
        if not part.startswith("/") and "=" in part:
            owner, _, part = (x.strip() for x in part.partition("="))
            if len(owner) < 8 or not owner.replace("-", "").isalnum():
                raise ConfigError(
                    f"WHISPERQ_INPUT_DIRS: {owner!r} is not an API key id; write KEY=DIR with the key's "
                    "id or at least its first 8 characters (`whisperq keys list`)"
                )
        if not os.path.isabs(part):
            raise ConfigError(
                f"WHISPERQ_INPUT_DIRS: {part!r} is not an absolute path; list absolute directories "
                "(DIR, shared, or KEY=DIR, one key's own), separated by commas"
            )
        dirs.append((owner, Path(os.path.realpath(part))))
    return tuple(dirs)


def hosts(value: str | None) -> tuple[str, ...] | None:
    """WHISPERQ_ALLOWED_HOSTS: the host names (no port) requests may be addressed to, comma
    separated; `*` for any. None: the default (see Settings.served_hosts)."""
    if value is None or not value.strip():
        return None
    hosts = tuple(h.strip().lower().strip("[]") for h in value.split(",") if h.strip())
    return hosts or None
