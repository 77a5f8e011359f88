"""What every command starts from: the settings in force, the runtime over them, and the
repository root (where the Procfile is)."""

from __future__ import annotations

from pathlib import Path

import click

from config import ConfigError, Settings

ROOT = Path(__file__).resolve().parents[2]


def load_settings() -> Settings:
    """The settings from the environment; a bad value is the command's error, not a traceback."""
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise click.ClickException(f"configuration error: {exc}") from exc


def open_runtime():
    """The runtime (database, storage, keyring, and the broker through this process's Celery
    app) over those settings, its tables upgraded: tasks.app.start_process, as the web's."""
    from tasks.app import start_process

    return start_process(load_settings(), broker_now=False)
