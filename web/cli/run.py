"""`whisperq run` (the whole stack, on an embedded broker unless CELERY_BROKER_URL is set),
`whisperq flower`, and `whisperq env` (the exports that point another shell at a running stack)."""

from __future__ import annotations

import os
import secrets
import shlex
import sys
from pathlib import Path

import click

from config import ConfigError, Settings, private_dir
from config.files import publish_broker, published_broker, withdraw_broker

from .context import ROOT, load_settings


@click.command()
@click.option("--procfile", default=str(ROOT / "Procfile"), show_default=True, help="Procfile to run.")
def run(procfile: str) -> None:
    """Start web, worker and Flower; with no CELERY_BROKER_URL, an embedded Redis too."""
    settings = load_settings()
    private_dir(settings.data_dir)
    for _, directory in settings.input_grants:
        if settings.data_dir in directory.parents:  # the inbox (the default): there from the start
            private_dir(directory)
    bindir = str(Path(sys.executable).parent)  # gunicorn, celery and supervisord live beside Python
    env = dict(
        os.environ, WHISPERQ_DATA_DIR=str(settings.data_dir), PATH=bindir + os.pathsep + os.environ.get("PATH", "")
    )
    from web.supervise import claim, run_supervised

    try:
        claimed = claim(settings.data_dir)  # stops what a killed run left here first
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    broker = None
    if not os.environ.get("CELERY_BROKER_URL"):  # not a broker another stack here published: ours
        from config.embedded import EmbeddedRedis

        broker = EmbeddedRedis(settings.data_dir / "redis")
        try:
            # supervisord runs it (first, stopping it last), and starts it again if it dies.
            env["CELERY_BROKER_URL"] = broker.configure(log_file=False)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from exc
        # Local callers of transcribe.delay() and `whisperq env` find it here (owner-only).
        publish_broker(settings.data_dir, env["CELERY_BROKER_URL"])
        click.echo(
            f"embedded Redis broker on 127.0.0.1:{broker.port} (data in {broker.directory}); it listens on "
            "loopback only: a single-host convenience. For workers on other machines set CELERY_BROKER_URL to "
            "a Redis or RabbitMQ they reach (docs/deployment/index.md: Running on several machines)"
        )
    # A single-user install: the upload page and the API work without a key. Set
    # WHISPERQ_ALLOW_ANONYMOUS=false (and make keys with `whisperq keys create`) to need one.
    env.setdefault("WHISPERQ_ALLOW_ANONYMOUS", "true")
    Settings.from_env(env)  # the processes will read the same; fail here, not in three places
    # One machine: its inference pool serves every model (each loaded on its first job). Across
    # machines each pool takes the queues of the models it should hold (docs/models.md).
    from config.celeryconfig import is_sqs, pool_of, queues_for

    env.setdefault("WHISPERQ_INFERENCE_QUEUES", ",".join(q for q in queues_for(settings) if pool_of(q) == "inference"))
    from models.db import Database

    Database(settings.database_url).upgrade()  # once, before three processes race for it
    flower_login = ""
    if not settings.flower_basic_auth:
        # Flower shows every job's arguments and results: never leave it open, even on loopback.
        password = secrets.token_urlsafe(12)
        env["FLOWER_BASIC_AUTH"] = f"admin:{password}"
        flower_login = f"  (user admin, password {password}; set FLOWER_BASIC_AUTH to choose)"
    flower_host = settings.flower_address if settings.flower_address not in ("", "0.0.0.0", "::") else "127.0.0.1"
    flower_host = f"[{flower_host}]" if ":" in flower_host else flower_host
    env["PORT"] = str(settings.port)
    flower_line = (
        f"http://{flower_host}:{settings.flower_port}/{flower_login}"
        if not is_sqs(env.get("CELERY_BROKER_URL", ""))
        else "not started: SQS carries no broadcast (see /metrics and `whisperq status`)"
    )
    click.echo(
        f"\n  upload form  http://{settings.host}:{settings.port}/\n"
        f"  API          http://{settings.host}:{settings.port}/v1/jobs\n"
        f"  Flower       {flower_line}\n"
        f"  data         {settings.data_dir}  (logs in {settings.data_dir / 'logs'})\n"
        f"  inbox        {', '.join(str(d) for _, d in settings.input_grants)}  (files for transcribe.delay(path))\n"
    )
    try:
        code = run_supervised(Path(procfile), ROOT, settings.data_dir, env, broker.command() if broker else None)
    finally:
        if broker is not None:
            withdraw_broker(settings.data_dir, env["CELERY_BROKER_URL"])
            broker.release()  # supervisord stopped it, after every process that used it
        claimed.close()
    sys.exit(code)


@click.command()
def flower() -> None:
    """Start Flower (the Procfile's flower line) with auth and state under the data dir."""
    from config.flower import flower_command

    try:
        argv, env = flower_command(load_settings(), dict(os.environ))
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc
    sys.stdout.flush()
    os.execve(argv[0], argv, env)  # Flower takes this process's place: the supervisor's signals reach it


@click.command()
def env() -> None:
    """Print the exports that make another shell's programs (transcribe.delay() callers,
    Celery tools) use the running service: eval "$(whisperq env)"."""
    settings = load_settings()
    broker = os.environ.get("CELERY_BROKER_URL") or published_broker(settings.data_dir)
    if not broker:
        raise click.ClickException(
            f"no service runs on the data dir {settings.data_dir} and CELERY_BROKER_URL is not set: start it with "
            "`make run` (or `whisperq run`), or set WHISPERQ_DATA_DIR to the data dir of the one that runs"
        )
    click.echo(f"export CELERY_BROKER_URL={shlex.quote(broker)}")
    click.echo(f"export WHISPERQ_DATA_DIR={shlex.quote(str(settings.data_dir))}")
    click.echo(f"# transcribe.delay(path) reads files under: {', '.join(str(d) for _, d in settings.input_grants)}")
