"""The Flask app factory (``create_app``): the JSON API, the page, health checks and metrics,
each a blueprint of this package, over the process's runtime and its one Celery app.

Imported by the web worker only once gevent has patched the process (``web.wsgi``, loaded
by gunicorn's worker after its ``monkey.patch_all()``): this imports Celery, the storage's
clients (boto3, urllib3) and everything else that must see the patched ``ssl`` and ``socket``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, g, request

from config import Settings
from tasks.app import start_process

MAX_HEADER_BYTES = 16 * 1024
# A body that is not a multipart upload (JSON, a form post) is small: an audio_url and options.
MAX_BODY_BYTES = 64 * 1024
# A multipart upload: the file and the options (FIELDS), with room to spare; werkzeug's
# default (1,000) would spool that many parts before the fields are checked.
MAX_FORM_PARTS = 16


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Build the app. `test_config` may carry a ready `SETTINGS` object and Flask keys."""
    app = Flask(__name__)
    from .uploads import UploadRequest

    app.request_class = UploadRequest  # uploads spooled encrypted, hashed and size-checked as they arrive
    test_config = dict(test_config or {})
    settings: Settings = test_config.pop("SETTINGS", None) or Settings.from_env()
    app.config.from_mapping(
        MAX_CONTENT_LENGTH=settings.max_upload_bytes,
        # Text fields are small; cap what they may hold in memory. Werkzeug counts its
        # read buffer (64 KiB chunks) against this too, so it must stay well above that.
        MAX_FORM_MEMORY_SIZE=1024 * 1024,
        MAX_FORM_PARTS=MAX_FORM_PARTS,
    )
    app.config.update(test_config)
    # keep job_id and status first, as documented (Flask's default provider has sort_keys; mypy sees the base class)
    app.json.sort_keys = False  # type: ignore[attr-defined]

    runtime = start_process(settings)  # the process's one Celery app, and the runtime publishing through it
    app.extensions["whisperq"] = runtime
    app.extensions["celery"] = runtime.broker.app  # type: ignore[union-attr]  # start_process gives it one

    from . import admin, admission, api, auth, batches, errors, health, metrics, openai_api, openapi, pages, security

    errors.init_app(app)
    auth.init_app(app)
    app.register_blueprint(api.bp)
    app.register_blueprint(batches.bp)
    app.register_blueprint(openai_api.bp)
    app.after_request(admission.add_rate_headers)
    app.register_blueprint(admin.bp)
    app.register_blueprint(health.bp)
    metrics.init_app(app)
    app.register_blueprint(pages.bp)
    app.register_blueprint(openapi.bp)
    security.init_app(app)

    @app.before_request
    def _start_clock():
        g.cpu_started = time.thread_time()  # gthread: one thread serves the request start to end

    @app.after_request
    def _server_timing(resp: Response) -> Response:
        """`Server-Timing: cpu;dur=MS`: the CPU this request took in the app (body parse,
        sealing, probe, database, publish), for a client or a benchmark to read per request."""
        started = g.get("cpu_started")
        if started is not None:
            resp.headers.add("Server-Timing", f"cpu;dur={(time.thread_time() - started) * 1000:.2f}")
        return resp

    @app.before_request
    def _limit_body():
        if request.mimetype != "multipart/form-data":
            request.max_content_length = MAX_BODY_BYTES  # read whole by get_json(): keep it small
        return None

    @app.before_request
    def _limit_headers():
        # gunicorn refuses a single header line over 32 KiB itself (web.server answers
        # that in JSON too); below that, many or large headers are refused here.
        size = sum(len(k) + len(v) for k, v in request.headers.items())
        if size > MAX_HEADER_BYTES:
            return errors.error_response(
                431, "headers_too_large", f"the request headers total {size} bytes; the limit is {MAX_HEADER_BYTES}"
            )
        return None

    from config.tracing import init_web

    init_web(app)  # OpenTelemetry, only with OTEL_EXPORTER_OTLP_ENDPOINT
    if not app.debug:
        from config.logs import configure_web

        configure_web(settings.log_format)
    return app
