"""`whisperq grpc`: the gRPC door in the foreground (docs/clients/grpc.md); `whisperq run`
starts it beside the others."""

from __future__ import annotations

import click

from config import ConfigError

from .context import load_settings


@click.command("grpc")
def grpc_door() -> None:
    """Serve the gRPC API (whisperq.v1.Transcription, with health and reflection) on
    WHISPERQ_GRPC_ADDRESS:WHISPERQ_GRPC_PORT (127.0.0.1:50051); TLS with WHISPERQ_GRPC_TLS_CERT
    and WHISPERQ_GRPC_TLS_KEY. Stops on SIGTERM or Ctrl-C."""
    from config.grpc import GrpcSettings

    settings = load_settings()
    try:
        grpc_settings = GrpcSettings.from_env()
    except ConfigError as exc:
        raise click.ClickException(f"configuration error: {exc}") from exc
    from web.rpc.server import serve

    try:
        serve(settings, grpc_settings)
    except ConfigError as exc:
        raise click.ClickException(f"configuration error: {exc}") from exc
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
