"""Accepting a submission: validate everything, store, record, publish — or leave nothing."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import unicodedata
from typing import Callable, Mapping

from celery import Celery
from flask import Request, current_app, g, has_request_context
from werkzeug.datastructures import FileStorage
from werkzeug.exceptions import RequestEntityTooLarge

from config import publish_transcribe
from models.access import apikeys, quotas
from models.delivery.outbound import check_url
from models.errors import BrokerUnavailable, InvalidRequest
from models.jobs import idempotency
from models.jobs.operations import create_job, discard_job, get_job
from models.jobs.record import Job
from models.pipeline.options import FALSE, FIELDS, MAX_PROMPT, TRUE, check_served, parse_options  # noqa: F401 - the doors' options
from models.runtime import Runtime
from models.speech import audio as audio_io
from models.storage import SealedSpool, caller_file, clean_filename

log = logging.getLogger(__name__)

def with_key_options(rt: Runtime, options: dict, owner: str | None) -> dict:
    """The job's options with what its key adds: `collect` is on when the job asked for it
    or its key collects every job (`whisperq keys collect`)."""
    return {**options, "collect": options["collect"] or apikeys.key_collects(rt, owner)}


def audio_limit(settings) -> float:
    """The longest audio this request may send: WHISPERQ_MAX_AUDIO_SECONDS, or less for its
    key's tier (WHISPERQ_MAX_AUDIO_SECONDS_<TIER>)."""
    found = g.get("principal") if has_request_context() else None
    return settings.audio_limit(getattr(found, "tier", None))


def check_fields(form: Mapping[str, str], files, source: str = "file") -> None:
    unknown = sorted((set(form) - set(FIELDS) - ({source} if source != "file" else set())) | (set(files) - {"file"}))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(repr(u) for u in unknown)}; the fields are {source!r}, "
            f"{', '.join(repr(f) for f in FIELDS)}"
        )


def check_filename(name: str) -> None:
    """A client's file name is shown back to people: refuse what cannot be a plain name."""
    if "\ufffd" in name:
        raise InvalidRequest("the file name is not valid UTF-8; rename the file")
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise InvalidRequest("the file name contains control characters; rename the file")
    if "/" in name or "\\" in name or name.strip(". ") == "":
        raise InvalidRequest("the file name must be a plain name, without directories or '..'")
    if len(name) > 255:
        raise InvalidRequest("the file name is longer than 255 characters; rename the file")


def submit_upload(rt: Runtime, celery: Celery, upload: FileStorage | None, form: Mapping[str, str],
                  files=None, idempotency_key: str | None = None,
                  admit: Callable[[str], None] | None = None, owner: str | None = None,
                  default_priority: str = "normal") -> tuple[Job, bool]:
    """Validate, store, record the PENDING job, then publish. On any error nothing remains.

    Returns the job and whether it is new: a repeated Idempotency-Key with the same
    request returns the job made the first time.
    """
    check_fields(form, files or {})
    options = parse_options(form, rt.settings, default_priority)
    check_served(rt, options["model"])
    if admit is not None:
        admit(options["priority"])
    if upload is None or not upload.filename:
        raise InvalidRequest("no audio file: send it as the multipart form field 'file', with a UTF-8 file name")
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
    spooled = sealed_upload(rt, upload)
    try:
        fingerprint = _fingerprint(spooled.sha256, upload.filename, options)
        if idempotency_key is not None:
            earlier = idempotency.lookup(rt, idempotency_key, fingerprint)
            if earlier is not None:
                spooled.discard()
                return get_job(rt, earlier), False
        info = measure_upload(rt, spooled)
        quotas.check(rt, owner, info.duration)  # before the audio is stored
        job = create_job(
            rt,
            spooled.path,
            filename=clean_filename(upload.filename),
            duration=info.duration,
            audio_format=info.format,
            owner=owner,
            **with_key_options(rt, options, owner),
        )
        spooled.release()  # moved into the store
    except BaseException:
        spooled.discard()
        raise
    quotas.confirm_or_withdraw(rt, job)  # with its own row in: no two racing uploads pass the quota
    return _enqueue(rt, celery, job, idempotency_key, fingerprint)


def sealed_upload(rt: Runtime, upload: FileStorage) -> SealedSpool:
    """An uploaded file, its name checked, complete and sealed (encrypted in the data dir's
    tmp folder: UploadRequest did it as it arrived, else it is done now); refused when empty.
    The caller moves it into the store or discards it."""
    check_filename(upload.filename)
    spooled = upload.stream
    if not isinstance(spooled, SealedSpool):  # not parsed by UploadRequest: spool it encrypted now
        spooled = rt.storage.spool(upload.stream, limit=rt.settings.max_upload_bytes, too_large=RequestEntityTooLarge)
    try:
        spooled.finish()
        if spooled.size == 0:
            raise InvalidRequest("the uploaded file is empty; choose a file with audio in it")
    except BaseException:
        spooled.discard()
        raise
    return spooled


