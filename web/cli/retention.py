"""`whisperq retention`: delete now what retention would (models.maintenance.retention)."""

from __future__ import annotations

import json

import click

from .context import open_runtime


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def retention(as_json: bool) -> None:
    """Delete now what retention would (audio past WHISPERQ_AUDIO_RETENTION, transcripts
    past WHISPERQ_RESULT_RETENTION, leftover files), as beat's `whisperq.retention` does."""
    from models.maintenance.retention import run_retention

    rt = open_runtime()  # with its broker: to remove purged jobs' result-backend entries
    counts = run_retention(rt)
    if as_json:
        click.echo(json.dumps(counts, indent=2))
        return
    for key, value in counts.items():
        click.echo(f"{key.replace('_', ' '):28} {value}")
