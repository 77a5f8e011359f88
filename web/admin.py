"""Admin API for operators: the dead-letter queue. Needs `Authorization: Bearer
$WHISPERQ_ADMIN_TOKEN`; without that setting the admin API is off."""
from __future__ import annotations

import hmac

from flask import Blueprint, current_app, jsonify, request

from models.deadletter import get_dead, list_dead, purge, replay
from models.errors import Forbidden, InvalidRequest, Unauthorized

bp = Blueprint("admin", __name__, url_prefix="/v1/admin")


@bp.before_request
def _require_admin():
    token = current_app.extensions["whisperq"].settings.admin_token
    if not token:
        raise Forbidden("the admin API is off; set WHISPERQ_ADMIN_TOKEN to turn it on")
    sent = request.headers.get("Authorization", "")
    if not sent.startswith("Bearer ") or not hmac.compare_digest(sent[7:].encode(), token.encode()):
        raise Unauthorized("send the admin token as 'Authorization: Bearer <WHISPERQ_ADMIN_TOKEN>'")


def _rt():
    return current_app.extensions["whisperq"]


@bp.get("/dead-letters")
def dead_letters():
    limit = request.args.get("limit", "100")
    if not limit.isdigit() or not 1 <= int(limit) <= 1000:
        raise InvalidRequest("limit must be a whole number from 1 to 1000")
    return jsonify({"dead_letters": list_dead(_rt(), int(limit))})


@bp.get("/dead-letters/<job_id>")
def dead_letter(job_id: str):
    return jsonify(get_dead(_rt(), job_id))


@bp.post("/dead-letters/<job_id>/replay")
def replay_dead_letter(job_id: str):
    job = replay(_rt(), current_app.extensions["celery"], job_id)
    return jsonify({"job_id": job.id, "status": job.status}), 202


@bp.delete("/dead-letters/<job_id>")
def purge_dead_letter(job_id: str):
    get_dead(_rt(), job_id)  # 404 for an unknown id
    purge(_rt(), [job_id])
    return "", 204


@bp.delete("/dead-letters")
def purge_all():
    return jsonify({"purged": purge(_rt())})
