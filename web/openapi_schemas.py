"""The shapes in the API's OpenAPI document (web/openapi.py): jobs, transcripts, errors,
the submission bodies, dead letters and the OpenAI-compatible bodies."""

from __future__ import annotations

from typing import Any

from config import LANGUAGES, PRIORITIES
from models.jobs.corrections import MAX_SEGMENT_TEXT, MAX_SEGMENTS, MAX_TEXT
from models.jobs.record import JobStatus, Stage
from models.pipeline.request import OPTIONS, RERUN_KEPT, names_for
from models.speech.formats import FORMATS


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: dict) -> dict:
    return {**schema, "nullable": True}


STRING = {"type": "string"}
TIME = nullable({"type": "string", "format": "date-time"})


def choice(values, *, any_case: bool = False, blank: bool = False, padded: bool = False) -> dict:
    """One of `values`, as leniently as the app reads it: in any letter case, empty (for the
    default) or with spaces around it where it does. A pattern says exactly that, so a
    value the app accepts is never called invalid (nor the reverse). The description names
    the plain values."""

    def word(value: str) -> str:
        escaped = "".join("\\" + c if c in ".^$*+?()[]{}|\\/" else c for c in value)
        return "".join(f"[{c.upper()}{c.lower()}]" if any_case and c.isalpha() else c for c in escaped)

    alternatives = "(?:" + "|".join(word(v) for v in values) + ")"
    if padded:
        alternatives = "\\s*" + alternatives + "\\s*"
    pattern = "^(?:" + alternatives + ")" + ("?" if blank else "") + "$"
    return {"type": "string", "pattern": pattern, "example": next(iter(values))}


def options(json_body: bool, models: list[str] | None = None) -> dict:
    """The job options a submission may carry (form fields, or JSON members), from their one
    declaration (models.pipeline.request)."""
    maybe = nullable if json_body else (lambda s: s)
    out = {}
    for o in OPTIONS:
        schema: dict[str, Any]
        if o.name == "language":
            schema = {"type": "string", "description": o.help + " Codes: " + ", ".join(sorted(LANGUAGES)) + "."}
        elif o.name == "model":
            schema = {"type": "string", **({"enum": list(models)} if models else {}), "description": o.help}
        elif o.kind == "choice":
            schema = {**choice(o.choices, any_case=True, blank=True, padded=True), "description": o.help}
        elif o.kind == "flag":
            schema = {"type": "boolean", "default": False, "description": o.help}
        elif o.kind == "number":
            schema = {"type": "number", "minimum": o.low, "maximum": o.high, "description": o.help}
        elif o.name == "callback_url":
            schema = {"type": "string", "format": "uri", "description": o.help}
        else:
            schema = {"type": "string", "description": o.help}
            if o.max_length is not None:
                schema["maxLength"] = o.max_length
        out[o.name] = maybe(schema)
    return out


def usage_schemas() -> dict:
    """GET /v1/usage (models.access.usage says what counts) and a key's quota standing."""
    seconds, count = {"type": "number", "minimum": 0}, {"type": "integer", "minimum": 0}
    figures = {
        "jobs": count,
        "audio_seconds": seconds,
        "in_flight_jobs": count,
        "in_flight_audio_seconds": seconds,
        "unbilled_jobs": count,
    }
    return {
        "UsageFigures": {
            "type": "object",
            "required": list(figures),
            "properties": figures,
            "description": "Billed: COMPLETED jobs (their whole audio) and CANCELLED ones that had begun (the audio "
            "transcribed). In flight: PENDING and PROCESSING, held against the quota. Not billed: "
            "FAILED, EXPIRED, cancelled before they ran. Deleted jobs still count.",
        },
        "Quota": {
            "type": "object",
            "required": [
                "tier",
                "audio_hours",
                "audio_seconds",
                "month",
                "used_audio_seconds",
                "in_flight_audio_seconds",
                "remaining_audio_seconds",
                "resets_at",
            ],
            "properties": {
                "tier": STRING,
                "audio_hours": {"type": "number"},
                "audio_seconds": seconds,
                "month": {"type": "string", "description": "YYYY-MM (UTC)."},
                "used_audio_seconds": seconds,
                "in_flight_audio_seconds": seconds,
                "remaining_audio_seconds": seconds,
                "requested_audio_seconds": nullable(seconds),
                "resets_at": {
                    "type": "string",
                    "format": "date-time",
                    "description": "The first of next month, 00:00 UTC.",
                },
            },
        },
        "Usage": {
            "type": "object",
            "required": ["from", "to", "keys"],
            "properties": {
                "from": {"type": "string", "format": "date"},
                "to": {"type": "string", "format": "date"},
                "keys": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["key_id", "name", "tier", "total", "days", "quota"],
                        "properties": {
                            "key_id": nullable({"type": "string", "description": "null: jobs without a key."}),
                            "name": STRING,
                            "tier": nullable(STRING),
                            "revoked": {"type": "boolean"},
                            "total": ref("UsageFigures"),
                            "days": {
                                "type": "array",
                                "description": "Days with jobs, oldest first.",
                                "items": {
                                    "allOf": [
                                        ref("UsageFigures"),
                                        {
                                            "type": "object",
                                            "required": ["date"],
                                            "properties": {"date": {"type": "string", "format": "date"}},
                                        },
                                    ]
                                },
                            },
                            "quota": {
                                "allOf": [ref("Quota")],
                                "nullable": True,
                                "description": "This month's, where the key's tier has a quota.",
                            },
                        },
                    },
                },
            },
        },
    }


