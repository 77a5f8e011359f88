"""The `whisperq` command: run the whole service, check the configuration."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click

from config import ConfigError, Settings, make_celery
from models.errors import WhisperqError

ROOT = Path(__file__).resolve().parent.parent


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except ConfigError as exc:
        raise click.ClickException(f"configuration error: {exc}") from exc


@click.group()
def cli() -> None:
    """whisperq: self-hosted speech to text on a Celery queue."""


@cli.command()
@click.option("--procfile", default=str(ROOT / "Procfile"), show_default=True, help="Procfile to run.")
def run(procfile: str) -> None:
    """Start web, worker and Flower; with no CELERY_BROKER_URL, an embedded Redis too."""
    settings = _settings()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    bindir = str(Path(sys.executable).parent)  # gunicorn, celery and honcho live beside Python
    env = dict(os.environ, WHISPERQ_DATA_DIR=str(settings.data_dir), PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    broker = None
    if not settings.broker_url:
        from config.embedded import EmbeddedRedis

        broker = EmbeddedRedis(settings.data_dir / "redis")
        try:
            env["CELERY_BROKER_URL"] = broker.start()
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"embedded Redis broker on 127.0.0.1:{broker.port} (data in {broker.directory})")
    Settings.from_env(env)  # the processes will read the same; fail here, not in three places
    from models.db import Database

    Database(settings.database_url).create_all()  # once, before three processes race for it
    honcho = shutil.which("honcho", path=env["PATH"])
    if honcho is None:
        raise click.ClickException("honcho is not installed; run `make run` or pip install honcho")
    click.echo(
        f"\n  upload form  http://{settings.host}:{settings.port}/\n"
        f"  API          http://{settings.host}:{settings.port}/v1/jobs\n"
        f"  Flower       http://127.0.0.1:{settings.flower_port}/\n"
        f"  data         {settings.data_dir}\n"
    )
    proc = None
    try:
        proc = subprocess.Popen([honcho, "start", "-f", procfile, "-d", str(ROOT), "-p", str(settings.port)], env=env)

        def forward(signum, _frame):
            # honcho stops its processes on SIGINT/SIGTERM; the broker is stopped after them.
            proc.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = proc.wait()
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            proc.wait()
        if broker is not None:
            broker.stop()
    sys.exit(code)


@cli.command("config")
def show_config() -> None:
    """Print the settings in force (passwords masked); fails on a bad value."""
    for key, value in _settings().describe().items():
        click.echo(f"{key:20} {value}")


@cli.command("init-db")
def init_db() -> None:
    """Create the database tables (web and workers also do this at start)."""
    from models.db import Database

    settings = _settings()
    Database(settings.database_url).create_all()
    click.echo(f"tables ready in {settings.describe()['database_url']}")


def _runtime():
    from models.runtime import Runtime

    rt = Runtime(_settings())
    rt.db.create_all()
    return rt


@cli.group()
def dlq() -> None:
    """The dead-letter queue: jobs that used up their attempts."""


@dlq.command("list")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def dlq_list(limit: int, as_json: bool) -> None:
    """List dead-lettered jobs, newest first."""
    from models.deadletter import list_dead

    rows = list_dead(_runtime(), limit)
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
    from models.deadletter import get_dead

    try:
        click.echo(json.dumps(get_dead(_runtime(), job_id), indent=2))
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc


@dlq.command("replay")
@click.argument("job_ids", nargs=-1, required=True)
def dlq_replay(job_ids: tuple[str, ...]) -> None:
    """Queue dead-lettered jobs again, with their attempts reset."""
    from models.deadletter import replay

    rt = _runtime()
    celery = make_celery(rt.settings)
    for job_id in job_ids:
        try:
            replay(rt, celery, job_id)
        except WhisperqError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"{job_id} queued again")


@dlq.command("purge")
@click.argument("job_ids", nargs=-1)
@click.option("--all", "purge_all", is_flag=True, help="Purge every dead letter.")
def dlq_purge(job_ids: tuple[str, ...], purge_all: bool) -> None:
    """Delete dead letters (the jobs stay FAILED)."""
    from models.deadletter import purge

    if not job_ids and not purge_all:
        raise click.UsageError("name the job ids to purge, or pass --all")
    click.echo(f"purged {purge(_runtime(), list(job_ids) or None)} dead letters")
