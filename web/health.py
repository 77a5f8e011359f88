"""Liveness and readiness probes."""
from __future__ import annotations

from flask import Blueprint, current_app, jsonify

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz():
    checks: dict[str, str] = {}
    try:
        current_app.extensions["whisperq"].db.ping()
        checks["database"] = "ok"
    except Exception as exc:  # the reason goes to the operator
        checks["database"] = f"unreachable: {type(exc).__name__}"
    try:
        with current_app.extensions["celery"].connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"unreachable: {type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return jsonify({"status": "ready" if ready else "not_ready", "checks": checks}), 200 if ready else 503
