"""`whisperq dlq`: the dead-letter queue, listed, shown, replayed and purged
(models.jobs.deadletter)."""

from __future__ import annotations

import json

import click

from models.errors import WhisperqError

from .context import open_runtime


@click.group()
def dlq() -> None:
    """The dead-letter queue: jobs that used up their attempts."""


@dlq.command("list")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def dlq_list(limit: int, as_json: bool) -> None:
    """List dead-lettered jobs, newest first."""
    from models.jobs.deadletter import list_dead

    rows = list_dead(open_runtime(), limit)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("the dead-letter queue is empty")
    for r in rows:
        click.echo(f"{r['job_id']}  {r['failed_at']}  attempts={r['attempts']}  {r['error'][:100]}")


@dlq.command("show")
@click.argument("job_id")
def dlq_show(job_id: str) -> None:
    """Show one dead-lettered job with its traceback."""
    from models.jobs.deadletter import get_dead

    try:
        click.echo(json.dumps(get_dead(open_runtime(), job_id), indent=2))
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc


@dlq.command("replay")
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--model", default=None, help="Run them on this model (or alias) instead of the one they failed on.")
def dlq_replay(job_ids: tuple[str, ...], model: str | None) -> None:
    """Queue dead-lettered jobs again, with their attempts reset."""
    from models.jobs.deadletter import replay

    rt = open_runtime()
    for job_id in job_ids:
        try:
            replay(rt, job_id, model=model)
        except WhisperqError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"{job_id} queued again")


@dlq.command("purge")
@click.argument("job_ids", nargs=-1)
@click.option("--all", "purge_all", is_flag=True, help="Purge every dead letter.")
def dlq_purge(job_ids: tuple[str, ...], purge_all: bool) -> None:
    """Delete dead letters (the jobs stay FAILED)."""
    from models.jobs.deadletter import purge

    if not job_ids and not purge_all:
        raise click.UsageError("name the job ids to purge, or pass --all")
    click.echo(f"purged {purge(open_runtime(), list(job_ids) or None)} dead letters")
