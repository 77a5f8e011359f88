"""What an operator looks at first, on every broker (SQS has no Flower): each pool's live workers
and hosts (from their heartbeats in the database), each queue's depth by tier (from the broker's
transport) and its oldest waiting job, the jobs by status and the dead letters.
`whisperq status` prints it; `GET /v1/admin/status` answers it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from models.jobs.record import utcnow
from models.jobs.workers import alive, by_host
from models.runtime import Runtime
from tasks.broker.transport import transport_for


def pools_report(rt: Runtime, celery: Any, now: datetime | None = None) -> dict[str, Any]:
    """The report; the broker's part says why it is missing when the broker does not answer."""
    from web.metrics import database_figures

    now = now or utcnow()
    workers = alive(rt, now=now)
    figures = database_figures(rt, now)
    try:
        depths, broker_error = transport_for(celery).depths(), None
    except Exception as exc:  # still show what the database knows
        depths, broker_error = {}, f"unreachable: {type(exc).__name__}: {exc}"
    pools: dict[str, dict[str, Any]] = {}
    for w in workers:
        pool = pools.setdefault(w["pool"], {"workers": 0, "slots": 0, "models": []})
        pool["workers"] += 1
        pool["slots"] += int(w["slots"] or 0)
        pool["models"] = sorted({*pool["models"], *(w.get("models") or ())})
    report: dict[str, Any] = {
        "broker": rt.settings.describe()["broker_url"] if broker_error is None else broker_error,
        "transport": transport_for(celery).name,
        "pools": pools,
        "workers": [
            {
                "pool": w["pool"],
                "hostname": w["hostname"],
                "host": w["host"],
                "slots": w["slots"],
                "up_seconds": round((now - w["started_at"]).total_seconds()),
                "last_seen_seconds": round((now - w["last_seen_at"]).total_seconds(), 1),
            }
            for w in workers
        ],
        "hosts": {
            name: {k: h.get(k) for k in ("workers", "models", "disk_free_bytes", "memory_available_bytes")}
            for name, h in by_host(workers).items()
        },
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
    return report
