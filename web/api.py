"""The JSON API: submit a job (upload or URL), list, read, cancel and delete jobs, and
download (and correct) transcripts."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request, url_for

from models.access import apikeys
from models.delivery.notify import deliveries_of
from models.errors import Forbidden, InvalidRequest, JobNotFound, JobNotReady, ResultPurged, UnsupportedMediaType
from models.jobs import corrections
from models.jobs.eta import estimate, queue_position
from models.jobs.operations import ANY, cancel_job, delete_job, get_job, list_jobs
from models.jobs.record import Job, JobStatus, Stage
from models.pipeline import intake
from models.runtime import Runtime
from models.speech.formats import FORMATS, MIME_TYPES, render

from .admission import admit_submission, client_key
from .auth import current, scope
from .pollrate import PollRate
from .statuscache import BODY_AGE, Entry
from .statuscache import cache as statuses
from .uploads import rerun_submission, upload_submission, url_submission
from .waits import STATE_FIELDS, JobWatch

bp = Blueprint("api", __name__, url_prefix="/v1")
log = logging.getLogger(__name__)

MAX_LIMIT = 200


def runtime() -> Runtime:
    return current_app.extensions["whisperq"]


def job_body(job: Job, detail: bool = True) -> dict:
    """The job as the API shows it: its record, where it is, and where to go next."""
    body = job.to_dict()
    body.update(estimate(runtime(), job))
    body["status_url"] = url_for("api.show", job_id=job.id, _external=True)
    body["cancel_url"] = url_for("api.cancel", job_id=job.id, _external=True)
    body["transcript_urls"] = {f: url_for("api.transcript", job_id=job.id, format=f, _external=True) for f in FORMATS}
    if detail and job.callback_url:
        body["webhook_deliveries"] = deliveries_of(runtime(), job.id)
    return body


@bp.post("/jobs")
def create():
    admit_submission("api")  # before the body is read
    key = request.headers.get("Idempotency-Key")
    who = current()
    if request.mimetype == "application/json":
        try:
            payload = json.loads(request.get_data(cache=False) or b"null")
        except ValueError as exc:
            raise InvalidRequest(f"the body is not valid JSON ({exc})") from None
        job, created = intake.submit(runtime(), url_submission(who, "api", payload, key))
    elif request.mimetype == "multipart/form-data":
        if "boundary" not in request.mimetype_params:
            raise InvalidRequest("malformed multipart body: the Content-Type has no boundary")
        job, created = intake.submit(
            runtime(),
            upload_submission(runtime(), who, "api", request.files.get("file"), request.form, request.files, key),
        )
    else:
        raise UnsupportedMediaType(
            "send the audio as multipart/form-data with the file in field 'file', or JSON with its URL in "
            f"'audio_url' (got {request.mimetype or 'no Content-Type'})"
        )
    body = job_body(job, detail=False)
    body["transcript_url"] = url_for("api.transcript", job_id=job.id, _external=True)
    return jsonify(body), 202 if created else 200, {"Location": body["status_url"]}


@bp.post("/webhook-secret")
def rotate_webhook_secret():
    """A new webhook signing secret for the calling key, shown once; the old one keeps
    signing beside it for a day, so the receiver can switch without missing a delivery."""
    who = current()
    if who.owner is None:
        raise Forbidden(
            "webhook secrets belong to API keys: send your key as 'Authorization: Bearer wq_...' (jobs "
            "without a key are signed with the deployment's secret, WHISPERQ_WEBHOOK_SECRET)"
        )
    record, secret = apikeys.rotate_webhook_secret(runtime(), who.owner)
    until = record.previous_webhook_secret_until
    body = {
        "key_id": record.id,
        "webhook_secret": secret,
        "previous_secret_signs_until": until.isoformat().replace("+00:00", "Z") if until else None,
    }
    return jsonify(body), 200, {"Cache-Control": "no-store"}


@bp.get("/usage")
def usage():
    """Audio seconds and jobs per UTC day: the calling key's own (an admin's: any key's, or all)."""
    from .usage import usage as view

    return view()


