"""`GET /openapi.json`: the API described in OpenAPI 3.0.3, written next to the code it
describes. tests/test_openapi.py fails when a route and this document disagree, and
tests/test_schemathesis.py fuzzes every operation against it."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify

from models.jobs.record import JobStatus
from models.speech.formats import FORMATS

from .openapi_batches import batch_paths, batch_schemas
from .openapi_schemas import STRING, choice, nullable, ref, schemas

bp = Blueprint("openapi", __name__)

JSON = "application/json"
ANYONE: list = []  # no authentication at all
# a key; none while WHISPERQ_ALLOW_ANONYMOUS is on
KEY_OR_ANONYMOUS: list[dict[str, list[str]]] = [{"bearerAuth": []}, {}]
KEY: list[dict[str, list[str]]] = [{"bearerAuth": []}]


def error(description: str, schema: str = "Error", headers: dict | None = None) -> dict:
    out: dict[str, Any] = {"description": description, "content": {JSON: {"schema": ref(schema)}}}
    if headers:
        out["headers"] = headers
    return out


RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again.", "schema": {"type": "integer"}}}
LOCATION = {"Location": {"description": "The job's status URL.", "schema": {"type": "string"}}}
POLLING = {
    "ETag": {
        "description": "Send it back in If-None-Match: 304 while the job is unchanged.",
        "schema": {"type": "string"},
    },
    "Retry-After": {
        "description": "Until the job is finished: seconds before polling again is worth it.",
        "schema": {"type": "integer"},
    },
}
IF_NONE_MATCH = {
    "name": "If-None-Match",
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": "The ETag of the job as last seen: 304, without a body, if it has not changed.",
}


def errors(*codes: int, schema: str = "Error") -> dict:
    """The error responses an operation can give, by status."""
    text = {
        400: "The request is wrong (a field, an option, the body); the message says what to change.",
        401: "`unauthorized`: no API key where one is needed, or an unknown or revoked key.",
        403: "`forbidden`: the key's tier (or anonymous use) may not ask for this priority; an s3:// audio_url "
        "outside the key's S3 sources (`allowed_s3_sources` lists them); the Host is one this "
        "server does not serve; an anonymous change from another site (admin API: it is off).",
        404: "`not_found`: no such job or key, or the job (the usage) belongs to another key.",
        409: "The job is not in a state that allows this (`not_ready`, `idempotency_conflict`, `audio_deleted`, "
        "`result_deleted`).",
        410: "`result_deleted`: retention deleted the transcript (WHISPERQ_RESULT_RETENTION).",
        413: "`too_large`: over WHISPERQ_MAX_UPLOAD_MB (an upload, or the object an s3:// audio_url names), a JSON "
        "body over 64 KiB (a correction: 2 MiB) or more than "
        "16 multipart parts; "
        "`audio_too_long`: over the audio length limit.",
        415: "`unsupported_media_type` (send multipart or JSON) or `unsupported_audio` (not decodable audio).",
        422: "`silent_audio`: decodable, but nothing louder than -60 dBFS in it.",
        429: "`rate_limited` (this client), `queue_full` (the queue's budget for this priority is used up) or "
        "`quota_exceeded` (the key's monthly audio quota: `quota` says how much is used and when it resets).",
        431: "`headers_too_large`: the request headers total more than 16 KiB.",
        503: (
            "`broker_unavailable`, `database_unavailable` or `disk_full`: nothing was stored; "
            "try again after Retry-After."
        ),
    }
    out = {}
    for code in codes:
        # 431 comes from the app before any view, in the app's own error shape.
        out[str(code)] = error(
            text[code], "Error" if code == 431 else schema, RETRY_AFTER if code in (429, 503) else None
        )
    return out


def query(name: str, schema: dict, description: str) -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1},
    "description": "The job's id, as `POST /v1/jobs` returned it.",
}
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x20-\\x7e]+$"},
    "description": "Repeat a submission safely: the same key and request within 24 h return the job made the "
    "first time (200); the same key with a different request is 409.",
}


def ok(description: str, schema: dict | None = None, media: str = JSON, headers: dict | None = None) -> dict:
    out: dict[str, Any] = {"description": description}
    if schema is not None:
        out["content"] = {media: {"schema": schema}}
    if headers:
        out["headers"] = headers
    return out


def op(
    op_id: str, summary: str, responses: dict, security: list = KEY_OR_ANONYMOUS, tag: str = "jobs", **extra: Any
) -> dict:
    return {
        "operationId": op_id,
        "summary": summary,
        "tags": [tag],
        "security": security,
        "responses": responses,
        **extra,
    }


def paths() -> dict:
    job = ref("Job")
    admin: dict[str, Any] = {"security": KEY, "tag": "admin"}
    transcript_media = {
        "text/plain": {"schema": STRING},
        JSON: {"schema": ref("Transcript")},
        "application/x-subrip": {"schema": STRING},
        "text/vtt": {"schema": STRING},
    }
    return {
        "/v1/jobs": {
            "post": op(
                "createJob",
                "Submit audio: an upload (multipart) or a URL to fetch (JSON)",
                {
                    "202": ok("Accepted: the job is queued.", job, headers=LOCATION),
                    "200": ok("The job an earlier request with this Idempotency-Key made.", job, headers=LOCATION),
                    **errors(400, 401, 403, 409, 413, 415, 422, 429, 431, 503),
                },
                parameters=[IDEMPOTENCY_KEY],
                requestBody={
                    "required": True,
                    "content": {
                        "multipart/form-data": {"schema": ref("Upload")},
                        JSON: {"schema": ref("UrlSubmission")},
                    },
                },
            ),
            "get": op(
                "listJobs",
                "List jobs, newest first, a page at a time",
                {
                    "200": ok("A page of jobs; follow next_url (or pass next_cursor) for the next.", ref("JobList")),
                    **errors(400, 401, 431),
                },
                parameters=[
                    query(
                        "status",
                        choice([s.value for s in JobStatus], any_case=True),
                        "Only jobs in this status: " + ", ".join(s.value for s in JobStatus) + " (any letter case).",
                    ),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}, "Page size."),
                    query("cursor", STRING, "next_cursor from the previous page."),
                ],
            ),
        },
        "/v1/usage": {
            "get": op(
                "getUsage",
                "Audio seconds and jobs per UTC day: the calling key's (an admin's: any key's, or "
                "every key's), with this month's quota",
                {"200": ok("Usage per key, day by day.", ref("Usage")), **errors(400, 401, 404, 431)},
                tag="usage",
                parameters=[
                    query(
                        "from",
                        {"type": "string", "format": "date"},
                        "First UTC day (default: the first of this month).",
                    ),
                    query("to", {"type": "string", "format": "date"}, "Last UTC day, included (default: today)."),
                    query(
                        "key",
                        STRING,
                        "Admins: one key, by id or the start of the key (default: every key)."
                        " Other keys may name only themselves.",
                    ),
                ],
            ),
        },
        "/v1/webhook-secret": {
            "post": op(
                "rotateWebhookSecret",
                "A new webhook signing secret for the calling API key (shown once)",
                {
                    "200": ok("The new secret; the old one signs beside it for 24 hours.", ref("WebhookSecret")),
                    **errors(401, 403, 431),
                },
                security=KEY,
            ),
        },
        "/v1/jobs/{job_id}": {
            "parameters": [JOB_ID],
            "get": op(
                "getJob",
                "A job: its status, progress, estimates and (once done) its transcript",
                {
                    "200": ok("The job.", job, headers=POLLING),
                    "304": {
                        "description": "Not modified: the job is as the ETag sent in If-None-Match says.",
                        "headers": POLLING,
                    },
                    **errors(400, 401, 404, 431),
                    "429": error(
                        "`rate_limited`: polled faster than its Retry-After; poll at that pace, or use `?wait=`.",
                        headers=RETRY_AFTER,
                    ),
                },
                parameters=[
                    IF_NONE_MATCH,
                    query(
                        "wait",
                        {"type": "integer", "minimum": 1, "maximum": 60},
                        "Long-poll: answer as soon as the job itself changes (not its place in the "
                        "queue) from the state in If-None-Match (without it: its state now), or "
                        "after this many seconds: 304 if nothing changed (without it: 200).",
                    ),
                ],
            ),
            "delete": op(
                "deleteJob",
                "Delete a job's audio and transcript (a running job stops)",
                {"204": ok("Deleted."), **errors(401, 404, 431)},
            ),
        },
        "/v1/jobs/{job_id}/cancel": {
            "parameters": [JOB_ID],
            "post": op(
                "cancelJob",
                "Cancel a job that has not finished",
                {
                    "200": ok("Cancelled: it was waiting.", job),
                    "202": ok("Cancel requested: the running job stops at its next window.", job),
                    **errors(401, 404, 409, 431),
                },
            ),
        },
        "/v1/jobs/{job_id}/rerun": {
            "parameters": [JOB_ID],
            "post": op(
                "rerunJob",
                "Run a job's audio again as a new job linked to it (`rerun_of`), most often on "
                "another model, while the audio is kept",
                {
                    "202": ok("The new job, queued.", job, headers=LOCATION),
                    **errors(400, 401, 403, 404, 409, 415, 429, 431, 503),
                },
                requestBody={"required": False, "content": {JSON: {"schema": ref("Rerun")}}},
            ),
        },
        "/v1/jobs/{job_id}/transcript": {
            "parameters": [JOB_ID],
            "get": op(
                "getTranscript",
                "Download the transcript of a COMPLETED (or partial, CANCELLED) job",
                {
                    "200": {
                        "description": "The transcript in the asked format.",
                        "content": transcript_media,
                        "headers": {
                            "Content-Disposition": {"description": "With `download`: an attachment.", "schema": STRING}
                        },
                    },
                    **errors(400, 401, 404, 409, 410, 431),
                },
                parameters=[
                    query(
                        "format",
                        {**choice(FORMATS, any_case=True, blank=True), "default": "txt"},
                        "txt (the default), json, srt or vtt (any letter case).",
                    ),
                    query("download", STRING, "Any non-empty value: send it as a file to save."),
                ],
            ),
            "put": op(
                "correctTranscript",
                "Correct a COMPLETED job's transcript: kept beside the original, which stays",
                {
                    "200": ok("The job, with `correction` beside the original `result`.", job),
                    **errors(400, 401, 404, 409, 413, 415, 431),
                },
                requestBody={"required": True, "content": {JSON: {"schema": ref("CorrectionRequest")}}},
                description="Replaces an earlier correction. 409 `not_ready` until the job is COMPLETED, "
                "`result_deleted` once retention deleted its transcript. A collected job is exported "
                "with the corrected text (`whisperq dataset export`). The body may be up to 2 MiB.",
            ),
        },
        "/v1/models": {
            "get": op(
                "listModels",
                "The models served: the names `model` accepts (OpenAI-compatible), each "
                "with its engine, version and languages",
                {
                    "200": ok(
                        "The models; `whisper-1` first, the default model under OpenAI's name.",
                        {
                            "type": "object",
                            "required": ["object", "data"],
                            "properties": {
                                "object": {"type": "string", "enum": ["list"]},
                                "data": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["id"],
                                        "properties": {
                                            "id": STRING,
                                            "object": STRING,
                                            "created": {"type": "integer"},
                                            "owned_by": STRING,
                                            "engine": STRING,
                                            "version": {"type": "string", "description": "sha256 of the weights"},
                                            "multilingual": {"type": "boolean"},
                                            "languages": {"type": "array", "items": STRING},
                                            "default": {"type": "boolean"},
                                            "served": {
                                                "type": "boolean",
                                                "description": "A live inference worker serves it.",
                                            },
                                            "alias_of": {"type": "string"},
                                            "variants": {
                                                "type": "array",
                                                "description": "An alias's models and their weights: "
                                                "each job draws one.",
                                                "items": {
                                                    "type": "object",
                                                    "properties": {"id": STRING, "weight": {"type": "integer"}},
                                                },
                                            },
                                            "shadow": {
                                                "type": "object",
                                                "nullable": True,
                                                "description": "The candidate that "
                                                "decodes this share of the model's jobs again, apart.",
                                                "properties": {"candidate": STRING, "percent": {"type": "integer"}},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    ),
                    **errors(401, 431, schema="OpenAIError"),
                },
                tag="openai",
            ),
        },
        "/v1/audio/transcriptions": {
            "post": op(
                "createTranscription",
                "OpenAI-compatible transcription: waits up to WHISPERQ_SYNC_WAIT_SECONDS",
                {
                    "200": {
                        "description": "The transcript, in response_format.",
                        "content": {
                            JSON: {"schema": ref("Transcription")},
                            "text/plain": {"schema": STRING},
                            "application/x-subrip": {"schema": STRING},
                            "text/vtt": {"schema": STRING},
                        },
                    },
                    "202": ok(
                        "Still transcribing at the deadline: poll the job.", ref("TranscriptionJob"), headers=LOCATION
                    ),
                    **errors(400, 401, 403, 413, 429, 431, 503, schema="OpenAIError"),
                },
                tag="openai",
                requestBody={
                    "required": True,
                    "content": {"multipart/form-data": {"schema": ref("TranscriptionRequest")}},
                },
            ),
        },
        "/v1/admin/dead-letters/{job_id}": {
            "parameters": [JOB_ID],
            "get": op(
                "getDeadLetter",
                "One dead letter: the error, traceback and attempts",
                {"200": ok("The dead letter.", ref("DeadLetter")), **errors(401, 403, 404, 431)},
                **admin,
            ),
            "delete": op(
                "purgeDeadLetter",
                "Purge one dead letter (its job stays FAILED)",
                {"204": ok("Purged."), **errors(401, 403, 404, 431)},
                **admin,
            ),
        },
        "/v1/admin/dead-letters/{job_id}/replay": {
            "parameters": [JOB_ID],
            "post": op(
                "replayDeadLetter",
                "Queue a dead job again with its attempts reset, on another model if the body names one",
                {
                    "202": ok(
                        "Queued again.",
                        {
                            "type": "object",
                            "required": ["job_id", "status"],
                            "properties": {"job_id": STRING, "status": STRING, "model": nullable(STRING)},
                        },
                    ),
                    **errors(400, 401, 403, 404, 409, 431, 503),
                },
                requestBody={
                    "required": False,
                    "content": {JSON: {"schema": {"type": "object", "properties": {"model": nullable(STRING)}}}},
                },
                **admin,
            ),
        },
        "/v1/admin/status": {
            "get": op(
                "poolsStatus",
                "The pools' live workers and hosts, each queue's depth by tier, the jobs by status, the dead letters",
                {
                    "200": ok(
                        "What `whisperq status` prints, on every broker.",
                        {
                            "type": "object",
                            "required": ["broker", "transport", "pools", "workers", "hosts", "queues", "jobs"],
                            "properties": {
                                "broker": STRING,
                                "transport": {"type": "string", "enum": ["redis", "amqp", "sqs"]},
                                "pools": {"type": "object", "additionalProperties": {"type": "object"}},
                                "workers": {"type": "array", "items": {"type": "object"}},
                                "hosts": {"type": "object", "additionalProperties": {"type": "object"}},
                                "queues": {"type": "object", "additionalProperties": {"type": "object"}},
                                "jobs": {"type": "object", "additionalProperties": {"type": "integer"}},
                                "dead_letters": {"type": "integer"},
                            },
                        },
                    ),
                    **errors(401, 403, 431),
                },
                **admin,
            ),
        },
        "/v1/admin/dead-letters": {
            "get": op(
                "listDeadLetters",
                "Jobs that used up their attempts, newest first",
                {
                    "200": ok(
                        "The dead letters.",
                        {
                            "type": "object",
                            "required": ["dead_letters"],
                            "properties": {"dead_letters": {"type": "array", "items": ref("DeadLetter")}},
                        },
                    ),
                    **errors(400, 401, 403, 431),
                },
                parameters=[
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}, "How many.")
                ],
                **admin,
            ),
            "delete": op(
                "purgeDeadLetters",
                "Purge every dead letter (their jobs stay FAILED)",
                {
                    "200": ok(
                        "How many were purged.",
                        {"type": "object", "required": ["purged"], "properties": {"purged": {"type": "integer"}}},
                    ),
                    **errors(401, 403, 431),
                },
                **admin,
            ),
        },
        "/healthz": {
            "get": op(
                "healthz",
                "Liveness: the web process answers",
                {
                    "200": ok(
                        "Alive.",
                        {
                            "type": "object",
                            "required": ["status"],
                            "properties": {"status": {"type": "string", "enum": ["ok"]}},
                        },
                    )
                },
                security=ANYONE,
                tag="operations",
            )
        },
        "/readyz": {
            "get": op(
                "readyz",
                "Readiness: database, broker, disk floor and an inference worker",
                {
                    "200": ok("Ready.", ref("Readiness")),
                    "503": ok("Not ready; `checks` says what is not.", ref("Readiness")),
                },
                security=ANYONE,
                tag="operations",
            )
        },
        "/metrics": {
            "get": op(
                "metrics",
                "Prometheus metrics for the whole cluster",
                {
                    "200": {
                        "description": "Prometheus text format, or OpenMetrics when the Accept header asks for it.",
                        "content": {
                            "text/plain": {"schema": STRING},
                            "application/openmetrics-text": {"schema": STRING},
                        },
                    },
                    "401": {
                        "description": "WHISPERQ_METRICS_TOKEN is set and the request does not carry it as a bearer "
                        "token (JSON when the Accept header asks for it, else a page).",
                        "content": {JSON: {"schema": ref("Error")}, "text/html": {"schema": STRING}},
                    },
                    "403": {
                        "description": "WHISPERQ_METRICS_TOKEN is not set and the request does not come from loopback "
                        "(or came through a proxy): set the token to scrape from elsewhere.",
                        "content": {JSON: {"schema": ref("Error")}, "text/html": {"schema": STRING}},
                    },
                },
                tag="operations",
                description="Needs `Authorization: Bearer $WHISPERQ_METRICS_TOKEN` when that is set; answers loopback "
                "only otherwise.",
            )
        },
        "/openapi.json": {
            "get": op(
                "openapi",
                "This document",
                {"200": ok("The OpenAPI document.", {"type": "object"})},
                security=ANYONE,
                tag="operations",
            )
        },
    }


def document(models: list[str]) -> dict:
    components = {**schemas(models), **batch_schemas(models)}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "whisperq",
            "version": _version(),
            "description": "Self-hosted speech-to-text on a queue. Submit audio with `POST /v1/jobs`, follow the "
            "job at its status URL, download the transcript. Errors are "
            '`{"error": {"code", "message"}}` (OpenAI\'s shape on `/v1/audio/transcriptions` '
            "and `/v1/models`). Every response under `/v1/` is `Cache-Control: no-store`. The "
            "web page's own calls carry its session cookie and an `X-CSRF-Token` header instead "
            "of a key.",
        },
        "tags": [{"name": "jobs"}, {"name": "usage"}, {"name": "openai"}, {"name": "admin"}, {"name": "operations"}],
        "security": KEY_OR_ANONYMOUS,
        "paths": {**paths(), **batch_paths(op, ok, errors, query, IDEMPOTENCY_KEY, LOCATION)},
        "components": {
            "securitySchemes": {
                "bearerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`Authorization: Bearer <api key>` on `/v1/`: an unknown or revoked key is 401; a "
                    "key whose tier may not ask for a priority is 403; another key's job is 404. With "
                    "WHISPERQ_ALLOW_ANONYMOUS on, requests without a key are served too. `/v1/admin/` "
                    "takes an admin key or WHISPERQ_ADMIN_TOKEN; `/metrics` takes "
                    "WHISPERQ_METRICS_TOKEN when that is set.",
                }
            },
            "schemas": components,
        },
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("whisperq")
    except PackageNotFoundError:
        return "0"


@bp.get("/openapi.json")
def openapi():
    from .openai_api import model_names

    cached = current_app.extensions.get("whisperq_openapi")
    if cached is None:
        cached = document(model_names(current_app.extensions["whisperq"].settings))
        current_app.extensions["whisperq_openapi"] = cached
    return jsonify(cached)
