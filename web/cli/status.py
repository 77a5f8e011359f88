"""`whisperq status`: workers, queues and their depths, the oldest waiting job and the dead
letters, as an operator looks at them first (web.status builds it; GET /v1/admin/status
answers the same)."""

from __future__ import annotations

import json

import click

from .context import open_runtime


def _mb(value) -> str:
    return "?" if value is None else f"{value // (1024 * 1024):,} MB"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def status(as_json: bool) -> None:
    """Workers (from their heartbeats), queues and their depths, the oldest waiting job,
    dead letters: what an operator looks at first."""
    from web.status import pools_report

    rt = open_runtime()
    report = pools_report(rt, rt.broker.app)
    workers = report["workers"]
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"broker        {report['broker']}")
    click.echo(f"workers       {len(workers)} alive on {len(report['hosts'])} host(s)")
    for name, h in report["hosts"].items():
        pools = ", ".join(f"{n} {pool}" for pool, n in sorted(h["workers"].items()))
        click.echo(
            f"  host {name:<34} {pools}; disk {_mb(h['disk_free_bytes'])} free, "
            f"memory {_mb(h['memory_available_bytes'])} available"
        )
    for w in report["workers"]:
        click.echo(
            f"  {w['pool']:<10} {w['hostname']:<40} {w['slots']:>3} slots  up {w['up_seconds']} s, "
            f"seen {w['last_seen_seconds']} s ago"
        )
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
