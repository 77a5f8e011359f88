"""Liveness and readiness probes."""

from __future__ import annotations

import time

from flask import Blueprint, current_app, jsonify

bp = Blueprint("health", __name__)

# A web process that has just started gives the workers this long to send a heartbeat.
STARTUP_GRACE = 60.0
_started = time.monotonic()


@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    """Ready when the database and the broker answer, the data dir is above its disk
    floor and an inference worker is alive (after a start-up grace); else 503 with why.
    `models` says how many live inference workers serve each model (0: a model other than
    the default is refused at submission)."""
    from models.access.admission import free_bytes
    from models.jobs.workers import alive

    rt = current_app.extensions["whisperq"]
    checks: dict[str, str] = {}
    try:
        rt.db.ping()
        checks["database"] = "ok"
    except Exception as exc:  # the reason goes to the operator
        checks["database"] = f"unreachable: {type(exc).__name__}"
    try:
        from tasks.broker.transport import transport_for

        transport_for(current_app.extensions["celery"]).ping()
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"unreachable: {type(exc).__name__}"
    free_mb = free_bytes(rt.settings.data_dir) // (1024 * 1024)
    checks["disk"] = (
        "ok"
        if free_mb >= rt.settings.disk_floor_mb
        else (f"{free_mb} MB free, under WHISPERQ_DISK_FLOOR_MB={rt.settings.disk_floor_mb}")
    )
    served: dict[str, int] = {}
    hosts: dict[str, dict] = {}
    analyses: dict[str, object] = {"workers": 0, "installed": installed_analyses()}
    if checks["database"] == "ok":
        everyone = alive(rt)
        # the analysis pool does not decide readiness: a job's transcript is stored without it
        analyses["workers"] = sum(w["pool"] == "analysis" for w in everyone)
        hosts = _hosts(rt, everyone)
        inference = [w for w in everyone if w["pool"] == "inference"]
        served = {spec.name: sum(spec.name in w["models"] for w in inference) for spec in rt.settings.models}
        workers = len(inference)
        if workers:
            checks["inference_workers"] = "ok"
        elif time.monotonic() - _started < STARTUP_GRACE:
            checks["inference_workers"] = "ok"  # still starting: no heartbeat expected yet
        else:
            checks["inference_workers"] = "none alive: no inference worker has sent a heartbeat in 30 s"
    ready = all(v == "ok" for v in checks.values())
    return jsonify(
        {
            "status": "ready" if ready else "not_ready",
            "checks": checks,
            "models": served,
            "hosts": hosts,
            "analyses": analyses,
        }
    ), 200 if ready else 503


def installed_analyses() -> list[str]:
    """The analyses (models.analysis) a job may ask for here: those whose libraries are installed."""
    from models.analysis import MODULES, analysis

    return [name for name in MODULES if analysis(name).missing() is None]


def _hosts(rt, workers: list[dict]) -> dict[str, dict]:
    """The workers of each host and that host's own disk and memory, from their heartbeats: a
    worker host low on disk shows here (it does not make this web process unready)."""
    from models.jobs.workers import by_host

    floor = rt.settings.disk_floor_mb * 1024 * 1024
    out = {}
    for name, host in by_host(workers).items():
        free = host.get("disk_free_bytes")
        disk = (
            "unknown"
            if free is None
            else "ok"
            if free >= floor
            else (f"{free // (1024 * 1024)} MB free, under WHISPERQ_DISK_FLOOR_MB={rt.settings.disk_floor_mb}")
        )
        out[name] = {
            "workers": host["workers"],
            "models": host["models"],
            "disk": disk,
            "disk_free_bytes": free,
            "memory_available_bytes": host.get("memory_available_bytes"),
        }
    return out
