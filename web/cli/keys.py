"""`whisperq keys`: create, list and revoke API keys, and show what they used (see
models.access.apikeys and models.access.usage)."""

from __future__ import annotations

import json

import click

from models.access.apikeys import TIERS

from .context import open_runtime


@click.group()
def keys() -> None:
    """API keys: each client's own jobs, tier (priority and rate) and admin rights."""


@keys.command("create")
@click.option("--name", required=True, help="Who or what uses the key (shown in `keys list`).")
@click.option(
    "--tier",
    type=click.Choice(list(TIERS)),
    default="standard",
    show_default=True,
    help="premium: priority up to high; standard: up to normal; batch: low only.",
)
@click.option("--admin", is_flag=True, help="Sees every job and reaches the admin API (dead letters).")
@click.option(
    "--collect",
    is_flag=True,
    help="Every job of this key is training data (`whisperq dataset export`); `keys collect` changes it.",
)
@click.option(
    "--s3-source",
    "s3_sources",
    multiple=True,
    metavar="BUCKET[/PREFIX]",
    help="An S3 bucket (and folder) its audio_url=s3://… may name, read with the deployment's credentials; "
    "repeat for more; `keys s3-sources` changes them.",
)
def create(name: str, tier: str, admin: bool, collect: bool, s3_sources: tuple[str, ...]) -> None:
    """Make a key and print it once: only its hash is stored."""
    from models.access.apikeys import create_key
    from models.errors import WhisperqError

    try:
        record, token = create_key(open_runtime(), name, tier, admin=admin, collect=collect, s3_sources=s3_sources)
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(token)
    click.echo(
        f"key {record.id} ({record.name}, tier {record.tier}{', admin' if record.admin else ''}"
        f"{', collects training data' if record.collect else ''}"
        f"{', S3 sources ' + ', '.join(record.s3_sources) if record.s3_sources else ''}): "
        "shown this once; keep it in a secret store",
        err=True,
    )
    click.echo(
        f"webhook signing secret for this key's jobs: {record.webhook_secret}\n"
        "  (shown this once too; `whisperq keys rotate-webhook-secret` makes a new one)",
        err=True,
    )


@keys.command("rotate-webhook-secret")
@click.argument("key")
@click.option(
    "--overlap",
    default="24h",
    show_default=True,
    help="How long the old secret keeps signing beside the new one (seconds, or with m/h/d; 0 stops it now).",
)
def rotate_secret(key: str, overlap: str) -> None:
    """Give a key (by id or the start of the key) a new webhook signing secret; prints it once."""
    from datetime import timedelta

    from config.env import ConfigError, Env
    from models.access.apikeys import rotate_webhook_secret
    from models.errors import WhisperqError

    try:
        seconds = Env({"--overlap": overlap}).duration("--overlap", 0.0) or 0.0
        record, secret = rotate_webhook_secret(open_runtime(), key, overlap=timedelta(seconds=seconds))
    except (WhisperqError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(secret)
    until = record.previous_webhook_secret_until
    click.echo(
        f"key {record.id} ({record.name}): new webhook secret, shown this once; "
        + (
            f"the old one also signs until {until.isoformat(timespec='seconds')}"
            if until
            else "the old one no longer signs"
        ),
        err=True,
    )


@keys.command("list")
@click.option("--all", "include_revoked", is_flag=True, help="Include revoked keys.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def list_(include_revoked: bool, as_json: bool) -> None:
    """The keys: id, start of the key, name, tier, last use."""
    from models.access.apikeys import list_keys

    found = [k.to_dict() for k in list_keys(open_runtime(), include_revoked=include_revoked)]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for k in found:
        state = f"revoked {k['revoked_at']}" if k["revoked_at"] else f"last used {k['last_used_at'] or 'never'}"
        click.echo(
            f"{k['id']}  {k['key']:<12} {k['tier']:<9}{' admin' if k['admin'] else '':<6}"
            f"{' collect' if k['collect'] else '':<8} {k['name']}  ({state})"
            + (f"  s3: {', '.join(k['s3_sources'])}" if k["s3_sources"] else "")
        )


@keys.command("revoke")
@click.argument("key")
def revoke(key: str) -> None:
    """Revoke a key by its id or the start of the key; its next request gets 401."""
    from models.access.apikeys import revoke_key
    from models.errors import WhisperqError

    try:
        record = revoke_key(open_runtime(), key)
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"revoked {record.id} ({record.name})")


@keys.command("collect")
@click.argument("key")
@click.argument("state", type=click.Choice(["on", "off"]))
def collect(key: str, state: str) -> None:
    """Turn training-data logging on or off for every job a key (by id or the start of the
    key) submits from now on; a job may also ask for it with `collect=true`."""
    from models.access.apikeys import set_collect
    from models.errors import WhisperqError

    try:
        record = set_collect(open_runtime(), key, state == "on")
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"key {record.id} ({record.name}): its new jobs are {'' if record.collect else 'not '}collected "
        "as training data"
    )


