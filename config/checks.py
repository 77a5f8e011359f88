"""Checks beyond a typed read (config.env): a share that must stay below one, and what one value
alone cannot say is wrong (checks across settings), each said with what to set instead."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .env import ConfigError

if TYPE_CHECKING:
    from .settings import Settings


def share(what: str, below_one: bool = False) -> Callable[[str, float], None]:
    """A per-setting check (config.declare): a share of something, at most 1 (or below 1)."""

    def check(name: str, value: float) -> None:
        if value > 1 or (below_one and value >= 1):
            most = "less than 1" if below_one else "1"
            raise ConfigError(f"{name}={value} is {what}; set it to a number from 0 to {most}")

    return check


def check_values(values: dict[str, Any]) -> None:
    """Across the values read from the environment, before the models are parsed."""
    if values["storage"] == "postgres" and not values["database_url"].startswith("postgres"):
        raise ConfigError(
            "WHISPERQ_STORAGE=postgres keeps audio in PostgreSQL large objects: set DATABASE_URL to a PostgreSQL "
            "database (postgresql+psycopg://…), or WHISPERQ_STORAGE=local for the data dir"
        )


def check_model_path(settings: Settings) -> None:
    """WHISPERQ_MODEL, against the engine that is to load it."""
    if settings.model_path is not None and settings.engine == "openai-whisper":
        if not (Path(settings.model_path).is_file() or (Path(settings.model_path) / "model.bin").is_file()):
            raise ConfigError(
                f"WHISPERQ_MODEL={settings.model_path!r} is neither a file nor a CTranslate2 model directory: "
                "with WHISPERQ_ENGINE=openai-whisper point it at an openai-whisper checkpoint (.pt), or at a "
                "CTranslate2 Whisper model directory (converted once into the data dir), or unset it"
            )
    elif settings.model_path is not None and not Path(settings.model_path).is_dir():
        raise ConfigError(
            f"WHISPERQ_MODEL={settings.model_path!r} is not a directory: point it at a "
            "CTranslate2 Whisper model directory (with model.bin), or unset it to use the bundled tiny.en"
            + (
                " (an openai-whisper .pt checkpoint needs WHISPERQ_ENGINE=openai-whisper)"
                if Path(settings.model_path).is_file()
                else ""
            )
        )
