"""The upload page and the job page for people using a browser."""
from __future__ import annotations

from flask import Blueprint, current_app, redirect, render_template, request, url_for

from config import LANGUAGES, PRIORITIES
from models.errors import WhisperqError
from models.formats import FORMATS
from models.jobs import get_job

from .uploads import submit_upload

bp = Blueprint("pages", __name__)


def _form(error: str | None = None, status: int = 200):
    settings = current_app.extensions["whisperq"].settings
    return (
        render_template(
            "index.html",
            error=error,
            priorities=PRIORITIES,
            languages=sorted(LANGUAGES),
            max_mb=settings.max_upload_mb,
            form=request.form,
        ),
        status,
    )


@bp.get("/")
def index():
    return _form()


@bp.post("/")
def upload():
    try:
        job, _ = submit_upload(
            current_app.extensions["whisperq"], current_app.extensions["celery"], request.files.get("file"),
            request.form, files=request.files,
        )
    except WhisperqError as exc:
        return _form(str(exc), exc.http_status)
    return redirect(url_for("pages.job", job_id=job.id), code=303)


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    job = get_job(current_app.extensions["whisperq"], job_id)
    return render_template("job.html", job=job.to_dict(), formats=FORMATS)
