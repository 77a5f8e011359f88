"""Admin API for operators: the pools' status and the dead-letter queue. Needs an admin API key
(`whisperq keys create --admin`) or `Authorization: Bearer $WHISPERQ_ADMIN_TOKEN`."""

from __future__ import annotations

from flask import Blueprint, current_app, g, jsonify, request

from models.errors import Forbidden, InvalidRequest, Unauthorized
from models.jobs.deadletter import get_dead, list_dead, purge, replay

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")


@bp.before_request
def _require_admin():
    found = g.get("principal")  # web.auth identified the caller, or refused a bad key
    if found is not None and found.admin:
        return
    if found is None or found.anonymous:
        raise Unauthorized(
            "send an admin API key (whisperq keys create --admin) or WHISPERQ_ADMIN_TOKEN as "
            "'Authorization: Bearer <key>'"
        )
    raise Forbidden(
        "this API key is not an admin key; the admin API needs one made with `whisperq keys create --admin`"
    )


def _rt():
    return current_app.extensions["whisperq"]


@bp.get("/status")
def status():
    """The pools' workers and hosts, the queues' depths, the jobs and dead letters (web.status):
    what `whisperq status` prints, on every broker (SQS has no Flower)."""
    from .status import pools_report

    return jsonify(pools_report(_rt(), current_app.extensions["celery"]))


@bp.get("/dead-letters")
def dead_letters():
    limit = request.args.get("limit", "100")
    if not (limit.isascii() and limit.isdigit()) or not 1 <= int(limit) <= 1000:  # "²".isdigit() too
        raise InvalidRequest("limit must be a whole number from 1 to 1000")
    return jsonify({"dead_letters": list_dead(_rt(), int(limit))})


@bp.get("/dead-letters/<job_id>")
def dead_letter(job_id: str):
    return jsonify(get_dead(_rt(), job_id))


@bp.post("/dead-letters/<job_id>/replay")
def replay_dead_letter(job_id: str):
    body = request.get_json(silent=True) if request.content_length else {}
    if not isinstance(body, dict):
        raise InvalidRequest('send nothing, or a JSON object such as {"model": "base"} to replay on another model')
    model = (body or {}).get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("model must be the name of a model or alias (GET /v1/models lists them)")
    job = replay(_rt(), job_id, model=model or None)
    return jsonify({"job_id": job.id, "status": job.status, "model": job.model}), 202


@bp.delete("/dead-letters/<job_id>")
def purge_dead_letter(job_id: str):
    get_dead(_rt(), job_id)  # 404 for an unknown id
    purge(_rt(), [job_id])
    return "", 204


@bp.delete("/dead-letters")
def purge_all():
    return jsonify({"purged": purge(_rt())})
