"""`whisperq dataset`: the jobs collected as training data, exported for fine-tuning
(models.maintenance.dataset)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from .context import open_runtime


@click.group()
def dataset() -> None:
    """Training data: the audio and transcripts (corrected where a client corrected them) of
    the jobs collected (`whisperq keys collect`, or a job's `collect=true`)."""


def _since(_ctx, _param, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a date or time; give one such as 2026-11-01 or "
            "2026-11-01T08:00:00Z (UTC unless it names its zone)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


@dataset.command("export")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option(
    "--since",
    callback=_since,
    metavar="DATE",
    help="Only jobs made on or after this date or time (ISO 8601; UTC unless it names its zone).",
)
@click.option("--model", default=None, help="Only jobs of this model (a name of WHISPERQ_MODELS).")
@click.option("--corrected-only", is_flag=True, help="Only jobs whose transcript a client corrected.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in OUT_DIR (nothing else may be there).")
def export(out_dir: Path, since: datetime | None, model: str | None, corrected_only: bool, overwrite: bool) -> None:
    """Write the collected COMPLETED jobs whose audio is still stored into OUT_DIR as a Hugging
    Face `audiofolder` dataset: data/<job id>.wav (16 kHz mono) and metadata.jsonl."""
    from models.errors import WhisperqError
    from models.maintenance.dataset import export_dataset

    try:
        report = export_dataset(
            open_runtime(),
            out_dir,
            since=since,
            model=model,
            corrected_only=corrected_only,
            overwrite=overwrite,
            progress=lambda line: click.echo(line, err=True),
        )
    except WhisperqError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(
            f"cannot write the export into {out_dir}: {exc.strerror or exc} "
            f"({exc.filename or out_dir}); give a directory you may write to"
        ) from exc
    click.echo(
        f"exported {_jobs(report.exported)} ({_length(report.seconds)} of audio, {report.corrected} "
        f"corrected) to {out_dir}"
    )
    skipped = sum(report.skipped.values())
    click.echo(
        f"skipped {skipped} collected {'job' if skipped == 1 else 'jobs'}"
        + (": " + ", ".join(f"{n} {why}" for why, n in report.skipped.most_common()) if skipped else "")
    )
    if report.exported:
        click.echo(f'load it with datasets.load_dataset("audiofolder", data_dir="{out_dir}")', err=True)


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def _length(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"
