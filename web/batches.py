"""Batches: `POST /v1/batches` (many audio URLs as JSON, or many files as multipart, one
request), `GET /v1/batches/<id>` (its state and its jobs, a page at a time) and
`POST /v1/batches/<id>/cancel`.

A batch is validated whole before anything is stored: every item's URL through the address
guard or every file as an upload is checked (name, size, container, length by its header),
every item's options through parse_options as at every door, the tier's priority, the
queue budget and the key's monthly quota with all of its jobs counted. Then its row and
all its jobs (with the files' audio) go in in one transaction, and are published. A
refusal stores nothing: the files spooled for it are removed when the request ends."""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from flask import Blueprint, current_app, jsonify, request, url_for

from models.access import quotas
from models.delivery.notify import deliveries_of
from models.delivery.outbound import check_url
from models.errors import BrokerUnavailable, InvalidRequest, JobNotReady, UnsupportedMediaType, WhisperqError
from models.jobs import idempotency
from models.jobs.batches import Batch, Standing, batch_jobs, create_batch, discard_batch, get_batch, unfinished_ids
from models.jobs.operations import cancel_job, fail_job
from models.jobs.record import Job, JobStatus
from models.runtime import Runtime
from models.storage import clean_filename

from .admission import admit_batch, admit_submission
from .api import listing_args
from .auth import current, scope, scoped_idempotency_key
from .uploads import (FIELDS, check_fields, check_idempotency_key, check_served, checked_audio_url, measure_upload,
                      parse_options, publish, sealed_upload, with_key_options)

bp = Blueprint("batches", __name__, url_prefix="/v1")
log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024 * 1024  # a hundred URLs with their options; more than one job's 64 KiB
SHARED = tuple(f for f in FIELDS if f != "callback_url")  # options for every item; callback_url is the batch's
ITEM = ("audio_url", "callback_url") + tuple(f for f in SHARED if f != "priority")  # one priority per batch
EXAMPLE = '{"audio_urls": ["https://example.com/a.mp3", "https://example.com/b.mp3"]}'


def runtime() -> Runtime:
    return current_app.extensions["whisperq"]


