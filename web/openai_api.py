"""An OpenAI-compatible transcription endpoint, so clients written for OpenAI's audio API
(the official SDKs, `curl` recipes) work against whisperq unchanged:

    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
    client.audio.transcriptions.create(model="whisper-1", file=open("call.flac", "rb"))

A request becomes an ordinary job at the highest priority the caller may ask for (its
key's tier, or WHISPERQ_ANONYMOUS_MAX_PRIORITY), through the same queue and pools, and the
connection waits for it up to WHISPERQ_SYNC_WAIT_SECONDS. Past that it answers `202` with
the job's id and `Location`, instead of tying up the connection: poll the job there. Only
WHISPERQ_SYNC_WAITS requests of a web process (WHISPERQ_SYNC_WAITS_PER_CLIENT of one
client) wait at once; the others get their `202` at once. Errors come in OpenAI's shape:
{"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, cast

from flask import Blueprint, Response, current_app, jsonify, request, url_for
from werkzeug.datastructures import MultiDict
from werkzeug.exceptions import HTTPException

from models.errors import (
    DATABASE_AWAY,
    AudioTooLong,
    DatabaseUnavailable,
    InvalidRequest,
    UnsupportedAudio,
    WhisperqError,
)
from models.jobs.operations import get_job
from models.jobs.record import JobStatus
from models.pipeline import intake
from models.pipeline.request import names_for
from models.speech.formats import render

from .admission import admit_submission, client_key
from .auth import current
from .uploads import upload_submission

log = logging.getLogger(__name__)

bp = Blueprint("openai", __name__, url_prefix="/v1")

FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
GRANULARITIES = ("segment", "word")
ALIAS = "whisper-1"


def model_names(settings) -> list[str]:
    """The models as clients may name them: OpenAI's `whisper-1` (the default model), and each
    served model's name (config.registry)."""
    return [ALIAS, *(spec.name for spec in settings.models), *(alias for alias, _ in settings.routes.aliases)]


def openai_error(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict | None = None,
    details: dict | None = None,
):
    kind = {401: "authentication_error", 429: "rate_limit_error", 503: "server_error", 500: "server_error"}.get(
        status, "invalid_request_error"
    )
    kind = "insufficient_quota" if code == "quota_exceeded" else kind  # as OpenAI names a spent quota
    body = {"error": {"message": message, "type": kind, "param": param, "code": code, **(details or {})}}
    return jsonify(body), status, headers or {}


@bp.errorhandler(WhisperqError)
def _service_error(exc: WhisperqError):
    headers = dict(getattr(exc, "headers", None) or {})
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        headers["Retry-After"] = str(int(retry_after))
    elif exc.http_status == 503:  # the broker or the database away
        headers["Retry-After"] = "5"
    status = exc.http_status
    if isinstance(exc, (UnsupportedAudio, InvalidRequest)) and not isinstance(exc, AudioTooLong):
        status = 400  # OpenAI answers a file it cannot read with 400 invalid_request_error
    param = "file" if isinstance(exc, UnsupportedAudio) else None
    return openai_error(
        status, str(exc), param=param, code=exc.code, headers=headers, details=getattr(exc, "details", None)
    )


def _database_away(exc: Exception):
    log.warning("the database is unreachable on %s %s: %s", request.method, request.path, str(exc).splitlines()[0])
    return _service_error(DatabaseUnavailable())


for _away in DATABASE_AWAY:
    bp.register_error_handler(_away, _database_away)


@bp.errorhandler(HTTPException)
def _http_error(exc: HTTPException):
    return openai_error(
        exc.code or 500, exc.description or exc.name, code=(exc.name or "error").lower().replace(" ", "_")
    )


@bp.get("/models")
def models():
    """OpenAI's model list, each entry with its engine, version (the weights' hash), languages,
    whether it is the default, and whether a live inference worker serves it. How aliases
    split their jobs (A/B weights) and which models are shadowed is the operator's business:
    only an admin sees `variants` and `shadow`."""
    from models.jobs.workers import served_models
    from models.registry.catalog import describe

    rt = current_app.extensions["whisperq"]
    admin = current().admin  # the openai blueprint acts for someone (web.auth)
    served = served_models(rt)
    data = [
        dict(info.to_dict(), object="model", created=0, owned_by="whisperq", served=info.name in served)
        for info in describe(rt.settings, rt.active_spec)
    ]
    routes = rt.settings.routes
    for alias, variants in routes.aliases:  # A/B: each job draws one variant by weight
        data.append(
            {
                "id": alias,
                "object": "model",
                "created": 0,
                "owned_by": "whisperq",
                "default": alias == routes.default,
                "served": all(m == rt.settings.default_model or m in served for m, _ in variants),
            }
        )
        if admin:
            data[-1]["variants"] = [{"id": model, "weight": weight} for model, weight in variants]
    for entry in data if admin else ():
        entry["shadow"] = next(
            ({"candidate": c, "percent": pct} for p, c, pct in routes.shadows if p == entry["id"]), None
        )
    default = next(entry for entry in data if entry["default"])
    data.insert(0, dict(default, id=ALIAS, default=False, alias_of=default["id"]))
    return jsonify({"object": "list", "data": data})


class WaitGate:
    """Who may hold a web thread waiting for a transcript: at most `total` requests of this
    process at once, at most `per_client` of one client. The rest get their 202 at once, so
    the threads stay free for /healthz, submissions and status (the Procfile runs 4 a process)."""

    def __init__(self, total: int, per_client: int):
        self.total, self.per_client = total, per_client
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}

    def enter(self, client: str) -> bool:
        with self._lock:
            if sum(self._held.values()) >= self.total or self._held.get(client, 0) >= self.per_client:
                return False
            self._held[client] = self._held.get(client, 0) + 1
            return True

    def leave(self, client: str) -> None:
        with self._lock:
            self._held[client] -= 1
            if not self._held[client]:
                del self._held[client]