def schemas(models: list[str]) -> dict:
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {
                        "code": {"type": "string", "description": "Stable, machine-readable, e.g. `invalid_request`."},
                        "message": {"type": "string", "description": "What is wrong and how to fix it."},
                        "quota": {
                            "allOf": [ref("Quota")],
                            "description": "With `quota_exceeded`: the quota, what is used, "
                            "what this submission needed, and when it resets.",
                        },
                        "allowed_s3_sources": {
                            "type": "array",
                            "items": STRING,
                            "description": "With `forbidden` for an s3:// audio_url: the `BUCKET/PREFIX` entries "
                            "this key (or a submission without a key) may name.",
                        },
                    },
                }
            },
        },
        **usage_schemas(),
        "OpenAIError": {
            "type": "object",
            "required": ["error"],
            "description": "OpenAI's error shape (`type`, `param`); errors met before the endpoint is reached "
            "(431, authentication) may come in whisperq's shape, which has `code` and `message` too.",
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["message"],
                    "properties": {
                        "message": STRING,
                        "type": STRING,
                        "param": nullable(STRING),
                        "code": nullable(STRING),
                    },
                }
            },
        },
        "Segment": {
            "type": "object",
            "required": ["start", "end", "text"],
            "properties": {
                "start": {"type": "number"},
                "end": {"type": "number"},
                "text": STRING,
                "avg_logprob": {"type": "number", "description": "Mean log-probability of its window's tokens."},
                "no_speech_prob": {"type": "number", "description": "Probability its window holds no speech."},
                "compression_ratio": {"type": "number", "description": "gzip ratio of its text (over 2.4: a loop)."},
                "speaker": {"type": "string", "description": "Who spoke it (`speakers=true`): A, B, ..."},
                "language": {
                    "type": "string",
                    "description": "The language heard in this part, where "
                    "a multilingual model found it window by window (no language asked for).",
                },
                "words": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "word": STRING,
                            "start": {"type": "number"},
                            "end": {"type": "number"},
                            "probability": {"type": "number"},
                        },
                    },
                },
            },
        },
        "Transcript": {
            "type": "object",
            "required": ["job_id", "text", "language", "duration", "segments"],
            "properties": {
                "job_id": STRING,
                "text": STRING,
                "language": nullable(STRING),
                "duration": nullable({"type": "number"}),
                "segments": {"type": "array", "items": ref("Segment")},
                "language_probability": {"type": "number", "description": "How sure the model was of the language."},
                "confidence": {"type": "number", "description": "Mean token probability, 0 to 1, by length."},
                "speakers": {"type": "array", "items": STRING, "description": "The speakers found (`speakers`)."},
                "turns": {
                    "type": "array",
                    "items": {"type": "object", "properties": {"speaker": STRING, "start": {"type": "number"}}},
                    "description": "Who spoke when (`speakers`).",
                },
                "redacted": {"type": "object", "description": "What `redact` replaced: its kinds and count."},
                "analyses": {
                    "type": "object",
                    "additionalProperties": {"type": "object", "properties": {"status": STRING, "version": STRING}},
                    "description": "Each analysis asked for: its status (DONE, FAILED), version and error.",
                },
                "partial": {"type": "boolean", "description": "Cancelled part-way: what was done."},
                "model": {
                    "type": "object",
                    "description": "What made the transcript.",
                    "properties": {
                        "name": STRING,
                        "version": {"type": "string", "description": "sha256 of the weights"},
                        "engine": STRING,
                        "device": nullable(STRING),
                        "compute_type": nullable(STRING),
                        "beam_size": {"type": "integer"},
                        "task": STRING,
                        "temperature": {"type": "number"},
                    },
                },
            },
        },
        "WebhookDelivery": {
            "type": "object",
            "properties": {
                "id": STRING,
                "event": STRING,
                "status": STRING,
                "next_attempt_at": TIME,
                "attempts": {"type": "array", "items": {}},
            },
        },
        "Job": {
            "type": "object",
            "required": [
                "job_id",
                "status",
                "priority",
                "created_at",
                "attempts",
                "progress",
                "status_url",
                "cancel_url",
                "transcript_urls",
            ],
            "properties": {
                "job_id": STRING,
                "status": {"type": "string", "enum": [s.value for s in JobStatus]},
                "task": {"type": "string", "enum": ["transcribe", "translate"]},
                "language": nullable(STRING),
                "priority": {"type": "string", "enum": list(PRIORITIES)},
                "model": nullable(
                    {"type": "string", "description": "The model the job runs on (null: made before models had names)."}
                ),
                "route": nullable({"type": "string", "description": "The alias the model was drawn from."}),
                "rerun_of": nullable({"type": "string", "description": "The job whose audio this one re-runs."}),
                "batch_id": nullable({"type": "string", "description": "The batch it was submitted in."}),
                "filename": nullable(STRING),
                "audio_duration": nullable({"type": "number"}),
                "created_at": {"type": "string", "format": "date-time"},
                "started_at": TIME,
                "finished_at": TIME,
                "attempts": {"type": "integer", "minimum": 0},
                "stage": nullable({"type": "string", "enum": [s.value for s in Stage]}),
                "progress": {"type": "number", "minimum": 0, "maximum": 1},
                "word_timestamps": {"type": "boolean"},
                "audio_url": nullable(STRING),
                "callback_url": nullable(STRING),
                "next_attempt_at": TIME,
                "error": nullable(STRING),
                "result": {"allOf": [ref("Transcript")], "nullable": True},
                "audio_purged_at": TIME,
                "result_purged_at": TIME,
                "notice": nullable({"type": "string", "description": "Why `result` is empty (retention)."}),
                "collect": {
                    "type": "boolean",
                    "description": "Training data: the job asked for it, or its key collects every job.",
                },
                "correction": {
                    "allOf": [ref("Correction")],
                    "nullable": True,
                    "description": "A client's correction (`PUT .../transcript`); `result` stays the model's own.",
                },
                "queue_position": nullable({"type": "integer", "minimum": 0}),
                "estimated_start_at": TIME,
                "estimated_finish_at": TIME,
                "status_url": STRING,
                "cancel_url": STRING,
                "transcript_url": {"type": "string", "description": "Only in the answer to a submission."},
                "transcript_urls": {"type": "object", "properties": {f: STRING for f in FORMATS}},
                "webhook_deliveries": {
                    "type": "array",
                    "items": ref("WebhookDelivery"),
                    "description": "Only on `GET /v1/jobs/{job_id}` of a job with a callback_url.",
                },
            },
        },
        "CorrectedSegment": {
            "type": "object",
            "required": ["start", "end", "text"],
            "additionalProperties": False,
            "properties": {
                "start": {"type": "number", "minimum": 0},
                "end": {"type": "number", "minimum": 0, "description": "At most start; seconds."},
                "text": {"type": "string", "maxLength": MAX_SEGMENT_TEXT},
            },
        },
        # The limits on the whole text and the number of segments are in the descriptions, not
        # maxLength/maxItems: a body past them may pass the 2 MiB a correction may have (413).
        "CorrectionRequest": {
            "type": "object",
            "required": ["text"],
            "additionalProperties": False,
            "properties": {
                "text": {
                    "type": "string",
                    "minLength": 1,
                    "description": f"The corrected transcript: not blank, at most {MAX_TEXT} characters.",
                },
                "segments": nullable(
                    {
                        "type": "array",
                        "items": ref("CorrectedSegment"),
                        "description": f"Optional: the corrected segments, in seconds; at most {MAX_SEGMENTS}.",
                    }
                ),
            },
        },
        "Correction": {
            "type": "object",
            "required": ["text", "segments", "corrected_at"],
            "properties": {
                "text": STRING,
                "segments": nullable({"type": "array", "items": ref("CorrectedSegment")}),
                "corrected_at": TIME,
            },
        },
        "JobList": {
            "type": "object",
            "required": ["jobs", "next_cursor", "next_url"],
            "properties": {
                "jobs": {"type": "array", "items": ref("Job")},
                "next_cursor": nullable(STRING),
                "next_url": nullable(STRING),
            },
        },
        "Upload": {
            "type": "object",
            "required": ["file"],
            "additionalProperties": False,
            "properties": {
                "file": {"type": "string", "format": "binary", "description": "The audio (or video)."},
                **options(json_body=False, models=models),
            },
        },
        "UrlSubmission": {
            "type": "object",
            "required": ["audio_url"],
            "additionalProperties": False,
            "properties": {
                "audio_url": {
                    "type": "string",
                    "format": "uri",
                    "description": "A public http(s) URL the preparation pool fetches, or s3://BUCKET/KEY "
                    "under one of the key's S3 sources, read with the deployment's credentials.",
                },
                **options(json_body=True, models=models),
            },
        },
        "Rerun": {
            "type": "object",
            "additionalProperties": False,
            "description": "Options over the original job's ("
            + ", ".join(RERUN_KEPT)
            + ", its model and its analyses are kept unless given).",
            "properties": options(json_body=True, models=models),
        },
        "DeadLetter": {
            "type": "object",
            "required": ["job_id", "error", "attempts", "failed_at"],
            "properties": {
                "job_id": STRING,
                "task": STRING,
                "error": STRING,
                "traceback": nullable(STRING),
                "attempts": {"type": "integer"},
                "worker": nullable(STRING),
                "submitted_at": TIME,
                "failed_at": {"type": "string", "format": "date-time"},
                "replays": {"type": "integer"},
            },
        },
        "TranscriptionRequest": {
            "type": "object",
            "required": ["file", "model"],
            "properties": {
                "file": {"type": "string", "format": "binary"},
                "model": {**choice(models, padded=True), "description": "One of `GET /v1/models`."},
                "language": STRING,
                "prompt": {"type": "string", "maxLength": 1000},
                "response_format": {
                    **choice(("json", "text", "srt", "vtt", "verbose_json"), blank=True, padded=True),
                    "description": "json (the default), text, srt, vtt or verbose_json.",
                },
                "temperature": {"type": "number", "minimum": 0, "maximum": 1},
                "timestamp_granularities[]": {
                    "type": "array",
                    "items": {"type": "string", "enum": ["segment", "word"]},
                    "description": "Needs response_format `verbose_json`.",
                },
                # whisperq's own options this endpoint takes too (models.pipeline.request)
                **{
                    name: schema
                    for name, schema in options(json_body=False).items()
                    if name in names_for("openai") and name not in ("language", "prompt", "temperature")
                },
            },
        },
        "Transcription": {
            "type": "object",
            "required": ["text"],
            "description": "`json`: the text; `verbose_json` adds language, duration, segments (and words).",
            "properties": {
                "text": STRING,
                "task": STRING,
                "language": nullable(STRING),
                "duration": nullable({"type": "number"}),
                "segments": {"type": "array", "items": {}},
                "words": {"type": "array", "items": {}},
            },
        },
        "Readiness": {
            "type": "object",
            "required": ["status", "checks"],
            "properties": {
                "status": {"type": "string", "enum": ["ready", "not_ready"]},
                "checks": {"type": "object", "additionalProperties": STRING},
                "models": {
                    "type": "object",
                    "additionalProperties": {"type": "integer"},
                    "description": "Live inference workers serving each model.",
                },
            },
        },
        "WebhookSecret": {
            "type": "object",
            "required": ["key_id", "webhook_secret"],
            "properties": {
                "key_id": STRING,
                "webhook_secret": {
                    "type": "string",
                    "description": "`whsec_` + base64: verify this key's "
                    "webhooks with it (Standard Webhooks). Shown this once.",
                },
                "previous_secret_signs_until": nullable({"type": "string", "format": "date-time"}),
            },
        },
        "TranscriptionJob": {
            "type": "object",
            "required": ["id", "object", "status", "status_url"],
            "properties": {
                "id": STRING,
                "object": {"type": "string", "enum": ["transcription.job"]},
                "status": STRING,
                "status_url": STRING,
                "message": STRING,
            },
        },
    }
