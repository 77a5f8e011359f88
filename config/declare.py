"""How a setting is declared: once, on its Settings field (config.settings), with its variable,
how it is read, its default and bounds, and one sentence for the operator.

That one declaration reads the value (through config.env's typed reads, whose errors name the
variable and say what to set it to), checks it, masks it in `whisperq config` when it is a secret,
and writes its row of the configuration reference (config.reference).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field
from typing import Any

from .env import Env

# The reference's sections, in its order. Settings name theirs; config.reference adds the
# variables that other modules, the Procfile and libraries read.
GROUPS = (
    "Storage & data",
    "Broker & database",
    "Web",
    "Models & engine",
    "Batching & workers",
    "Limits & queue",
    "Retries & sweeps",
    "Security & keys",
    "Retention",
    "Webhooks & fetching",
    "Metrics & alerts",
    "Quotas & rates",
    "MQTT bridge",
    "gRPC server",
    "Logs & tracing",
)

Values = dict[str, Any]  # the settings read so far, by field name

# kind -> (what the reference calls its values, how config.env reads it)
KINDS: dict[str, tuple[str, Callable[[Env, Declared, Any], Any]]] = {
    "str": ("text", lambda env, d, default: env.str(d.env, default)),
    "int": ("integer", lambda env, d, default: env.int(d.env, default, d.low, d.high)),
    "float": ("number", lambda env, d, default: env.float(d.env, default, d.low)),
    "choice": ("choice", lambda env, d, default: env.choice(d.env, default, d.choices)),
    "url": ("URL", lambda env, d, default: env.url(d.env, default, d.schemes)),
    "bool": ("true/false", lambda env, d, default: env.bool(d.env, default)),
    "duration": ("duration", lambda env, d, default: env.duration(d.env, default)),
    "hours": ("hours", lambda env, d, default: env.hours(d.env)),
    "rate": ("rate", lambda env, d, default: env.rate(d.env, default)),
    "language": ("language code", lambda env, d, default: env.language(d.env, default)),
    "basic_auth": ("user:password list", lambda env, d, default: env.basic_auth(d.env)),
    "allow": ("host list", lambda env, d, default: env.allow(d.env)),
    "webhook_secret": ("secret", lambda env, d, default: env.webhook_secret(d.env)),
    "encryption_keys": ("key list", lambda env, d, default: env.encryption_keys(d.env)),
}
# What each kind accepts, for the reference where the declaration gives no bounds of its own.
FORMS = {
    "bool": "true, false (also 1/0, yes/no, on/off)",
    "duration": "seconds, or a number with s, m, h or d (90m, 7d); off keeps for good",
    "hours": "a number of hours above 0 (10, 0.5), or off",
    "rate": "N/second, N/minute, N/hour or N/day (120/minute), or off",
    "language": "a Whisper language code (en, de, fr)",
    "basic_auth": "user:password[,user2:password2]; no comma inside a password",
    "allow": "networks, addresses or host names, each with an optional :PORT, comma separated",
    "webhook_secret": "whsec_ followed by base64 of at least 16 random bytes, or any secret of 16+ characters",
    "encryption_keys": "KEYID:BASE64KEY[,KEYID:BASE64KEY…]",
}


@dataclass(frozen=True)
class Var:
    """One environment variable as the configuration reference shows it."""

    name: str
    group: str
    kind: str  # what its values are: integer, URL, …
    default: str  # the default as the operator reads it
    bounds: str  # range, choices, schemes or form
    doc: str  # what it does and how to set it


@dataclass(frozen=True)
class Declared:
    """A Settings field's declaration (in its field's metadata; see `setting`)."""

    env: str
    kind: str
    group: str
    doc: str
    default: Any = None  # the value when unset, or a function of the values read before it
    low: Any = None
    high: Any = None
    choices: tuple[str, ...] = ()
    schemes: tuple[str, ...] = ()
    secret: bool = False  # masked in describe(): "***", or a basic-auth list's passwords
    check: Callable[[str, Any], None] | None = None  # refuses a read value (ConfigError)
    parse: Callable[[Env, Values], Any] | None = None  # a read of its own: (env, values read so far)
    then: Callable[[Any, Values], Any] | None = None  # turns the read value into the field's
    late: bool = False  # read after the cross-setting checks, from every other value
    shown_default: str | None = None
    form: str | None = None  # what it accepts, where kind and bounds do not say
    type_name: str | None = None
    also: tuple[Var, ...] = ()  # further variables this setting reads

    def read(self, env: Env, values: Values) -> Any:
        if self.parse is not None:
            value = self.parse(env, values)
        else:
            default = self.default(values) if callable(self.default) else self.default
            value = KINDS[self.kind][1](env, self, default)
        return self.then(value, values) if self.then is not None else value

    def mask(self, value: Any) -> Any:
        """The value as describe() shows it."""
        if not (self.secret and value):
            return value
        if self.kind == "basic_auth":
            return ",".join(pair.split(":", 1)[0] + ":***" for pair in value.split(","))
        return "***"

    def var(self) -> Var:
        kind = self.type_name or KINDS[self.kind][0]
        return Var(
            self.env, self.group, kind, self.shown_default or shown(self.default), self.form or self._bounds(), self.doc
        )

    def _bounds(self) -> str:
        if self.kind == "int":
            return f"{self.low} to {self.high}"
        if self.kind == "float":
            return f"at least {shown(self.low)}"
        if self.kind == "choice":
            return ", ".join(self.choices)
        if self.kind == "url":
            return ", ".join(f"{s}://" for s in self.schemes)
        return FORMS.get(self.kind, "")


def setting(env: str, kind: str = "str", *, group: str, doc: str, field_default: Any = MISSING, **declared: Any) -> Any:
    """A Settings field declared with its variable (see Declared); `field_default` is the
    dataclass default, for the few fields a Settings made by hand may leave out."""
    assert group in GROUPS and kind in KINDS, (env, group, kind)
    assert doc.strip().endswith("."), f"{env}: the doc is a sentence"
    meta = {"setting": Declared(env, kind, group, doc, **declared)}
    return field(default=field_default, metadata=meta)


def declared(f: Field[Any]) -> Declared:
    decl: Declared = f.metadata["setting"]
    return decl


def shown(value: Any) -> str:
    """A default as the reference shows it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    return str(value)


def read_all(declared_fields: tuple[Field[Any], ...], env: Env, check_across: Callable[[Values], None]) -> Values:
    """Every declared field's value: each read in the order declared (so a default may derive
    from the values before it), then each one's own check, then `check_across` (the checks
    between settings), then the late ones, which may derive from all the others."""
    todo = [(f.name, declared(f)) for f in declared_fields]
    values: Values = {}
    for name, d in todo:
        if not d.late:
            values[name] = d.read(env, values)
    for name, d in todo:
        if d.check is not None and not d.late:
            d.check(d.env, values[name])
    check_across(values)
    for name, d in todo:
        if d.late:
            values[name] = d.read(env, values)
    return values