def _gate(settings) -> WaitGate:
    gate = current_app.extensions.get("whisperq_waits")
    if gate is None:
        gate = current_app.extensions.setdefault(
            "whisperq_waits", WaitGate(settings.sync_waits, settings.sync_waits_per_client)
        )
    return gate


@bp.post("/audio/transcriptions")
def transcriptions():
    rt = current_app.extensions["whisperq"]
    admit_submission("openai")
    form = request.form
    model = (form.get("model") or "").strip()
    if not model:
        raise InvalidRequest("you must provide a model parameter, such as whisper-1")
    if model not in model_names(rt.settings):
        return openai_error(
            400,
            f"The model `{model}` does not exist; use one of: {', '.join(model_names(rt.settings))}",
            param="model",
            code="model_not_found",
        )
    fmt = (form.get("response_format") or "json").strip()
    if fmt not in FORMATS:
        return openai_error(400, f"response_format must be one of: {', '.join(FORMATS)}", param="response_format")
    granularities = form.getlist("timestamp_granularities[]") or form.getlist("timestamp_granularities")
    unknown = [g for g in granularities if g not in GRANULARITIES]
    if unknown:
        return openai_error(
            400,
            f"timestamp_granularities may hold {', '.join(GRANULARITIES)}, not {unknown[0]!r}",
            param="timestamp_granularities[]",
        )
    if granularities and fmt != "verbose_json":
        return openai_error(
            400, "timestamp_granularities needs response_format verbose_json", param="timestamp_granularities[]"
        )
    # The highest priority the caller may ask for: its tier's, or WHISPERQ_ANONYMOUS_MAX_PRIORITY.
    who = current()
    fields = MultiDict(
        {"priority": who.max_priority, "word_timestamps": "true" if "word" in granularities else "false"}
    )
    # OpenAI's own fields, and whisperq's (hotwords, speakers, redact) checked as every door checks them
    for name in names_for("openai"):
        if form.get(name) not in (None, ""):
            fields[name] = form[name]
    if fmt == "diarized_json" and not fields.get("speakers"):
        fields["speakers"] = "true"
    if model != ALIAS:
        fields["model"] = model
    job, _ = intake.submit(
        rt,
        upload_submission(
            rt,
            who,
            "openai",
            request.files.get("file"),
            fields,
            MultiDict({"file": request.files["file"]}) if "file" in request.files else {},
        ),
    )
    gate, client = _gate(rt.settings), client_key()
    waited = gate.enter(client)
    try:
        deadline = time.monotonic() + (rt.settings.sync_wait_seconds if waited else 0.0)
        while True:
            job = get_job(rt, job.id)
            if job.state.finished or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
    finally:
        if waited:
            gate.leave(client)
    status_url = url_for("api.show", job_id=job.id, _external=True)
    if not job.state.finished:
        message = (
            f"still transcribing after {rt.settings.sync_wait_seconds:g} s; poll status_url"
            if waited
            else "queued; this server is holding as many waiting requests as it allows, so poll status_url"
        )
        body = {
            "id": job.id,
            "object": "transcription.job",
            "status": job.status,
            "status_url": status_url,
            "message": message,
        }
        return jsonify(body), 202, {"Location": status_url, "Retry-After": "1"}
    if job.state is not JobStatus.COMPLETED:
        return openai_error(
            400 if job.state is JobStatus.FAILED else 503,
            f"the transcription {job.status.lower()}: {job.error or 'no reason recorded'}",
            param="file",
            code=job.status.lower(),
        )
    answer = _render(cast("dict[str, Any]", job.result()), fmt, "word" in granularities)  # COMPLETED: never None
    # The job behind the answer, for its other ways out (GET /v1/jobs/<id>, its formats, gRPC).
    answer.headers["X-Job-Id"] = job.id
    answer.headers["Location"] = status_url
    return answer


def _render(result: dict, fmt: str, words: bool):
    if fmt == "json":
        return jsonify({"text": result["text"]})
    if fmt in ("text", "srt", "vtt"):
        kind = "txt" if fmt == "text" else fmt
        mime = {"txt": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}[kind]
        return Response(render(result, kind), mimetype=mime)
    if fmt == "diarized_json":  # as OpenAI's diarizing model answers
        return jsonify(
            {
                "task": "transcribe",
                "duration": result["duration"],
                "text": result["text"],
                "segments": [
                    {
                        "type": "transcript.text.segment",
                        "id": f"seg_{n}",
                        "start": s["start"],
                        "end": s["end"],
                        "text": s["text"],
                        "speaker": s.get("speaker"),
                    }
                    for n, s in enumerate(result["segments"])
                ],
            }
        )
    body = {
        "task": "transcribe",
        "language": result["language"],
        "duration": result["duration"],
        "text": result["text"],
        "segments": [
            {
                "id": n,
                "seek": int(s["start"] * 100),
                "start": s["start"],
                "end": s["end"],
                "text": s["text"],
                "tokens": [],
                "temperature": (result.get("model") or {}).get("temperature") or 0.0,
                # how sure the model was, as OpenAI's verbose_json gives it
                **{k: s[k] for k in ("avg_logprob", "compression_ratio", "no_speech_prob", "speaker") if k in s},
            }
            for n, s in enumerate(result["segments"])
        ],
    }
    if words:
        body["words"] = [
            {"word": w["word"], "start": w["start"], "end": w["end"], "probability": w.get("probability")}
            for s in result["segments"]
            for w in s.get("words") or ()
        ]
    return jsonify(body)