@keys.command("s3-sources")
@click.argument("key")
@click.argument("entries", nargs=-1, metavar="[BUCKET[/PREFIX]]...")
@click.option("--none", "clear", is_flag=True, help="Take every S3 source away: the key may name no S3 object.")
def s3_sources(key: str, entries: tuple[str, ...], clear: bool) -> None:
    """Show, or replace, the S3 buckets and prefixes a key (by id or the start of the key) may name
    in an audio_url=s3://BUCKET/KEY: the objects below them, on whole folder names, never the
    service's own WHISPERQ_STORAGE prefix; read with the deployment's AWS credentials."""
    from models.access.apikeys import find_key, set_s3_sources
    from models.errors import WhisperqError

    if entries and clear:
        raise click.UsageError("give entries or --none, not both")
    try:
        rt = open_runtime()
        record = set_s3_sources(rt, key, () if clear else entries) if entries or clear else find_key(rt, key)
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc
    sources = list(record.s3_sources or [])
    click.echo(
        f"key {record.id} ({record.name}): "
        + (f"audio_url may name s3:// objects under {', '.join(sources)}" if sources else "no S3 sources")
    )


@keys.command("hotwords")
@click.argument("key")
@click.argument("words", required=False)
@click.option("--none", "clear", is_flag=True, help="Take the key's list away.")
def hotwords(key: str, words: str | None, clear: bool) -> None:
    """Show, or set, the words a key's (by id or the start of the key) jobs listen for when a job
    names none: names and jargon, separated by commas ("Kubernetes, Anthropic, Siobhan")."""
    from models.access.apikeys import find_key, set_hotwords
    from models.errors import WhisperqError
    from models.pipeline.options import parse_hotwords

    if words and clear:
        raise click.UsageError("give words or --none, not both")
    try:
        rt = open_runtime()
        record = (
            set_hotwords(rt, key, None if clear else parse_hotwords(words)) if words or clear else find_key(rt, key)
        )
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"key {record.id} ({record.name}): " + (f"hotwords {record.hotwords}" if record.hotwords else "no hotwords")
    )


@keys.command("usage")
@click.argument("key", required=False)
@click.option("--from", "first", metavar="YYYY-MM-DD", help="First UTC day (default: the first of this month).")
@click.option("--to", "last", metavar="YYYY-MM-DD", help="Last UTC day, included (default: today).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (as GET /v1/usage answers) instead of a table.")
def usage(key: str | None, first: str | None, last: str | None, as_json: bool) -> None:
    """Audio seconds and jobs per UTC day of one key (by id or the start of the key) or of
    every key, and this month's quota; what counts is in models/access/usage.py."""
    from models.access.apikeys import find_key
    from models.access.billing import usage_report
    from models.access.usage import ALL
    from models.errors import WhisperqError
    from models.jobs.record import utcnow
    from web.usage import days_asked

    rt = open_runtime()
    try:
        days = days_asked({k: v for k, v in (("from", first), ("to", last)) if v}, utcnow().date())
        found = usage_report(rt, *days, owner=find_key(rt, key).id if key else ALL)
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    click.echo(
        f"usage from {found['from']} to {found['to']} (UTC days; billed: completed jobs, and what cancelled "
        "ones transcribed)"
    )
    for entry in found["keys"]:
        total, quota = entry["total"], entry["quota"]
        click.echo(
            f"\n{entry['key_id'] or '(no key)'}  {entry['name']}  {entry['tier'] or ''}"
            f"{'  revoked' if entry['revoked'] else ''}"
        )
        for row in entry["days"] + [dict(total, date="total")]:
            click.echo(
                f"  {row['date']:<10}  {row['jobs']:>6} jobs  {row['audio_seconds']:>12.3f} s"
                f"  {row['in_flight_jobs']:>4} in flight ({row['in_flight_audio_seconds']:.3f} s)"
                f"  {row['unbilled_jobs']:>4} not billed"
            )
        if quota:
            click.echo(
                f"  quota {quota['month']}: {quota['used_audio_seconds']:.3f} s used + "
                f"{quota['in_flight_audio_seconds']:.3f} s in flight of {quota['audio_seconds']:.0f} s "
                f"({quota['audio_hours']:g} h, tier {quota['tier']}); {quota['remaining_audio_seconds']:.3f} s "
                f"left; resets {quota['resets_at']}"
            )