def check_batch(rt: Runtime, body, default_priority: str) -> tuple[list[dict[str, Any]], str | None, str]:
    """Each job's fields (audio_url, options), the batch's callback_url and its priority; or
    InvalidRequest naming the item and what to change."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"send a JSON object such as {EXAMPLE}")
    unknown = sorted(set(body) - {"audio_urls", "items", "callback_url", *SHARED})
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(repr(u) for u in unknown)}; a batch takes 'audio_urls' "
                             f"or 'items', 'callback_url' and the options {', '.join(repr(f) for f in SHARED)}")
    if ("audio_urls" in body) == ("items" in body):
        raise InvalidRequest(f"give either 'audio_urls' (a list of URLs) or 'items' (a list of objects with "
                             f"'audio_url' and options), not {'both' if 'items' in body else 'neither'}: {EXAMPLE}")
    raw = body.get("items") if "items" in body else body.get("audio_urls")
    limit = rt.settings.max_batch_items
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("the batch's list of audio is empty or not a list; give 1 to "
                             f"{limit} items (WHISPERQ_MAX_BATCH_ITEMS)")
    if len(raw) > limit:
        raise InvalidRequest(f"the batch has {len(raw)} items; at most {limit} go in one batch "
                             "(WHISPERQ_MAX_BATCH_ITEMS): split it in several")
    shared = {k: v for k, v in body.items() if k in SHARED}
    callback = body.get("callback_url")
    if callback is not None:
        if not isinstance(callback, str):
            raise InvalidRequest("callback_url must be a string: the http(s) URL to POST batch.completed to")
        callback = check_url(callback.strip(), rt.settings, "callback_url") if callback.strip() else None
    items, served = [], set()
    for n, entry in enumerate(raw):
        entry = {"audio_url": entry} if "audio_urls" in body else entry
        where = f"{'items' if 'items' in body else 'audio_urls'}[{n}]"
        if not isinstance(entry, dict):
            raise InvalidRequest(f"{where} must be an object such as {{\"audio_url\": \"https://example.com/a.mp3\"}}")
        wrong = sorted(set(entry) - set(ITEM))
        if wrong:
            raise InvalidRequest(f"{where}: unknown field(s) {', '.join(repr(w) for w in wrong)}; an item takes "
                                 f"{', '.join(repr(f) for f in ITEM)} (the priority is the batch's)")
        try:
            options = parse_options({**shared, **{k: v for k, v in entry.items() if k != "audio_url"}},
                                    rt.settings, default_priority)
            url, name = checked_audio_url(rt, entry.get("audio_url"))
        except InvalidRequest as exc:
            raise InvalidRequest(f"{where}: {exc}") from None
        if options["model"] not in served:
            check_served(rt, options["model"])
            served.add(options["model"])
        items.append({**options, "audio_url": url, "filename": name})
    return items, callback, items[0]["priority"]


@bp.post("/batches")
def create():
    admit_submission()  # before the body is read
    rt, who = runtime(), current()
    key = scoped_idempotency_key(request.headers.get("Idempotency-Key"))
    if request.mimetype == "multipart/form-data":
        if "boundary" not in request.mimetype_params:
            raise InvalidRequest("malformed multipart body: the Content-Type has no boundary")
        request.max_content_length = rt.settings.max_batch_upload_bytes
        request.max_form_parts = rt.settings.max_batch_items + len(SHARED) + 2
        # The files not moved into the store are removed as the request ends (UploadRequest).
        return _create(rt, who, key, *check_files(rt, request.form, request.files, who.default_priority()))
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(f"send the batch as JSON (Content-Type: application/json), such as {EXAMPLE}, or "
                                   "its files as multipart/form-data, each in a field named 'file' "
                                   f"(got {request.mimetype or 'no Content-Type'})")
    request.max_content_length = MAX_BODY_BYTES
    try:
        body = json.loads(request.get_data(cache=False) or b"null")
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON ({exc})") from None
    items, callback, priority = check_batch(rt, body, who.default_priority())
    fingerprint = hashlib.sha256(json.dumps(["batch", callback, items], sort_keys=True).encode()).hexdigest()
    each = rt.settings.unfetched_audio_seconds  # the fetch checks each URL's real length
    return _create(rt, who, key, items, callback, priority, [each] * len(items), fingerprint)


def check_files(rt: Runtime, form, files, default_priority: str):
    """A batch of uploaded files (multipart: each in a field 'file', the batch's options and
    callback_url as fields): each file checked as POST /v1/jobs checks an upload, measured
    by its header. Returns what _create takes."""
    check_fields(form, files)  # a single upload's fields: 'file' (here one per file) and the options
    uploads = files.getlist("file")
    limit = rt.settings.max_batch_items
    if not uploads:
        raise InvalidRequest(f"no audio file: send each file in a multipart field named 'file' (1 to {limit}, "
                             "WHISPERQ_MAX_BATCH_ITEMS)")
    if len(uploads) > limit:
        raise InvalidRequest(f"the batch has {len(uploads)} files; at most {limit} go in one batch "
                             "(WHISPERQ_MAX_BATCH_ITEMS): split it in several")
    options = parse_options(form, rt.settings, default_priority)
    check_served(rt, options["model"])
    callback = (form.get("callback_url") or "").strip()
    callback = check_url(callback, rt.settings, "callback_url") if callback else None
    items, seconds, digest = [], [], hashlib.sha256(json.dumps(["files", callback, options], sort_keys=True).encode())
    for n, upload in enumerate(uploads):
        where = f"file[{n}]" + (f" ({upload.filename!r})" if upload.filename else "")
        try:
            if not upload.filename:
                raise InvalidRequest("the file has no name: send it with a UTF-8 file name")
            spooled = sealed_upload(rt, upload)
            info = measure_upload(rt, spooled)
        except WhisperqError as exc:
            exc.args = (f"{where}: {exc}",) + exc.args[1:]
            raise
        digest.update(spooled.sha256.digest() + upload.filename.encode())
        seconds.append(info.duration)
        items.append({**options, "filename": clean_filename(upload.filename), "spool": spooled,
                      "duration": info.duration, "audio_format": info.format})
    return items, callback, options["priority"], seconds, digest.hexdigest()


def _create(rt: Runtime, who, key: str | None, items: list[dict[str, Any]], callback: str | None, priority: str,
            seconds: list[float], fingerprint: str):
    """Admit the whole batch (the tier's priority, the queue budget and the key's share and
    monthly quota with all its jobs counted), record it in one transaction and publish it."""
    if key is not None:
        check_idempotency_key(key)
        earlier = idempotency.lookup(rt, key, fingerprint)
        if earlier is not None:
            return _accepted(get_batch(rt, earlier), 200)
    admit_batch(priority, seconds)
    quotas.check(rt, who.owner, sum(seconds))
    spools = [item.pop("spool") for item in items if "spool" in item]
    rows = [with_key_options(rt, item, who.owner) for item in items]
    for row, spool in zip(rows, spools):
        row["spooled"] = spool.path
    batch, jobs = create_batch(rt, rows, owner=who.owner, callback_url=callback)
    for spool in spools:
        spool.release()  # moved into the store
    quotas.confirm_or_withdraw(rt, jobs[0], withdraw=lambda: discard_batch(rt, batch.id))
    if key is not None:
        winner = idempotency.remember(rt, key, fingerprint, batch.id)
        if winner != batch.id:  # a concurrent request with the same key got there first
            discard_batch(rt, batch.id)
            return _accepted(get_batch(rt, winner), 200)
    _publish_all(rt, batch, jobs, key)
    log.info("batch %s: %d jobs queued (priority %s)", batch.id, len(jobs), priority)
    return _accepted(get_batch(rt, batch.id), 202)


def _publish_all(rt: Runtime, batch: Batch, jobs: list[Job], key: str | None) -> None:
    """Publish every job. If the broker fails before the first, the batch is withdrawn (503,
    nothing stored); after some, those are queued and the rest FAILED, saying to send them
    again, so the batch still ends and its webhook is still sent."""
    celery = current_app.extensions["celery"]
    for n, job in enumerate(jobs):
        try:
            publish(rt, celery, job)  # a failed publish removes that job's row
        except BrokerUnavailable:
            if n == 0:
                discard_batch(rt, batch.id)
                if key is not None:
                    idempotency.forget(rt, key)
                raise
            log.error("batch %s: the broker failed after %d of %d jobs; the rest are FAILED", batch.id, n, len(jobs))
            for rest in jobs[n + 1:]:
                fail_job(rt, rest.id, "the job queue became unreachable while the batch was queued; submit this "
                                      "audio again")
            return


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
    body["next_url"] = None if following is None else url_for(
        "batches.show", batch_id=bid, cursor=following, limit=limit, _external=True,
        **({"status": status} if status else {}))
    if found.batch.callback_url:
        body["webhook_deliveries"] = deliveries_of(rt, bid)
    return body


def _listed(job: Job) -> dict:
    deleted = job.deleted_at is not None
    out = {"job_id": job.id, "status": job.status, "deleted": deleted, "audio_url": job.audio_url,
           "filename": job.filename, "error": job.error, "status_url": None, "transcript_url": None}
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
        raise JobNotReady(f"batch {batch_id} has finished; only a batch with PENDING or PROCESSING jobs can be "
                          "cancelled")
    for job_id in unfinished_ids(rt, batch_id):
        try:
            cancel_job(rt, job_id)
        except WhisperqError as exc:  # it finished meanwhile
            log.info("batch %s: job %s not cancelled (%s)", batch_id, job_id, exc)
    return jsonify(batch_body(get_batch(rt, batch_id))), 200
