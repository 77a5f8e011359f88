"""Errors as JSON `{"error": {"code", "message"}}` for the API, as a page for the browser."""

from __future__ import annotations

import logging

from flask import Flask, current_app, jsonify, make_response, render_template, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from models.errors import DATABASE_AWAY, DatabaseUnavailable, WhisperqError
from models.security.crypto import DecryptionError

log = logging.getLogger(__name__)


def wants_json() -> bool:
    return request.path.startswith("/v1/") or request.accept_mimetypes.best == "application/json"


def error_response(status: int, code: str, message: str, headers: dict | None = None, details: dict | None = None):
    if wants_json():
        resp = make_response(jsonify({"error": {"code": code, "message": message, **(details or {})}}), status)
    else:
        resp = make_response(render_template("error.html", status=status, message=message), status)
    resp.headers.update(headers or {})
    return resp


def init_app(app: Flask) -> None:
    limit_mb = app.config["MAX_CONTENT_LENGTH"] // (1024 * 1024)

    @app.errorhandler(WhisperqError)
    def _service_error(exc: WhisperqError):
        headers = dict(getattr(exc, "headers", None) or {})
        retry_after = getattr(exc, "retry_after", None)
        if retry_after is not None:
            headers["Retry-After"] = str(int(retry_after))
        elif exc.http_status == 503:
            headers["Retry-After"] = "5"
        return error_response(exc.http_status, exc.code, str(exc), headers, getattr(exc, "details", None))

    def _database_away(exc: Exception):
        # A database restart or failover is an outage to wait out, not a fault of the request:
        # 503 with Retry-After, as when the broker is away, and no traceback in the log.
        log.warning("the database is unreachable on %s %s: %s", request.method, request.path, str(exc).splitlines()[0])
        return _service_error(DatabaseUnavailable())

    for away in DATABASE_AWAY:
        app.register_error_handler(away, _database_away)

    @app.errorhandler(RequestEntityTooLarge)
    def _too_large(exc):
        from .app import MAX_BODY_BYTES, MAX_FORM_PARTS

        if request.endpoint == "api.correct":
            from models.jobs.corrections import MAX_BYTES

            message = (
                f"the correction is larger than {MAX_BYTES // (1024 * 1024)} MiB; send the text (and segments) "
                "of one transcript"
            )
        elif request.endpoint == "batches.create" and request.mimetype == "multipart/form-data":
            s = current_app.extensions["whisperq"].settings
            message = (
                f"the batch is over its limits: each file at most {s.max_upload_mb} MB "
                "(WHISPERQ_MAX_UPLOAD_MB), "
                f"all of it at most {s.max_batch_upload_mb} MB (WHISPERQ_MAX_BATCH_UPLOAD_MB), at most "
                f"{s.max_batch_items} files (WHISPERQ_MAX_BATCH_ITEMS) with the batch's options; split it in "
                "several batches, or send long recordings by URL"
            )
        elif request.mimetype != "multipart/form-data":
            message = (
                f"the request body is larger than {MAX_BODY_BYTES // 1024} KiB; a JSON body carries an "
                "audio_url and options, and audio goes as a multipart upload"
            )
        elif request.content_length is not None and request.content_length <= app.config["MAX_CONTENT_LENGTH"]:
            message = (
                f"the upload has too many parts (at most {MAX_FORM_PARTS}: the file and its options) "
                "or a field over 1 MiB"
            )
        else:
            message = f"the upload is larger than the limit of {limit_mb} MB (WHISPERQ_MAX_UPLOAD_MB)"
        return error_response(413, "too_large", message)

    @app.errorhandler(HTTPException)
    def _http_error(exc: HTTPException):
        code = (exc.name or "error").lower().replace(" ", "_")
        # Keep what the exception says beyond its page, such as a 405's Allow header.
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}
        return error_response(exc.code or 500, code, exc.description or exc.name, headers)

    @app.errorhandler(DecryptionError)
    def _undecryptable(exc: DecryptionError):
        log.error("stored data could not be decrypted on %s %s: %s", request.method, request.path, exc)
        return error_response(
            500,
            "decryption_failed",
            "stored data could not be decrypted with the keys this "
            "server has; an operator must check WHISPERQ_ENCRYPTION_KEYS "
            "(the log says which key is missing)",
        )

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", "the server hit an unexpected error; it has been logged")
