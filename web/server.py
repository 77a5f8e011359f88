"""The gunicorn worker the Procfile runs: gevent, with errors as JSON.

gevent: each request is a greenlet, not a thread, so a client waiting on a long-poll
(`GET /v1/jobs/<id>?wait=30`) or an OpenAI-style call waiting for its transcript costs a
few kilobytes and no thread; the web keeps answering with thousands of them open.
(`JSONErrorWorker`, the threaded variant, stays for deployments that cannot use gevent.)

gunicorn answers requests it cannot parse (a header line over
``--limit-request-field_size``, a malformed request line) itself, before the app sees
them, with an HTML page. API clients get the same JSON error shape as from the app.
"""

from __future__ import annotations

import json

from gunicorn.glogging import Logger
from gunicorn.http import errors as http_errors
from gunicorn.util import write_nonblock
from gunicorn.workers.gthread import ThreadWorker

# (status, reason, code, message); the message says what to change.
_CLIENT_ERRORS = (
    (
        http_errors.LimitRequestHeaders,
        431,
        "Request Header Fields Too Large",
        "headers_too_large",
        "a request header is over 32 KiB, or there are too many headers; send smaller headers",
    ),
    (
        http_errors.LimitRequestLine,
        414,
        "URI Too Long",
        "uri_too_long",
        "the request line is too long; send parameters in the body instead of the URL",
    ),
    (
        (
            http_errors.InvalidRequestLine,
            http_errors.InvalidRequestMethod,
            http_errors.InvalidHTTPVersion,
            http_errors.InvalidHeader,
            http_errors.InvalidHeaderName,
            http_errors.ObsoleteFolding,
            http_errors.InvalidChunkSize,
            http_errors.ChunkMissingTerminator,
        ),
        400,
        "Bad Request",
        "malformed_request",
        "the request is not valid HTTP/1.1: {exc}",
    ),
)


def json_error(status: int, reason: str, code: str, message: str) -> bytes:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class JSONErrors:
    """A gunicorn worker's error page as JSON; mixed in before the worker class."""

    log: Logger  # the worker's

    def handle_error(self, req, client, addr, exc):
        for kinds, status, reason, code, message in _CLIENT_ERRORS:
            if isinstance(exc, kinds):
                self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
                try:
                    write_nonblock(client, json_error(status, reason, code, message.format(exc=exc)))
                except OSError:
                    self.log.debug("Failed to send error message.")
                return
        super().handle_error(req, client, addr, exc)  # type: ignore[misc]  # the worker class after this mixin


class JSONErrorWorker(JSONErrors, ThreadWorker):
    """gthread: a thread per request in progress."""


def _gevent_worker():
    from gunicorn.workers.ggevent import GeventWorker

    class JSONErrorGeventWorker(JSONErrors, GeventWorker):
        """gevent: a greenlet per request in progress."""

    return JSONErrorGeventWorker


def __getattr__(name):  # imported only when gunicorn asks for it: gevent patches the process
    if name == "JSONErrorGeventWorker":
        return _gevent_worker()
    raise AttributeError(name)


class JSONLogger(Logger):
    """gunicorn's own log lines (master, workers, access log) as JSON when
    WHISPERQ_LOG_FORMAT asks for it (see config.logs); `--logger-class web.server.JSONLogger`."""

    def setup(self, cfg):
        super().setup(cfg)
        from config.logs import use_json, wants_json

        if wants_json():
            use_json([self.error_log, self.access_log])
