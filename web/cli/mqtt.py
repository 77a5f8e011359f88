"""`whisperq mqtt`: the MQTT bridge (the Procfile's `mqtt` line; docs/clients/mqtt.md)."""

from __future__ import annotations

import sys

import click

from config import ConfigError

from .context import load_settings


@click.command()
def mqtt() -> None:
    """Take transcription requests from an MQTT broker (WHISPERQ_MQTT_URL) and publish each job's
    status changes and result to the requesting client's reply topic. Run exactly one."""
    from config.mqtt import MqttSettings

    settings = load_settings()
    try:
        mq = MqttSettings.from_env()
    except ConfigError as exc:
        raise click.ClickException(f"configuration error: {exc}") from exc
    from web import create_app
    from web.mqtt.bridge import Bridge

    try:
        bridge = Bridge(create_app({"SETTINGS": settings}), mq)
    except ConfigError as exc:
        raise click.ClickException(f"configuration error: {exc}") from exc
    sys.exit(bridge.run())