def listing_args() -> tuple[str | None, str]:
    """A listing's `status` filter and `limit`, checked (GET /v1/jobs, GET /v1/batches/<id>)."""
    status = request.args.get("status")
    if status is not None:
        status = status.upper()
        if status not in JobStatus.__members__:
            raise InvalidRequest(f"status {status!r} is not one of: {', '.join(JobStatus.__members__)}")
    raw_limit = request.args.get("limit", "50")
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= MAX_LIMIT:  # not "²"
        raise InvalidRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return status, raw_limit


@bp.get("/jobs")
def index():
    status, raw_limit = listing_args()
    cursor = _decode_cursor(request.args.get("cursor"))
    confidence = _confidence_arg(request.args.get("max_confidence"))
    jobs, following = list_jobs(runtime(), status, int(raw_limit), cursor, owner=scope(), max_confidence=confidence)
    body: dict[str, Any] = {
        "jobs": [job_body(job, detail=False) for job in jobs],
        "next_cursor": None,
        "next_url": None,
    }
    if following is not None:
        token = _encode_cursor(following)
        given = (("status", status), ("limit", raw_limit), ("max_confidence", request.args.get("max_confidence")))
        args = {k: v for k, v in given if v}
        body["next_cursor"] = token
        body["next_url"] = url_for("api.index", cursor=token, _external=True, **args)
    return jsonify(body)


def _confidence_arg(raw: str | None) -> float | None:
    """GET /v1/jobs?max_confidence=0.6: the transcripts whose confidence (0 to 1) is at most that."""
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise InvalidRequest(f"max_confidence must be a number from 0 to 1 (a transcript's confidence), not {raw!r}")
    return value


def _encode_cursor(cursor: tuple[datetime, str]) -> str:
    created, job_id = cursor
    return base64.urlsafe_b64encode(json.dumps([created.isoformat(), job_id]).encode()).decode().rstrip("=")


def _decode_cursor(token: str | None) -> tuple[datetime, str] | None:
    if not token:
        return None
    try:
        created, job_id = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        when = datetime.fromisoformat(created)
        if when.tzinfo is None:  # the cursors given out carry their zone; a naive one cannot be compared
            raise ValueError(created)
        return when, str(job_id)
    except (ValueError, TypeError):
        raise InvalidRequest("cursor is not one this API gave out; pass next_cursor from the previous page") from None


MAX_WAIT = 60


@bp.get("/jobs/<job_id>")
def show(job_id: str):
    """The job, with an ETag (send it back in If-None-Match: 304 while nothing changed) and,
    until it is finished, Retry-After: when polling again is worth it. An unchanged job is
    answered from memory (web.statuscache); a client polling it faster than Retry-After
    gets 429 (web.pollrate).

    `?wait=N` (1-60 s) is a long-poll: the answer comes as soon as the job itself changes
    (its status, stage, progress, attempts, webhook deliveries) from the state in
    If-None-Match (the ETag as the client last saw it), or without it from the state it has
    now; or after N seconds, 304 if nothing changed (the unchanged job without If-None-Match).
    Moving up the queue does not end a wait: in a burst every job ahead that finishes would
    answer every waiting client, n² answers for n jobs. Under the gevent web worker a
    waiting request holds no thread."""
    wait = _wait_seconds(request.args.get("wait"))
    rt = runtime()
    paced = rt.settings.poll_limit
    known = None
    if not wait and paced:
        # Paced on the answer last built, before any is built again: in a burst every job
        # that finishes moves the others' places, and a poll refused must cost nothing.
        known = _cached(rt, job_id)
        if known is not None and not known.job.state.finished:
            _pace_read(rt, job_id, known)
    entry = _status(rt, job_id)
    held = {tag.split(".", 1)[0] for tag in request.if_none_match.as_set(include_weak=True)}
    if wait and not entry.job.state.finished and (not held or entry.state in held):
        # One reader per process looks at every waiting client's job (web.waits).
        _watch.wait(rt, job_id, entry.state, wait)
        entry = _status(rt, job_id)
    elif paced and not entry.job.state.finished and known is None and _pace_read(rt, job_id, entry):
        # (a long-poll answered at once is paced too, unless it brings news: web.pollrate)
        entry = _status(rt, job_id)
    resp = Response(entry.payload, mimetype="application/json")
    if not entry.job.state.finished:
        resp.headers["Retry-After"] = str(poll_after(entry.job, entry.body))
        if paced:
            _pace.answered(client_key(), job_id, entry.state)
    resp.set_etag(entry.etag, weak=True)
    return resp.make_conditional(request)