def measure_upload(rt: Runtime, spooled: SealedSpool) -> audio_io.AudioInfo:
    """The upload's container and length by its header, at most what this request may send."""
    with spooled.open() as fh:
        return audio_io.probe(fh, max_seconds=audio_limit(rt.settings))


def checked_audio_url(rt: Runtime, value) -> tuple[str, str | None]:
    """`audio_url` through the address guard, and the file name its path ends in."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest("audio_url is missing: give the http(s) URL of the audio, or upload the file as multipart")
    url = check_url(value.strip(), rt.settings, "audio_url")
    return url, clean_filename(url.rsplit("/", 1)[-1].split("?", 1)[0]) or None


def _json_options(rt: Runtime, body, source: str, example: str, admit: Callable[[str], None] | None,
                  default_priority: str) -> dict:
    """A JSON submission's options, checked, its model served and its priority admitted."""
    if not isinstance(body, dict):
        raise InvalidRequest(f'send a JSON object such as {{"{source}": "{example}"}}')
    check_fields(body, {}, source=source)
    options = parse_options(body, rt.settings, default_priority)
    check_served(rt, options["model"])
    if admit is not None:
        admit(options["priority"])
    return options


def submit_url(rt: Runtime, celery: Celery, body, idempotency_key: str | None = None,
               admit: Callable[[str], None] | None = None, owner: str | None = None,
               default_priority: str = "normal") -> tuple[Job, bool]:
    """A job whose audio the preparation pool fetches from `audio_url` (JSON body)."""
    options = _json_options(rt, body, "audio_url", "https://example.com/call.mp3", admit, default_priority)
    url, name = checked_audio_url(rt, body.get("audio_url"))
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
    fingerprint = hashlib.sha256(json.dumps([url, options], sort_keys=True).encode()).hexdigest()
    if idempotency_key is not None:
        earlier = idempotency.lookup(rt, idempotency_key, fingerprint)
        if earlier is not None:
            return get_job(rt, earlier), False
    quotas.check(rt, owner, rt.settings.unfetched_audio_seconds)  # the fetch checks its real length
    job = create_job(rt, None, filename=name, duration=None, audio_url=url, owner=owner,
                     **with_key_options(rt, options, owner))
    quotas.confirm_or_withdraw(rt, job)
    return _enqueue(rt, celery, job, idempotency_key, fingerprint)


def submit_path(rt: Runtime, celery: Celery, body, idempotency_key: str | None = None,
                admit: Callable[[str], None] | None = None, owner: str | None = None,
                default_priority: str = "normal") -> tuple[Job, bool]:
    """A job on a file the caller put under WHISPERQ_INPUT_DIRS (`path`, as the MQTT bridge
    takes it), read in place and never deleted: checked as an upload is, then as submit_url."""
    options = _json_options(rt, body, "path", "/srv/inbox/call.flac", admit, default_priority)
    given = body.get("path")
    if not isinstance(given, str) or not os.path.isabs(given.strip()):
        raise InvalidRequest("path must be the absolute path of an audio file under WHISPERQ_INPUT_DIRS "
                             f"({', '.join(str(d) for d in rt.settings.input_dirs)}), as the service's workers see it")
    try:
        path = caller_file(given.strip(), rt.settings.input_dirs, rt.settings.data_dir)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise InvalidRequest(f"there is no file the service can read at path {given.strip()!r}; check the path and "
                             "that the file is readable by the service")
    if idempotency_key is not None:
        check_idempotency_key(idempotency_key)
    fingerprint = hashlib.sha256(json.dumps([path, options], sort_keys=True).encode()).hexdigest()
    if idempotency_key is not None:
        earlier = idempotency.lookup(rt, idempotency_key, fingerprint)
        if earlier is not None:
            return get_job(rt, earlier), False
    info = audio_io.probe(path, max_seconds=audio_limit(rt.settings))
    quotas.check(rt, owner, info.duration)
    job = create_job(rt, None, caller_file=path, filename=clean_filename(os.path.basename(path)),
                     duration=info.duration, audio_format=info.format, owner=owner, **with_key_options(rt, options, owner))
    quotas.confirm_or_withdraw(rt, job)
    return _enqueue(rt, celery, job, idempotency_key, fingerprint)


RERUN_KEPT = ("language", "task", "priority", "word_timestamps", "prompt", "temperature", "collect")


