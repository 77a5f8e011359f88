"""`whisperq config`: the settings in force, passwords masked."""

from __future__ import annotations

import click

from config import ConfigError

from .context import load_settings


@click.command("config")
def show_config() -> None:
    """Print the settings in force (passwords masked); fails on a bad value."""
    for key, value in load_settings().describe().items():
        click.echo(f"{key:20} {value}")
    from config.mqtt import MqttSettings, configured

    if configured():  # the MQTT bridge's own (docs/clients/mqtt.md)
        try:
            for key, value in MqttSettings.from_env().describe().items():
                click.echo(f"{'mqtt_' + key:20} {value}")
        except ConfigError as exc:
            raise click.ClickException(f"configuration error: {exc}") from exc
