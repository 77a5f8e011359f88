"""Logs: one JSON object a line for machines, plain text for a terminal.

Every line about a job names it (`job_id`, and in a worker `task_id`, `task`, `queue`,
`attempt`), so one job's story is a grep away across web and worker pools. Transcripts
never reach the logs: Celery's "Task ... succeeded" line has its return value (the
transcript) replaced by :data:`OMITTED`. Nor do URLs' query strings and credentials
(presigned audio URLs and webhook URLs carry tokens there): a call site logs
:func:`redact_url`, and :class:`RedactUrls` on every handler scrubs whatever else slips by.

``WHISPERQ_LOG_FORMAT``: ``json``, ``text``, or ``auto`` (the default): JSON unless
stderr is a terminal, so processes under supervisord, systemd or a container log JSON.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from datetime import UTC, datetime

OMITTED = "<result omitted from logs>"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
JOB_TASKS = ("whisperq.transcribe", "whisperq.infer")
_JOB_PATH = re.compile(r"/jobs/([0-9a-fA-F-]{36})(?:/|\?|$|\s)")
REDACTED_QUERY = "?\u2026"  # what a URL's query (and fragment) become in logs
# scheme://[userinfo@]host[:port][/path][?query][#fragment], up to a space or a quote.
_URL = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#'\"<>]*@)?"
    r"(?P<rest>[^\s?#'\"<>]*)(?P<query>[?#][^\s'\"<>]*)?"
)


def _redact_match(match: re.Match[str]) -> str:
    userinfo = "***@" if match.group("userinfo") else ""
    query = REDACTED_QUERY if match.group("query") else ""
    return f"{match.group('scheme')}{userinfo}{match.group('rest')}{query}"


def redact_url(url: object) -> str:
    """A URL fit for a log line: scheme://host/path, its query and fragment replaced by
    ``?…`` and any user:password@ by ``***@``. What a client put in a URL's query
    (a presigned signature, a webhook token) never reaches the logs."""
    text = "" if url is None else str(url)
    if "://" in text:
        return _URL.sub(_redact_match, text)
    return text.split("?", 1)[0] + (REDACTED_QUERY if "?" in text else "")  # a bare path?query


def redact_urls_in(text: str) -> str:
    """Every URL in a message redacted as :func:`redact_url` does; other text untouched."""
    return _URL.sub(_redact_match, text) if "://" in text else text


def _queue_of(key: str | None) -> str | None:
    """The queue a message came from, by its routing key: each queue's key is its name
    without the ``whisperq.`` prefix (config.celeryconfig); some transports give the name."""
    if not key or key.startswith("whisperq."):
        return key
    return f"whisperq.{key}"


def wants_json(log_format: str | None = None) -> bool:
    """Whether this process logs JSON (`log_format` as in Settings.log_format)."""
    fmt = (log_format or os.environ.get("WHISPERQ_LOG_FORMAT") or "auto").strip().lower()
    if fmt == "auto":
        stream = sys.__stderr__
        return not (stream is not None and stream.isatty())
    return fmt == "json"


def job_context(record: logging.LogRecord | None = None) -> dict[str, object]:
    """The job a log line is about: the running Celery task, else the Flask request's
    job, else a "job %s ..." message's first argument. Cheap: no I/O."""
    ctx: dict[str, object] = {}
    try:
        from celery._state import get_current_task

        task = get_current_task()
    except ImportError:  # pragma: no cover - celery is a dependency
        task = None
    request = getattr(task, "request", None) if task is not None else None
    if request is not None and getattr(request, "id", None):
        delivery = getattr(request, "delivery_info", None) or {}
        key = delivery.get("routing_key")
        ctx.update(
            job_id=getattr(request, "whisperq_job_id", None) or (request.id if task.name in JOB_TASKS else None),
            task_id=request.id,
            task=task.name,
            queue=_queue_of(key),
            attempt=getattr(request, "whisperq_attempt", None) or (getattr(request, "retries", 0) or 0) + 1,
        )
    if not ctx.get("job_id") and "flask" in sys.modules:
        from flask import has_request_context
        from flask import request as http

        if has_request_context() and http.view_args:
            ctx["job_id"] = http.view_args.get("job_id")
    if record is not None and not ctx.get("job_id"):
        given = getattr(record, "job_id", None)
        if given:
            ctx["job_id"] = given
        elif (
            isinstance(record.msg, str)
            and record.msg.startswith("job %s")
            and isinstance(record.args, tuple)
            and record.args
        ):
            ctx["job_id"] = str(record.args[0])
    return {k: v for k, v in ctx.items() if v is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ts, level, logger, message, the job fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        out.update(job_context(record))
        if record.name == "gunicorn.access" and isinstance(record.args, Mapping):
            out.update(_access_fields(record.args))
        if record.exc_text:
            out["exc"] = record.exc_text
        elif record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def _access_fields(atoms: Mapping[str, object]) -> dict[str, object]:
    """gunicorn's access-log atoms as fields (method, path, status, duration)."""
    fields: dict[str, object] = {
        "method": atoms.get("m"),
        "path": atoms.get("U"),
        "status": atoms.get("s"),
        "remote": atoms.get("h"),
    }
    duration = atoms.get("D")  # microseconds: gunicorn's is an int
    if isinstance(duration, (int, float, str)):
        with contextlib.suppress(ValueError):
            fields["duration_ms"] = round(int(duration) / 1000, 1)
    match = _JOB_PATH.search(str(atoms.get("U") or ""))
    if match:
        fields["job_id"] = match.group(1)
    return {k: v for k, v in fields.items() if v not in (None, "-")}


class OmitTaskResults(logging.Filter):
    """Drop the return value from celery.app.trace's success line: for whisperq.infer
    that value is the transcript, which must not be copied into logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, Mapping) and "return_value" in args:
            record.args = dict(args, return_value=OMITTED)
            if isinstance(getattr(record, "data", None), Mapping):
                record.data = record.args
        return True


class RedactUrls(logging.Filter):
    """A handler's safety net: URLs in a record's message and arguments lose their query,
    fragment and credentials (:func:`redact_url`) before any formatter sees them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_urls_in(record.msg)
        args = record.args
        if isinstance(args, dict):  # in place: gunicorn's access atoms are a dict subclass
            for key, value in list(args.items()):
                redacted = _redact_arg(value)
                if redacted is not value:
                    args[key] = redacted
        elif isinstance(args, Mapping):
            record.args = {k: _redact_arg(v) for k, v in args.items()}
        elif isinstance(args, tuple):
            record.args = tuple(_redact_arg(v) for v in args)
        if record.exc_info and not record.exc_text:  # formatters use the cached text
            record.exc_text = redact_urls_in(logging.Formatter().formatException(record.exc_info))
        return True


def _redact_arg(value: object) -> object:
    if value is None or isinstance(value, (bool, int, float)):
        return value  # %d and %.1f keep working
    text = value if isinstance(value, str) else str(value)
    if "://" not in text:
        return value
    redacted = redact_urls_in(text)
    return value if redacted == text else redacted


def redact_handlers(loggers: list[logging.Logger]) -> None:
    """Install :class:`RedactUrls` on every handler of these loggers (once each)."""
    for logger in loggers:
        for handler in logger.handlers:
            if not any(isinstance(f, RedactUrls) for f in handler.filters):
                handler.addFilter(RedactUrls())


def omit_task_results() -> None:
    """Install :class:`OmitTaskResults` on Celery's trace logger (once)."""
    trace = logging.getLogger("celery.app.trace")
    if not any(isinstance(f, OmitTaskResults) for f in trace.filters):
        trace.addFilter(OmitTaskResults())


# Libraries' lines that tell an operator nothing, at the level from which they do: newer
# Alembic announces each of its plugins at INFO whenever a process opens the database.
QUIET = {"alembic.runtime.plugins": logging.WARNING}


def quiet_libraries() -> None:
    for name, level in QUIET.items():
        logging.getLogger(name).setLevel(level)


def use_json(loggers: list[logging.Logger]) -> None:
    """Give every handler of these loggers the JSON formatter."""
    for logger in loggers:
        for handler in logger.handlers:
            handler.setFormatter(JsonFormatter())


def connect_celery(log_format: str | None) -> None:
    """Hook into Celery's logging set-up (worker and beat; prefork children inherit it)."""
    from celery.signals import after_setup_logger, after_setup_task_logger
    from celery.utils.log import get_multiprocessing_logger

    def root_ready(logger: logging.Logger | None = None, **_kwargs: object) -> None:
        omit_task_results()
        quiet_libraries()
        if logger is not None:
            loggers = [logger] + [lg for lg in (get_multiprocessing_logger(),) if lg is not None]
            redact_handlers(loggers)
            if wants_json(log_format):
                use_json(loggers)

    def task_logger_ready(logger: logging.Logger | None = None, **_kwargs: object) -> None:
        if logger is not None:
            redact_handlers([logger])
            if wants_json(log_format):
                use_json([logger])

    after_setup_logger.connect(root_ready, weak=False, dispatch_uid="whisperq.logs.root")
    after_setup_task_logger.connect(task_logger_ready, weak=False, dispatch_uid="whisperq.logs.task")


def configure_web(log_format: str | None) -> None:
    """The web process: a root handler as logging.basicConfig would add (none is added
    when one exists, as under pytest), and JSON for gunicorn's own loggers."""
    omit_task_results()
    quiet_libraries()
    root = logging.getLogger()
    json_wanted = wants_json(log_format)
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter() if json_wanted else logging.Formatter(TEXT_FORMAT))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    gunicorn = [logging.getLogger("gunicorn.error"), logging.getLogger("gunicorn.access")]
    redact_handlers([root, *gunicorn])
    if json_wanted:
        use_json(gunicorn)
