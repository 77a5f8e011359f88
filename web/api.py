"""The JSON API: submit a job, read it, download its transcript."""
from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify, request, url_for

from models.errors import InvalidRequest, JobNotReady, UnsupportedMediaType
from models.formats import FORMATS, MIME_TYPES, render
from models.jobs import get_job
from models.runtime import Runtime

from .uploads import submit_upload

bp = Blueprint("api", __name__, url_prefix="/v1")


def runtime() -> Runtime:
    return current_app.extensions["whisperq"]


@bp.post("/jobs")
def create():
    if request.mimetype != "multipart/form-data":
        raise UnsupportedMediaType(
            f"send the audio as multipart/form-data with the file in field 'file' (got {request.mimetype or 'no Content-Type'})"
        )
    if "boundary" not in request.mimetype_params:
        raise InvalidRequest("malformed multipart body: the Content-Type has no boundary")
    job, created = submit_upload(
        runtime(), current_app.extensions["celery"], request.files.get("file"), request.form,
        files=request.files, idempotency_key=request.headers.get("Idempotency-Key"),
    )
    status_url = url_for("api.show", job_id=job.id, _external=True)
    body = {
        "job_id": job.id,
        "status": job.status,
        "status_url": status_url,
        "transcript_url": url_for("api.transcript", job_id=job.id, _external=True),
        "created_at": job.to_dict()["created_at"],
    }
    return jsonify(body), 202 if created else 200, {"Location": status_url}


@bp.get("/jobs/<job_id>")
def show(job_id: str):
    job = get_job(runtime(), job_id)
    body = job.to_dict()
    body["status_url"] = url_for("api.show", job_id=job.id, _external=True)
    body["transcript_urls"] = {f: url_for("api.transcript", job_id=job.id, format=f, _external=True) for f in FORMATS}
    return jsonify(body)


@bp.get("/jobs/<job_id>/transcript")
def transcript(job_id: str):
    fmt = (request.args.get("format") or "txt").lower()
    if fmt not in FORMATS:
        raise InvalidRequest(f"format {fmt!r} is not one of: {', '.join(FORMATS)}")
    job = get_job(runtime(), job_id)
    result = job.result()
    if result is None:
        raise JobNotReady(f"job {job_id} is {job.status}; the transcript is available once it is COMPLETED")
    resp = Response(render(result, fmt), mimetype=MIME_TYPES[fmt].split(";")[0])
    resp.headers["Content-Type"] = MIME_TYPES[fmt]
    if request.args.get("download"):
        resp.headers["Content-Disposition"] = f'attachment; filename="{job_id}.{fmt}"'
    return resp