def _pace_read(rt: Runtime, job_id: str, entry: Entry) -> bool:
    """Count this read of the job as `entry` shows it (web.pollrate); True when it was held
    and the job changed meanwhile (build the answer again)."""
    return _pace.take(
        client_key(),
        job_id,
        entry.state,
        poll_after(entry.job, entry.body),
        until_changed=lambda seconds: _watch.wait(rt, job_id, entry.state, seconds),
    )


def _status(rt: Runtime, job_id: str) -> Entry:
    """The job's answer for this request: from the status cache while the job is unchanged
    (its body rebuilt, without reading the job again, when its place in the queue moved or
    its estimates are old), else from the database. The owner is checked either way."""
    entry = _cached(rt, job_id)
    if entry is None:
        job = get_job(rt, job_id, owner=scope())
        return statuses.put(_built(rt, job, job_state(rt, job)))
    if (
        queue_position(rt, entry.job) != entry.place
        or entry.host != request.host_url
        or time.monotonic() - entry.built > BODY_AGE
    ):
        fresh = _built(rt, entry.job, entry.state)
        fresh.checked = entry.checked
        return statuses.put(fresh)
    return entry


def _cached(rt: Runtime, job_id: str) -> Entry | None:
    """The job's cached answer, if any, once the caller may see the job (JobNotFound if not)."""
    entry = statuses.get(rt, job_id)
    if entry is not None and (entry.job.deleted_at is not None or (scope() is not ANY and entry.job.owner != scope())):
        raise JobNotFound(f"no job with id {job_id!r}")
    return entry


def _built(rt: Runtime, job: Job, state: str) -> Entry:
    body = job_body(job)
    now = time.monotonic()
    return Entry(
        rt=rt,
        job=job,
        state=state,
        place=queue_position(rt, job),
        body=body,
        payload=current_app.json.dumps(body).encode() + b"\n",
        host=request.host_url,
        built=now,
        checked=now,
        read=now,
    )


def _wait_seconds(value: str | None) -> int:
    if value is None:
        return 0
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_WAIT:
        raise InvalidRequest(f"wait must be a whole number of seconds from 1 to {MAX_WAIT}")
    return int(value)


def job_state(rt: Runtime, job: Any) -> str:
    """A digest of the job itself as a client acts on it (web.waits.STATE_FIELDS: status,
    stage, progress, attempts, errors), its webhook deliveries (not its place in the queue,
    nor the estimates). `job`: a Job, or the long-poll reader's row of those columns."""
    state: list[Any] = [getattr(job, name) for name in STATE_FIELDS]
    if job.callback_url:
        state.append([(d["status"], len(d["attempts"])) for d in deliveries_of(rt, job.id)])
    return hashlib.sha256(json.dumps(state, default=str).encode()).hexdigest()[:24]


_watch = JobWatch(job_state, statuses)
_pace = PollRate()


