"""Batches: `POST /v1/batches` (many audio URLs as JSON, or many files as multipart, one
request), `GET /v1/batches/<id>` (its state and its jobs, a page at a time) and
`POST /v1/batches/<id>/cancel`.

A batch is validated whole before anything is stored: every item through the one door
(models.pipeline.door.admit, as POST /v1/jobs: its URL through the address guard or its
file's name, size, container and length by its header, its options, the tier's priority),
then the queue budget and the key's monthly quota with all of its jobs counted. Then its row and
all its jobs (with the files' audio) go in in one transaction, and are published. A
refusal stores nothing: the files spooled for it are removed when the request ends."""

from __future__ import annotations

import hashlib
import json
import logging

from flask import Blueprint, current_app, jsonify, request, url_for

from models.access.apikeys import Principal
from models.delivery.notify import deliveries_of
from models.delivery.outbound import check_url
from models.errors import InvalidRequest, JobNotReady, UnsupportedMediaType, WhisperqError
from models.jobs.batches import Standing, batch_jobs, get_batch, unfinished_ids
from models.jobs.operations import cancel_job
from models.jobs.record import Job, JobStatus
from models.pipeline import door, intake
from models.pipeline.door import Admission, Submission
from models.pipeline.request import names_for
from models.runtime import Runtime

from .admission import admit_submission
from .api import listing_args
from .auth import current, scope
from .uploads import check_fields, sealed_upload

bp = Blueprint("batches", __name__, url_prefix="/v1")
log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024  # a hundred URLs with their options; more than one job's 64 KiB
SHARED = tuple(f for f in names_for("batch") if f != "callback_url")  # for every item; callback_url is the batch's
ITEM = ("audio_url", "callback_url", *(f for f in SHARED if f != "priority"))  # one priority per batch
EXAMPLE = '{"audio_urls": ["https://example.com/a.mp3", "https://example.com/b.mp3"]}'


def runtime() -> Runtime:
    return current_app.extensions["whisperq"]


