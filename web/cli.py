"""The `whisperq` command: run the whole service, check the configuration."""
from __future__ import annotations

import json
from pathlib import Path

import click

from config import ConfigError, Settings
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


@cli.command("config")
def show_config() -> None:
    """Print the settings in force (passwords masked); fails on a bad value."""
    for key, value in _settings().describe().items():
        click.echo(f"{key:20} {value}")
    from config.mqtt import MqttSettings, configured

    if configured():  # the MQTT bridge's own (README "MQTT")
        try:
            for key, value in MqttSettings.from_env().describe().items():
                click.echo(f"{'mqtt_' + key:20} {value}")
        except ConfigError as exc:
            raise click.ClickException(f"configuration error: {exc}") from exc


@cli.command("init-db")
def init_db() -> None:
    """Create the database tables or upgrade them to the newest schema revision (web and
    workers also do this at start)."""
    from models import migrations
    from models.db import Database

    settings = _settings()
    db = Database(settings.database_url)
    db.upgrade()
    click.echo(f"tables ready at schema revision {migrations.current(db.engine)} in {settings.describe()['database_url']}")


@cli.command("new-migration")
@click.argument("message")
def new_migration(message: str) -> None:
    """Write a new schema revision into models/migrations/versions/ from what the models
    declare beyond the newest revision (for developers; review it before committing)."""
    import tempfile

    from alembic import command
    from sqlalchemy import create_engine

    from models import migrations
    from models.db import Base

    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite:///{tmp}/schema.db")
        migrations.upgrade(engine, Base.metadata)
        with engine.connect() as conn:
            number = f"{int(migrations.head()) + 1:04d}"
            script = command.revision(migrations.config(conn, Base.metadata), message=message, autogenerate=True,
                                      rev_id=number)
        engine.dispose()
    click.echo(f"wrote {script.path}; check it (and on PostgreSQL), then commit it with the model change")


