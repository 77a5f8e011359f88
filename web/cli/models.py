"""`whisperq models`: the models served, their weights and versions; hot-swap, roll back, and
compare a shadow model with its primary (see models.registry.swaps and models.jobs.shadows)."""

from __future__ import annotations

import json

import click

from .context import open_runtime


@click.group()
def models() -> None:
    """Models: list them, swap a model's weights without a restart, roll back, compare."""


@models.command("list")
def list_models() -> None:
    """Each model with the weights and version it runs now, its aliases and shadow."""
    from models.registry.catalog import version_of
    from models.registry.swaps import history

    rt = open_runtime()
    settings = rt.settings
    for spec in settings.models:
        active = rt.active_spec(spec.name)
        swapped = " (swapped)" if active.weights != spec.weights else ""
        swaps = history(rt.db, spec.name)
        newest = swaps[-1] if swaps else None
        if newest is not None and newest.weights != active.weights:  # models.registry.swaps refused it
            swapped += (
                f" (the swap to {newest.weights} is refused: its weights changed after it was recorded; "
                f"`whisperq models swap {spec.name} {newest.weights}` records them as they are now)"
            )
        default = " [default]" if spec.name == settings.default_model and not settings.routes.default else ""
        click.echo(
            f"{spec.name}{default}: {spec.engine}, {active.weights}{swapped}, "
            f"{version_of(active, settings.data_dir)[:19]}"
        )
    for alias, variants in settings.routes.aliases:
        default = " [default]" if alias == settings.routes.default else ""
        click.echo(f"{alias}{default}: alias of " + ", ".join(f"{m} ({w})" for m, w in variants))
    for primary, candidate, percent in settings.routes.shadows:
        click.echo(f"{primary}: {percent} % of its jobs decoded again by {candidate} (shadow)")


@models.command("swap")
@click.argument("name")
@click.argument("weights")
def swap_weights(name: str, weights: str) -> None:
    """Give the model NAME new WEIGHTS (a CTranslate2 directory, a checkpoint, or bundled:NAME).

    Its inference workers load them as the next jobs start, within seconds, and run new jobs
    on them; jobs already running finish on the weights they began with. No restart."""
    from models.errors import WhisperqError
    from models.registry.swaps import swap

    rt = open_runtime()
    try:
        row = swap(rt.settings, rt.db, name, weights)
    except (WhisperqError, LookupError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{row.model} now runs {row.weights} ({row.version[:19]}); `whisperq models rollback {row.model}` undoes it"
    )


@models.command("rollback")
@click.argument("name")
def rollback_weights(name: str) -> None:
    """Bring back the weights the model NAME ran before its last swap."""
    from models.errors import WhisperqError
    from models.registry.swaps import rollback

    rt = open_runtime()
    try:
        row = rollback(rt.settings, rt.db, name)
    except (WhisperqError, LookupError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{row.model} rolled back to {row.weights} ({row.version[:19]})")


@models.command("history")
@click.argument("name")
def weights_history(name: str) -> None:
    """Every swap and rollback of the model NAME, oldest first, as JSON lines."""
    from models.registry.swaps import history

    rt = open_runtime()
    try:
        rt.settings.model(name)
    except LookupError as exc:
        raise click.ClickException(str(exc)) from exc
    for row in history(rt.db, name):
        click.echo(json.dumps(row.to_dict()))


@models.command("compare")
@click.option("--model", default=None, help="Only pairs with this model (as primary or candidate).")
def compare_models(model: str | None) -> None:
    """How far shadow models' transcripts are from their primaries': word error rate per pair."""
    from models.jobs.shadows import compare

    rows = compare(open_runtime(), model)
    if not rows:
        click.echo(
            "no shadow transcripts compared yet (WHISPERQ_SHADOW sends a share of a model's jobs to a candidate)"
        )
    for row in rows:
        click.echo(json.dumps(row))
