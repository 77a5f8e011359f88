"""`whisperq encryption`: keys in use, rotation, new keys (see models.security.crypto)."""

from __future__ import annotations

import json

import click

from .context import open_runtime


@click.group()
def encryption() -> None:
    """Encryption at rest: which key protects what, rotation, new keys.

    To rotate: put a new key first in WHISPERQ_ENCRYPTION_KEYS (keep the old one after it),
    restart every process, run `whisperq encryption rotate`, then drop the old key."""


@encryption.command("new-key")
@click.option("--id", "key_id", default=None, help="Key id (letters, digits, - and _); random by default.")
def new_key(key_id: str | None) -> None:
    """Print a fresh KEYID:BASE64KEY entry for WHISPERQ_ENCRYPTION_KEYS."""
    from models.security.crypto import new_key_line

    try:
        click.echo(new_key_line(key_id))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--id") from None


@encryption.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status(as_json: bool) -> None:
    """Count stored files and transcripts under each key id."""
    from models.maintenance.rotation import usage
    from models.security.crypto import current_keyring

    rt = open_runtime()
    keyring = current_keyring()
    found = usage(rt)
    files, transcripts = dict(found.files), dict(found.transcripts)
    report = {
        "active": keyring.active,
        "configured": keyring.ids,
        "source": keyring.source,
        "files": files,
        "transcripts": transcripts,
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"active key    {keyring.active}  (configured: {', '.join(keyring.ids)}; from {keyring.source})")
    for what, counts in (("files", files), ("transcripts", transcripts)):
        click.echo(f"{what:<13} " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    stale = sorted({k for k in (*found.files, *found.transcripts) if k != keyring.active})
    if stale:
        click.echo(f"not under the active key: {', '.join(stale)}; run `whisperq encryption rotate`")


@encryption.command("rotate")
def rotate() -> None:
    """Re-encrypt every stored file and transcript not under the active key (safe while
    the service runs). Exits non-zero if anything could not be read."""
    from models.maintenance.rotation import rotate as run_rotation
    from models.security.crypto import current_keyring

    rt = open_runtime()
    click.echo(f"re-encrypting under key {current_keyring().active} ...")
    report = run_rotation(rt, progress=click.echo)
    click.echo(
        f"files         {report.files_rewritten} re-encrypted, {report.files_current} already current, "
        f"{report.files_gone} deleted meanwhile"
    )
    click.echo(
        f"transcripts   {report.transcripts_rewritten} re-encrypted, {report.transcripts_current} already current"
    )
    for failure in report.failures[:50]:
        click.echo(f"failed: {failure}", err=True)
    if report.failures:
        raise click.ClickException(
            f"{len(report.failures)} item(s) could not be decrypted; add their keys to "
            "WHISPERQ_ENCRYPTION_KEYS and run rotate again"
        )
    click.echo("done: the old keys can be removed from WHISPERQ_ENCRYPTION_KEYS once every process has restarted")