def submit_rerun(rt: Runtime, celery: Celery, job_id: str, body, owner, admit: Callable[[str], None] | None = None,
                 default_priority: str = "normal") -> Job:
    """A new job on the same audio as `job_id`, linked to it (`rerun_of`), with the options
    of the body (JSON, the fields of POST /v1/jobs but the audio) over the original's: most
    often another model. Its audio is a copy, so either job may be deleted alone."""
    from models.errors import AudioPurged

    if not isinstance(body, dict):
        raise InvalidRequest('send a JSON object such as {"model": "base"} (or nothing, to run the same options again)')
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidRequest(f"unknown field(s) {', '.join(repr(u) for u in unknown)}; a re-run takes "
                             f"{', '.join(repr(f) for f in FIELDS)}")
    original = get_job(rt, job_id, owner=owner)
    if original.deleted_at is not None or original.audio_purged_at is not None or not (original.audio_ref
                                                                                       or original.audio_url):
        raise AudioPurged(f"job {job_id}'s audio is no longer kept (deleted, or removed after "
                          "WHISPERQ_AUDIO_RETENTION); it cannot be re-run: submit the audio again")
    kept = {name: getattr(original, name) for name in RERUN_KEPT}
    form = {"model": original.route or original.model, **{k: v for k, v in kept.items() if v is not None}, **body}
    form = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in form.items()}
    if form.get("temperature") is not None:
        form["temperature"] = str(form["temperature"])
    options = parse_options(form, rt.settings, default_priority)
    check_served(rt, options["model"])
    if admit is not None:
        admit(options["priority"])
    # A re-run is billed to the original's key, like the original (models.access.usage).
    length = original.audio_duration
    quotas.check(rt, original.owner, length if length is not None else rt.settings.unfetched_audio_seconds)
    spooled = rt.storage.copy_to_spool(original.audio_ref) if original.audio_ref else None
    try:
        job = create_job(rt, spooled, filename=original.filename, duration=original.audio_duration,
                         audio_format=original.audio_format, owner=original.owner, rerun_of=original.id,
                         audio_url=None if spooled else original.audio_url,
                         **with_key_options(rt, options, original.owner))
    except BaseException:
        if spooled is not None:
            spooled.unlink(missing_ok=True)
        raise
    quotas.confirm_or_withdraw(rt, job)
    publish(rt, celery, job)
    log.info("job %s re-runs job %s on %s", job.id, original.id, job.model)
    return job


def _enqueue(rt: Runtime, celery: Celery, job: Job, idempotency_key: str | None, fingerprint: str) -> tuple[Job, bool]:
    if idempotency_key is not None:
        winner = idempotency.remember(rt, idempotency_key, fingerprint, job.id)
        if winner != job.id:  # a concurrent request with the same key got there first
            discard_job(rt, job.id)
            return get_job(rt, winner), False
    try:
        publish(rt, celery, job)
    except BrokerUnavailable:
        if idempotency_key is not None:
            idempotency.forget(rt, idempotency_key)
        raise
    return job, True


def check_idempotency_key(key: str) -> None:
    if not 1 <= len(key) <= idempotency.MAX_KEY_LENGTH or not key.isascii() or not key.isprintable():
        raise InvalidRequest(f"Idempotency-Key must be 1 to {idempotency.MAX_KEY_LENGTH} printable ASCII characters")


def _fingerprint(content, filename: str, options: dict) -> str:
    """sha256 of the file (`content`, hashed as it arrived), its name and the options."""
    digest = content.copy()
    digest.update(json.dumps([filename, options], sort_keys=True).encode())
    return digest.hexdigest()


class UploadRequest(Request):
    """Flask's request, with file parts spooled encrypted into the data dir's tmp folder
    as they arrive (werkzeug would spool them in plaintext to /tmp), hashed and counted
    on the way, and refused with 413 the moment one passes WHISPERQ_MAX_UPLOAD_MB, even
    in a chunked request without a Content-Length. Whatever the view does not keep is
    removed when the request ends."""

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        rt = current_app.extensions["whisperq"]
        spool = SealedSpool(rt.storage.tmp_dir, limit=rt.settings.max_upload_bytes, too_large=RequestEntityTooLarge)
        self.__dict__.setdefault("_whisperq_spools", []).append(spool)
        return spool

    def close(self) -> None:
        try:
            super().close()
        finally:
            for spool in self.__dict__.pop("_whisperq_spools", ()):
                spool.discard()


def publish(rt: Runtime, celery: Celery, job: Job) -> None:
    """Send the job's message: its id and audio reference only, never audio bytes."""
    try:
        # The job row holds the transcript; the result backend is for transcribe.delay().get().
        publish_transcribe(celery, job, ignore_result=True)
    except Exception as exc:
        log.error("job %s: publishing failed (%s); job withdrawn", job.id, exc)
        discard_job(rt, job.id)
        raise BrokerUnavailable("the job queue is unreachable right now; nothing was stored, try again shortly") from exc