@cli.command("convert-model")
@click.argument("src_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("dest", type=click.Path(dir_okay=False))
@click.option("--half/--float32", default=None, help="Store float16 or float32 (default: float16 when the source is float16).")
def convert_model(src_dir: str, dest: str, half: bool | None) -> None:
    """Turn a CTranslate2 Whisper model directory into an openai-whisper checkpoint (DEST.pt),
    for WHISPERQ_ENGINE=openai-whisper; needs the openai-whisper extra (PyTorch)."""
    from models.speech.convert import ConversionError, convert, weight_dtype

    try:
        import torch  # noqa: F401
    except ImportError:
        raise click.ClickException("converting needs PyTorch: pip install torch==2.13.0, then "
                                   "pip install -e '.[openai-whisper]'") from None
    try:
        dims = convert(src_dir, dest, half=half)
        source_dtype = weight_dtype(src_dir)
    except (ConversionError, KeyError) as exc:
        raise click.ClickException(f"cannot convert {src_dir}: {exc}") from exc
    click.echo(f"wrote {dest} from {src_dir} ({source_dtype} weights)")
    click.echo("dims " + ", ".join(f"{k}={v}" for k, v in dims.items()))


def _runtime():
    from models.runtime import Runtime

    rt = Runtime(_settings())
    rt.db.upgrade()
    return rt


def _mb(value) -> str:
    return "?" if value is None else f"{value // (1024 * 1024):,} MB"


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(as_json: bool) -> None:
    """Workers (from their heartbeats), queues and their depths, the oldest waiting job,
    dead letters: what an operator looks at first."""
    from models.jobs.record import utcnow
    from models.jobs.workers import alive, by_host
    from tasks.app import celery_for
    from web.metrics import broker_depths, database_figures

    rt = _runtime()
    now = utcnow()
    workers = alive(rt, now=now)
    figures = database_figures(rt, now)
    try:
        depths, broker_error = broker_depths(celery_for(rt.settings)), None
    except Exception as exc:  # still show what the database knows
        depths, broker_error = {}, f"unreachable: {type(exc).__name__}: {exc}"
    report = {
        "broker": rt.settings.describe()["broker_url"] if broker_error is None else broker_error,
        "workers": [{"pool": w["pool"], "hostname": w["hostname"], "host": w["host"], "slots": w["slots"],
                     "up_seconds": round((now - w["started_at"]).total_seconds()),
                     "last_seen_seconds": round((now - w["last_seen_at"]).total_seconds(), 1)} for w in workers],
        "hosts": {name: {k: h.get(k) for k in ("workers", "models", "disk_free_bytes", "memory_available_bytes")}
                  for name, h in by_host(workers).items()},
        "queues": {},
        "jobs": figures["statuses"],
        "dead_letters": figures["dead_letters"],
    }
    for (queue, tier), count in sorted(depths.items()):
        report["queues"].setdefault(queue, {"waiting": 0, "by_priority": {}})
        report["queues"][queue]["waiting"] += count
        report["queues"][queue]["by_priority"][tier] = count
    for queue, age in figures["oldest"].items():
        report["queues"].setdefault(queue, {"waiting": None, "by_priority": {}})["oldest_seconds"] = round(age, 1)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"broker        {report['broker']}")
    click.echo(f"workers       {len(workers)} alive on {len(report['hosts'])} host(s)")
    for name, h in report["hosts"].items():
        pools = ", ".join(f"{n} {pool}" for pool, n in sorted(h["workers"].items()))
        click.echo(f"  host {name:<34} {pools}; disk {_mb(h['disk_free_bytes'])} free, "
                   f"memory {_mb(h['memory_available_bytes'])} available")
    for w in report["workers"]:
        click.echo(f"  {w['pool']:<10} {w['hostname']:<40} {w['slots']:>3} slots  up {w['up_seconds']} s, "
                   f"seen {w['last_seen_seconds']} s ago")
    click.echo("queues")
    for queue, q in report["queues"].items():
        tiers = ", ".join(f"{k} {v}" for k, v in q["by_priority"].items())
        waiting = "?" if q["waiting"] is None else q["waiting"]
        oldest = f", oldest waiting {q['oldest_seconds']} s" if q.get("oldest_seconds") else ""
        click.echo(f"  {queue:<20} {waiting} waiting" + (f" ({tiers})" if tiers else "") + oldest)
    click.echo("jobs          " + ", ".join(f"{k} {v}" for k, v in sorted(report["jobs"].items())))
    click.echo(f"dead letters  {report['dead_letters']}")
    if not any(w["pool"] == "inference" for w in workers):
        click.echo("warning: no inference worker is alive; jobs wait until one starts")


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def retention(as_json: bool) -> None:
    """Delete now what retention would (audio past WHISPERQ_AUDIO_RETENTION, transcripts
    past WHISPERQ_RESULT_RETENTION, leftover files), as beat's `whisperq.retention` does."""
    from models.maintenance.retention import run_retention
    from tasks.app import init_celery
    from tasks.broker import CeleryBroker

    rt = _runtime()
    try:
        rt.broker = CeleryBroker(init_celery(rt.settings))  # to remove purged jobs' result-backend entries
    except ConfigError:
        pass
    counts = run_retention(rt)
    if as_json:
        click.echo(json.dumps(counts, indent=2))
        return
    for key, value in counts.items():
        click.echo(f"{key.replace('_', ' '):28} {value}")


@cli.group()
def dlq() -> None:
    """The dead-letter queue: jobs that used up their attempts."""


@dlq.command("list")
@click.option("--limit", default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def dlq_list(limit: int, as_json: bool) -> None:
    """List dead-lettered jobs, newest first."""
    from models.jobs.deadletter import list_dead

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
    from models.jobs.deadletter import get_dead

    try:
        click.echo(json.dumps(get_dead(_runtime(), job_id), indent=2))
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc


@dlq.command("replay")
@click.argument("job_ids", nargs=-1, required=True)
@click.option("--model", default=None, help="Run them on this model (or alias) instead of the one they failed on.")
def dlq_replay(job_ids: tuple[str, ...], model: str | None) -> None:
    """Queue dead-lettered jobs again, with their attempts reset."""
    from models.jobs.deadletter import replay
    from tasks.app import init_celery
    from tasks.broker import CeleryBroker

    rt = _runtime()
    rt.broker = CeleryBroker(init_celery(rt.settings))
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
    click.echo(f"purged {purge(_runtime(), list(job_ids) or None)} dead letters")


from .keys_cli import keys  # noqa: E402 - the group uses _runtime above

cli.add_command(keys)

from .cli_encryption import encryption  # noqa: E402

cli.add_command(encryption)

from .cli_dataset import dataset  # noqa: E402

cli.add_command(dataset)

from .cli_models import models  # noqa: E402

cli.add_command(models)

from .cli_run import env, flower, run  # noqa: E402

for _command in (run, flower, env):
    cli.add_command(_command)

from .cli_mqtt import mqtt  # noqa: E402

cli.add_command(mqtt)