def check_batch(rt: Runtime, who: Principal, body) -> tuple[list[Admission], str | None]:
    """Each job of a JSON batch through the one door (its URL, its options, the tier's
    priority), the batch's callback_url; or InvalidRequest naming the item and what to change."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"send a JSON object such as {EXAMPLE}")
    unknown = sorted(set(body) - {"audio_urls", "items", "callback_url", *SHARED})
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(repr(u) for u in unknown)}; a batch takes 'audio_urls' "
            f"or 'items', 'callback_url' and the options {', '.join(repr(f) for f in SHARED)}"
        )
    if ("audio_urls" in body) == ("items" in body):
        raise InvalidRequest(
            f"give either 'audio_urls' (a list of URLs) or 'items' (a list of objects with "
            f"'audio_url' and options), not {'both' if 'items' in body else 'neither'}: {EXAMPLE}"
        )
    raw = body.get("items") if "items" in body else body.get("audio_urls")
    if not isinstance(raw, list):
        raise InvalidRequest(f"the batch's list of audio is not a list: {EXAMPLE}")
    door.check_batch_size(rt, len(raw))
    shared = {k: v for k, v in body.items() if k in SHARED}
    callback = _callback(rt, body.get("callback_url"))
    admitted = []
    for n, entry in enumerate(raw):
        entry = {"audio_url": entry} if "audio_urls" in body else entry
        where = f"{'items' if 'items' in body else 'audio_urls'}[{n}]"
        if not isinstance(entry, dict):
            raise InvalidRequest(f'{where} must be an object such as {{"audio_url": "https://example.com/a.mp3"}}')
        wrong = sorted(set(entry) - set(ITEM))
        if wrong:
            raise InvalidRequest(
                f"{where}: unknown field(s) {', '.join(repr(w) for w in wrong)}; an item takes "
                f"{', '.join(repr(f) for f in ITEM)} (the priority is the batch's)"
            )
        url = entry.get("audio_url")
        try:
            if not isinstance(url, str) or not url.strip():
                raise InvalidRequest("audio_url is missing: give the http(s) URL of the audio")
            fields = {**shared, **{k: v for k, v in entry.items() if k != "audio_url"}}
            admitted.append(
                door.admit(rt, Submission(who, "batch", fields=fields, audio_url=url.strip()), queue=False, quota=False)
            )
        except WhisperqError as exc:
            exc.args = (f"{where}: {exc}", *exc.args[1:])
            raise
    return admitted, callback


def _callback(rt: Runtime, value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest("callback_url must be a string: the http(s) URL to POST batch.completed to")
    return check_url(value.strip(), rt.settings, "callback_url") if value.strip() else None


@bp.post("/batches")
def create():
    admit_submission("batch")  # before the body is read
    rt, who = runtime(), current()
    key = door.scoped_key(who, "batch", request.headers.get("Idempotency-Key"))
    if request.mimetype == "multipart/form-data":
        if "boundary" not in request.mimetype_params:
            raise InvalidRequest("malformed multipart body: the Content-Type has no boundary")
        request.max_content_length = rt.settings.max_batch_upload_bytes
        request.max_form_parts = rt.settings.max_batch_items + len(SHARED) + 2
        # The files not moved into the store are removed as the request ends (UploadRequest).
        return _create(rt, who, key, *check_files(rt, who, request.form, request.files))
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(
            f"send the batch as JSON (Content-Type: application/json), such as {EXAMPLE}, or "
            "its files as multipart/form-data, each in a field named 'file' "
            f"(got {request.mimetype or 'no Content-Type'})"
        )
    request.max_content_length = MAX_BODY_BYTES
    try:
        body = json.loads(request.get_data(cache=False) or b"null")
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON ({exc})") from None
    admitted, callback = check_batch(rt, who, body)
    items = [[a.submission.audio_url, a.options.fields()] for a in admitted]
    fingerprint = hashlib.sha256(json.dumps(["batch", callback, items], sort_keys=True).encode()).hexdigest()
    return _create(rt, who, key, admitted, callback, fingerprint)


def check_files(rt: Runtime, who: Principal, form, files):
    """A batch of uploaded files (multipart: each in a field 'file', the batch's options and
    callback_url as fields): each file through the one door as POST /v1/jobs takes an upload,
    measured by its header. Returns what _create takes."""
    check_fields(form, files)  # a single upload's fields: 'file' (here one per file) and the options
    uploads = files.getlist("file")
    if not uploads:
        raise InvalidRequest("no audio file: send each file in a multipart field named 'file'")
    door.check_batch_size(rt, len(uploads), "files")
    callback = _callback(rt, form.get("callback_url"))
    fields = {k: v for k, v in form.items() if k != "callback_url"}
    admitted, digest = [], hashlib.sha256(json.dumps(["files", callback, fields], sort_keys=True).encode())
    for n, upload in enumerate(uploads):
        where = f"file[{n}]" + (f" ({upload.filename!r})" if upload.filename else "")
        try:
            if not upload.filename:
                raise InvalidRequest("the file has no name: send it with a UTF-8 file name")
            spooled = sealed_upload(rt, upload)
            admitted.append(
                door.admit(
                    rt,
                    Submission(who, "batch", fields=fields, upload=spooled, filename=upload.filename),
                    queue=False,
                    quota=False,
                )
            )
        except WhisperqError as exc:
            exc.args = (f"{where}: {exc}", *exc.args[1:])
            raise
        digest.update(spooled.sha256.digest() + upload.filename.encode())
    return admitted, callback, digest.hexdigest()


def _create(
    rt: Runtime, who: Principal, key: str | None, admitted: list[Admission], callback: str | None, fingerprint: str
):
    """The whole batch through the one door (the queue budget and the key's share and monthly
    quota with all its jobs counted, recorded in one transaction, published)."""
    batch, created = intake.accept_batch(rt, who, admitted, callback, key, fingerprint)
    if created:
        log.info("batch %s: %d jobs queued (priority %s)", batch.id, batch.total, admitted[0].priority)
    return _accepted(get_batch(rt, batch.id, owner=scope()), 202 if created else 200)


def _accepted(found: Standing, status: int):
    body = batch_body(found)
    return jsonify(body), status, {"Location": body["status_url"]}


def batch_body(found: Standing, limit: int = 50, after: str | None = None, status: str | None = None) -> dict:
    """The batch as the API shows it: its counts, a page of its jobs and where to go next."""
    rt = runtime()
    body = found.to_dict()
    bid = found.batch.id
    body["status_url"] = url_for("batches.show", batch_id=bid, _external=True)
    body["cancel_url"] = url_for("batches.cancel", batch_id=bid, _external=True)
    jobs, following = batch_jobs(rt, bid, limit, after, status)
    body["jobs"] = [_listed(job) for job in jobs]
    body["next_cursor"] = following
    body["next_url"] = (
        None
        if following is None
        else url_for(
            "batches.show",
            batch_id=bid,
            cursor=following,
            limit=limit,
            _external=True,
            **({"status": status} if status else {}),
        )
    )
    if found.batch.callback_url:
        body["webhook_deliveries"] = deliveries_of(rt, bid)
    return body


def _listed(job: Job) -> dict:
    deleted = job.deleted_at is not None
    out = {
        "job_id": job.id,
        "status": job.status,
        "deleted": deleted,
        "audio_url": job.audio_url,
        "filename": job.filename,
        "error": job.error,
        "status_url": None,
        "transcript_url": None,
    }
    if not deleted:
        out["status_url"] = url_for("api.show", job_id=job.id, _external=True)
        if job.state is JobStatus.COMPLETED:
            out["transcript_url"] = url_for("api.transcript", job_id=job.id, _external=True)
    return out


@bp.get("/batches/<batch_id>")
def show(batch_id: str):
    status, raw_limit = listing_args()
    cursor = request.args.get("cursor") or None
    if cursor is not None and not (len(cursor) <= 36 and cursor.isascii() and cursor.isprintable()):
        raise InvalidRequest("cursor is not one this API gave out; pass next_cursor from the previous page")
    found = get_batch(runtime(), batch_id, owner=scope())
    resp = jsonify(batch_body(found, int(raw_limit), cursor, status))
    if not found.done:
        resp.headers["Retry-After"] = "5"
    return resp


@bp.post("/batches/<batch_id>/cancel")
def cancel(batch_id: str):
    """Cancel every job of the batch that has not finished (as POST /v1/jobs/<id>/cancel
    does each): waiting ones at once, running ones at their next window."""
    rt = runtime()
    found = get_batch(rt, batch_id, owner=scope())
    if found.done:
        raise JobNotReady(
            f"batch {batch_id} has finished; only a batch with PENDING or PROCESSING jobs can be cancelled"
        )
    for job_id in unfinished_ids(rt, batch_id):
        try:
            cancel_job(rt, job_id)
        except WhisperqError as exc:  # it finished meanwhile
            log.info("batch %s: job %s not cancelled (%s)", batch_id, job_id, exc)
    return jsonify(batch_body(get_batch(rt, batch_id))), 200
