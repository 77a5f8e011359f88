"""Checks across settings (config.settings): what one value alone cannot say is wrong, said
with what to set instead."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .env import ConfigError
from .secrets import check_secrets


def check_values(values: dict[str, Any]) -> None:
    """The values read from the environment, before the models are parsed."""
    check_secrets(values)  # placeholders (CHANGE-ME) and weak values: config.secrets
    if values["high_reserve"] >= 1:
        raise ConfigError(
            f"WHISPERQ_HIGH_RESERVE={values['high_reserve']} is the share of the queue budget kept for priority high; "
            "set it to a number from 0 to less than 1"
        )
    if values["storage"] == "postgres" and not values["database_url"].startswith("postgres"):
        raise ConfigError(
            "WHISPERQ_STORAGE=postgres keeps audio in PostgreSQL large objects: set DATABASE_URL to a PostgreSQL "
            "database (postgresql+psycopg://…), or WHISPERQ_STORAGE=local for the data dir"
        )
    if values["alert_failure_rate"] > 1:
        raise ConfigError(
            f"WHISPERQ_ALERT_FAILURE_RATE={values['alert_failure_rate']} is a share of jobs; set it to a number from 0 to 1"
        )


def check_model_path(settings) -> None:
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
            + (" (an openai-whisper .pt checkpoint needs WHISPERQ_ENGINE=openai-whisper)"
               if Path(settings.model_path).is_file() else "")
        )