def poll_after(job: Job, body: dict) -> int:
    """Seconds before a poll may show something new: half the wait to the next moment the
    estimates name (its start while it waits, its finish while it is transcribed), 1 to 30:
    polls that close in on that moment, each halving what is left (the estimates are right
    within about a quarter, models.jobs.eta), a few per job where every half second would be a
    hundred. Without an estimate: 1 while it is transcribed (progress moves window by window),
    else 5."""
    if job.stage == Stage.INFER:
        at, unknown = body.get("estimated_finish_at"), 1
    else:
        at, unknown = body.get("estimated_start_at"), 5
    if not at:
        return unknown
    wait = (datetime.fromisoformat(at.replace("Z", "+00:00")) - datetime.now(UTC)).total_seconds()
    return int(min(30, max(1, wait / 2)))


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id: str):
    job = cancel_job(runtime(), job_id, owner=scope())
    # CANCELLED at once if it was waiting; a running job stops at its next window.
    return jsonify(job_body(job)), 200 if job.state is JobStatus.CANCELLED else 202


@bp.post("/jobs/<job_id>/rerun")
def rerun(job_id: str):
    """The same audio again as a new job linked to this one, most often on another model."""
    admit_submission("rerun")
    who = current()
    if request.content_length and request.mimetype != "application/json":
        raise UnsupportedMediaType('send the options as JSON, such as {"model": "base"}, or no body at all')
    try:
        body = json.loads(request.get_data(cache=False) or b"{}")
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON ({exc})") from None
    job, _ = intake.submit(runtime(), rerun_submission(runtime(), who, job_id, body))
    log.info("job %s re-runs job %s on %s", job.id, job_id, job.model)
    body = job_body(job, detail=False)
    return jsonify(body), 202, {"Location": body["status_url"]}


@bp.delete("/jobs/<job_id>")
def remove(job_id: str):
    delete_job(runtime(), job_id, owner=scope())
    # transcribe.delay() callers read results from the result backend: it goes too.
    try:
        current_app.extensions["celery"].AsyncResult(job_id).forget()
    except Exception as exc:  # expires on its own (result_expires) if the backend is away now
        log.warning("job %s: result backend entry not removed now (%s)", job_id, exc)
    return "", 204


@bp.get("/jobs/<job_id>/transcript")
def transcript(job_id: str):
    fmt = (request.args.get("format") or "txt").lower()
    if fmt not in FORMATS:
        raise InvalidRequest(f"format {fmt!r} is not one of: {', '.join(FORMATS)}")
    job = get_job(runtime(), job_id, owner=scope())
    if job.result_purged_at is not None:
        raise ResultPurged(
            f"job {job_id}'s transcript was deleted after the retention period "
            "(WHISPERQ_RESULT_RETENTION); the job's status is still shown"
        )
    result = job.result()
    if result is None:
        raise JobNotReady(f"job {job_id} is {job.status}; the transcript is available once it is COMPLETED")
    resp = Response(render(result, fmt), mimetype=MIME_TYPES[fmt].split(";")[0])
    resp.headers["Content-Type"] = MIME_TYPES[fmt]
    if request.args.get("download"):
        resp.headers["Content-Disposition"] = f'attachment; filename="{job_id}.{fmt}"'
    return resp


@bp.put("/jobs/<job_id>/transcript")
def correct(job_id: str):
    """A client's correction of a COMPLETED job's transcript, kept beside the original
    (models.jobs.corrections); the answer is the job, with both."""
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(
            f"send the correction as JSON (Content-Type: application/json), such as "
            f"{corrections.EXAMPLE} (got {request.mimetype or 'no Content-Type'})"
        )
    request.max_content_length = corrections.MAX_BYTES  # a long transcript: more than a submission's 64 KiB
    try:
        body = json.loads(request.get_data(cache=False) or b"null")
    except ValueError as exc:
        raise InvalidRequest(f"the body is not valid JSON ({exc})") from None
    job = corrections.correct_transcript(runtime(), job_id, corrections.check_correction(body), owner=scope())
    return jsonify(job_body(job))
