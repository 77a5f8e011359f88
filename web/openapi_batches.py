"""The batch operations and shapes of the OpenAPI document (web/openapi.py): POST /v1/batches,
GET /v1/batches/{batch_id}, POST /v1/batches/{batch_id}/cancel (web/batches.py)."""

from __future__ import annotations

from models.jobs.record import JobStatus

from .openapi_schemas import STRING, TIME, choice, nullable, options, ref

BATCH_ID = {
    "name": "batch_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "minLength": 1},
    "description": "The batch's id, as `POST /v1/batches` returned it.",
}


def batch_paths(op, ok, errors, query, idempotency_key: dict, location: dict) -> dict:
    batch = ref("Batch")
    return {
        "/v1/batches": {
            "post": op(
                "createBatch",
                "Submit many audio URLs (JSON) or files (multipart) at once: one batch, one "
                "job each, one webhook (`batch.completed`) when all have finished",
                {
                    "202": ok("Accepted: every job of the batch is queued.", batch, headers=location),
                    "200": ok("The batch an earlier request with this Idempotency-Key made.", batch, headers=location),
                    **errors(400, 401, 403, 409, 413, 415, 429, 431, 503),
                },
                parameters=[idempotency_key],
                requestBody={
                    "required": True,
                    "content": {
                        "application/json": {"schema": ref("BatchSubmission")},
                        "multipart/form-data": {
                            "schema": ref("BatchUpload"),
                            "encoding": {"file": {"contentType": "application/octet-stream"}},
                        },
                    },
                },
            ),
        },
        "/v1/batches/{batch_id}": {
            "parameters": [BATCH_ID],
            "get": op(
                "getBatch",
                "A batch: its jobs counted by status, whether it is done, and a page of its jobs",
                {"200": ok("The batch.", batch), **errors(400, 401, 404, 431)},
                parameters=[
                    query(
                        "status",
                        choice([s.value for s in JobStatus], any_case=True),
                        "Only the jobs in this status (the counts are always of every job).",
                    ),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}, "Jobs per page."),
                    query("cursor", {"type": "string", "maxLength": 36}, "next_cursor from the previous page."),
                ],
            ),
        },
        "/v1/batches/{batch_id}/cancel": {
            "parameters": [BATCH_ID],
            "post": op(
                "cancelBatch",
                "Cancel every job of the batch that has not finished",
                {
                    "200": ok("The batch, its waiting jobs CANCELLED (running ones stop at their next window).", batch),
                    **errors(401, 404, 409, 431),
                },
            ),
        },
    }


def batch_schemas(models: list[str]) -> dict:
    shared = {k: v for k, v in options(json_body=True, models=models).items() if k != "callback_url"}
    per_item = {k: v for k, v in shared.items() if k != "priority"}
    url = {
        "type": "string",
        "format": "uri",
        "description": "A public http(s) URL the preparation pool fetches, or s3://BUCKET/KEY under one of the "
        "key's S3 sources.",
    }
    count = {"type": "integer", "minimum": 0}
    return {
        "BatchItem": {
            "type": "object",
            "required": ["audio_url"],
            "additionalProperties": False,
            "properties": {
                "audio_url": url,
                **per_item,
                "callback_url": nullable(
                    {
                        "type": "string",
                        "format": "uri",
                        "description": "This job's own webhook (job.completed …); "
                        "without it, only the batch's is sent.",
                    }
                ),
            },
        },
        "BatchSubmission": {
            "type": "object",
            "additionalProperties": False,
            "description": "`audio_urls` or `items` (1 to WHISPERQ_MAX_BATCH_ITEMS, default 100), and options for "
            "every item (an item's own override them, but the priority is the batch's).",
            "properties": {
                "audio_urls": {"type": "array", "minItems": 1, "items": url},
                "items": {"type": "array", "minItems": 1, "items": ref("BatchItem")},
                "callback_url": nullable(
                    {
                        "type": "string",
                        "format": "uri",
                        "description": "A public http(s) URL POSTed `batch.completed` once every job has finished.",
                    }
                ),
                **shared,
            },
        },
        "BatchUpload": {
            "type": "object",
            "required": ["file"],
            "additionalProperties": False,
            "description": "Files, each in a field named `file` (1 to WHISPERQ_MAX_BATCH_ITEMS; each at most "
            "WHISPERQ_MAX_UPLOAD_MB, all together at most WHISPERQ_MAX_BATCH_UPLOAD_MB), and options "
            "for every file.",
            "properties": {
                "file": {"type": "array", "minItems": 1, "items": {"type": "string", "format": "binary"}},
                "callback_url": {
                    "type": "string",
                    "format": "uri",
                    "description": "A public http(s) URL POSTed `batch.completed` once every job has finished.",
                },
                **{k: v for k, v in options(json_body=False, models=models).items() if k != "callback_url"},
            },
        },
        "BatchJob": {
            "type": "object",
            "required": ["job_id", "status", "deleted", "status_url", "transcript_url"],
            "properties": {
                "job_id": STRING,
                "status": {"type": "string", "enum": [s.value for s in JobStatus]},
                "deleted": {"type": "boolean"},
                "audio_url": nullable(STRING),
                "filename": nullable(STRING),
                "error": nullable(STRING),
                "status_url": nullable(STRING),
                "transcript_url": nullable(STRING),
            },
        },
        "Batch": {
            "type": "object",
            "required": [
                "batch_id",
                "status",
                "done",
                "total",
                "counts",
                "created_at",
                "finished_at",
                "status_url",
                "cancel_url",
                "jobs",
                "next_cursor",
                "next_url",
            ],
            "properties": {
                "batch_id": STRING,
                "status": {
                    "type": "string",
                    "enum": ["PROCESSING", "COMPLETED"],
                    "description": "COMPLETED once every job is COMPLETED, FAILED, CANCELLED or EXPIRED.",
                },
                "done": {"type": "boolean"},
                "total": count,
                "counts": {"type": "object", "properties": {s.value: count for s in JobStatus}},
                "callback_url": nullable(STRING),
                "created_at": {"type": "string", "format": "date-time"},
                "finished_at": TIME,
                "status_url": STRING,
                "cancel_url": STRING,
                "jobs": {"type": "array", "items": ref("BatchJob")},
                "next_cursor": nullable(STRING),
                "next_url": nullable(STRING),
                "webhook_deliveries": {
                    "type": "array",
                    "items": ref("WebhookDelivery"),
                    "description": "With a callback_url: the batch.completed delivery.",
                },
            },
        },
    }
