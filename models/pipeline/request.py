"""A job's request, declared once: every option a client may send with its audio, its type,
its bounds, what it means, and which ways in take it.

Everything that lists the options is made from or checked against `OPTIONS`:

- the names a way in accepts (`FIELDS`, `names_for(door)`): the form and JSON bodies of
  `POST /v1/jobs`, a batch's items, a re-run, the OpenAI endpoint's own extras, MQTT requests,
  the gRPC `SubmitRequest` (tests/test_grpc.py checks the .proto against this), the keyword
  arguments of `transcribe.delay()`, and a raw producer's message;
- the OpenAPI document's components (web/openapi_schemas.py) and the raw message's JSON
  Schema (docs/messages/transcribe.v1.schema.json, written by `python -m
  models.pipeline.request`, checked by tests/test_producers.py);
- the upload page's controls (web/templates/index.html renders `Option.control`);
- what a re-run keeps of its original (`RERUN_KEPT`).

How each value is read and checked (lenient strings from a form, JSON values from a body) is
models.pipeline.options' `parse_options`, the one implementation; the bounds it enforces are
read from here. Adding an option is one entry here and its meaning in `parse_options`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from config import PRIORITIES
from models.jobs.operations import TASKS

# Where a job can come in (models.pipeline.door.DOORS).
DOORS = ("form", "api", "openai", "batch", "rerun", "mqtt", "grpc", "delay", "raw")

# The OpenAI endpoint reads its own fields for these (`model`, `timestamp_granularities`) and
# sets the priority itself.
NOT_OPENAI = tuple(d for d in DOORS if d != "openai")

Kind = Literal["text", "choice", "flag", "number", "speakers", "kinds", "words"]
# How the page shows an option: one of these, or None (not on the page: the API's alone).
Control = Literal["language", "model", "priority", "task", "checkbox", "text", "textarea"] | None


@dataclass(frozen=True)
class Option:
    """One option of a job's request."""

    name: str
    kind: Kind
    help: str  # what it does, for people: the docs, the page's hint, OpenAPI's description
    label: str  # the page's label
    choices: tuple[str, ...] = ()
    max_length: int | None = None
    low: float | None = None
    high: float | None = None
    doors: tuple[str, ...] = DOORS
    control: Control = None
    check: str | None = None  # a checkbox's value when ticked
    hint: str = ""  # the page's line under the control
    rerun_kept: bool = True  # a re-run keeps the original's value (others are carried another way)

    def taken_by(self, door: str) -> bool:
        return door in self.doors


OPTIONS: tuple[Option, ...] = (
    Option(
        "language",
        "text",
        "The language spoken, as a Whisper code such as `en` or `de`; empty or `auto` detects it.",
        "Language",
        max_length=16,
        control="language",
    ),
    Option(
        "priority",
        "choice",
        "`high`, `normal` or `low`: the job's place in the queue (default `normal`, or the API key's tier "
        "default); a key's tier, or anonymous use, may not allow `high`.",
        "Priority",
        choices=PRIORITIES,
        control="priority",
        doors=NOT_OPENAI,
    ),
    Option(
        "task",
        "choice",
        "`transcribe` (the default) or `translate` (into English; needs a multilingual model).",
        "Translate into English",
        choices=TASKS,
        control="task",
        check="translate",
        hint="Write the transcript in English, whatever was spoken.",
        doors=NOT_OPENAI,
    ),
    Option(
        "model",
        "text",
        "A model or alias of `GET /v1/models`; empty or absent: the default model.",
        "Model",
        max_length=48,
        control="model",
        doors=NOT_OPENAI,
        rerun_kept=False,  # a re-run keeps the alias its original drew from, else its model
    ),
    Option(
        "word_timestamps",
        "flag",
        "Give each word its start, end and probability.",
        "Word timestamps",
        control="checkbox",
        check="true",
        hint="When each word was said, and how sure the model was of it.",
        doors=NOT_OPENAI,
    ),
    Option(
        "speakers",
        "speakers",
        "Who spoke when: `true` (the count found), a count such as `3`, or a range such as `2-4`; "
        "segments and words get a speaker.",
        "Who spoke when",
        control="checkbox",
        check="true",
        hint="Label each part of the transcript with its speaker: A, B, …",
        rerun_kept=False,  # kept as the original's analyses
    ),
    Option(
        "redact",
        "kinds",
        "Hide personal data in the transcript: `pii` (all of it), or kinds by commas (`email,phone,card,digits`).",
        "Hide personal data",
        control="checkbox",
        check="pii",
        hint="E-mail addresses, phone and card numbers and spoken digits become [EMAIL_ADDRESS] and the like.",
        rerun_kept=False,  # kept as the original's analyses
    ),
    Option(
        "hotwords",
        "words",
        "Words to listen for (names, jargon), separated by commas (a JSON list of strings in a JSON body).",
        "Words to listen for",
        max_length=500,
        control="text",
        hint="Names and jargon the recording uses, separated by commas.",
    ),
    Option(
        "prompt",
        "text",
        "Whisper's initial prompt: text in the style and vocabulary of the recording.",
        "Prompt",
        max_length=1000,
        control="textarea",
        hint="Text in the style and vocabulary of the recording (spelling, punctuation).",
    ),
    Option(
        "temperature",
        "number",
        "Sampling temperature from 0 to 1; 0 (the default) decodes greedily with beam search.",
        "Temperature",
        low=0.0,
        high=1.0,
    ),
    Option(
        "callback_url",
        "text",
        "A public http(s) URL that is POSTed the job when it ends (a batch's own is POSTed the batch).",
        "Webhook",
        max_length=2048,
        doors=NOT_OPENAI,
        rerun_kept=False,
    ),
    Option(
        "collect",
        "flag",
        "Keep this job's audio and transcript as training data (`whisperq dataset export`); a key may "
        "collect every job.",
        "Keep as training data",
        doors=NOT_OPENAI,
    ),
)

BY_NAME = {o.name: o for o in OPTIONS}
FIELDS = tuple(o.name for o in OPTIONS)
# transcribe.delay(path, language, priority, task, model): the options it also takes by position.
POSITIONAL = ("language", "priority", "task", "model")
# What a raw message may carry beside the options: who owns the job (docs/producers.md).
OWNERSHIP = ("api_key", "owner", "owner_token")
RERUN_KEPT = tuple(o.name for o in OPTIONS if o.rerun_kept)


def option(name: str) -> Option:
    return BY_NAME[name]


def names_for(door: str) -> tuple[str, ...]:
    """The options a way in takes, in declaration order."""
    return tuple(o.name for o in OPTIONS if o.taken_by(door))


def page_options() -> tuple[Option, ...]:
    """The options the upload page shows, in order."""
    return tuple(o for o in OPTIONS if o.control is not None and o.taken_by("form"))


# -- schemas ---------------------------------------------------------------------------------------


def json_schema(o: Option, *, as_form: bool = False) -> dict[str, Any]:
    """The option's JSON Schema: as a JSON body or a raw message carries it (null for unset),
    or, `as_form`, as a form field's string."""
    out: dict[str, Any]
    if o.kind == "choice":
        out = {"enum": list(o.choices)}
    elif o.kind == "flag":
        out = {"type": "boolean"}
    elif o.kind == "number":
        out = {"type": "number", "minimum": o.low, "maximum": o.high}
    elif o.kind == "speakers":  # models.analysis.speakers.parse
        count = {"type": "integer", "minimum": 1}
        out = {
            "type": ["boolean", "integer", "string", "object"],
            "minimum": 1,
            "properties": {"min": count, "max": count},
            "additionalProperties": False,
        }
    elif o.kind == "kinds":  # models.analysis.redaction.parse
        out = {
            "type": ["boolean", "string", "array", "object"],
            "items": {"type": "string"},
            "properties": {"kinds": {"type": "array", "items": {"type": "string"}}},
            "additionalProperties": False,
        }
    elif o.kind == "words":
        out = {"type": ["string", "array"], "items": {"type": "string"}, "maxLength": o.max_length}
    else:
        out = {"type": "string", "maxLength": o.max_length}
    out = {k: v for k, v in out.items() if v is not None}
    if as_form:
        return {"type": "string", "description": o.help}
    if "type" in out:
        types = out["type"] if isinstance(out["type"], list) else [out["type"]]
        out["type"] = [*types, "null"]
    else:
        out = {"anyOf": [out, {"type": "null"}]}
    return {**out, "description": o.help}


def message_options_schema() -> dict[str, Any]:
    """The kwargs of a raw `whisperq.transcribe` message: the options and who owns the job."""
    properties = {o.name: json_schema(o) for o in OPTIONS if o.taken_by("raw")}
    properties.update(
        api_key={
            "type": ["string", "null"],
            "maxLength": 200,
            "description": "the API key that owns the job, the key itself (wq_...): the job is held to its tier, "
            "quota and input directories; a revoked key fails the job. null: anonymous, where the "
            "deployment allows anonymous use",
        },
        owner={
            "type": ["string", "null"],
            "maxLength": 36,
            "description": "set by transcribe.delay(api_key=...) with owner_token: a key id alone names no owner "
            "(the job fails saying so)",
        },
        owner_token={
            "type": ["string", "null"],
            "maxLength": 400,
            "description": "set by transcribe.delay(api_key=...): the owner sealed by this deployment for this job id",
        },
    )
    return {
        "type": "object",
        "description": "kwargs: the job's options, as POST /v1/jobs takes them (models/pipeline/request.py "
        "declares them). Each is checked again by the worker: a bad one fails the job with a reason "
        "(GET /v1/jobs/<id> shows it) and is never retried; an unknown one likewise.",
        "additionalProperties": False,
        "properties": properties,
    }


def message_schema() -> dict[str, Any]:
    """The JSON Schema of a raw `whisperq.transcribe` message (docs/producers.md)."""
    uuid = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://whisperq.invalid/messages/transcribe.v1.schema.json",
        "title": "whisperq.transcribe, version 1",
        "description": "The message that submits a job: a Celery protocol 2 task message whose body is [args, "
        "kwargs, embed], sent as JSON (never pickle) to the queue whisperq.prepare. Version 1 only grows: new "
        "optional kwargs may be added; a change that breaks a producer gets a new task name and schema. See "
        "docs/producers.md for the headers and how each broker carries it. Written by `python -m "
        "models.pipeline.request` from the options' declaration: do not edit.",
        "type": "object",
        "required": ["headers", "body"],
        "properties": {
            "headers": {
                "type": "object",
                "required": ["lang", "task", "id", "root_id"],
                "properties": {
                    "lang": {"const": "py", "description": "Celery's protocol 2 marker; any producer sends py."},
                    "task": {"const": "whisperq.transcribe"},
                    "id": {
                        "$ref": "#/$defs/uuid",
                        "description": "The task id, which is the job id: GET /v1/jobs/<id> shows the job.",
                    },
                    "root_id": {"$ref": "#/$defs/uuid", "description": "The same as id."},
                    "parent_id": {"type": "null"},
                    "group": {"type": "null"},
                    "retries": {"type": "integer", "minimum": 0},
                    "eta": {"type": "null"},
                    "expires": {"type": "null"},
                    "argsrepr": {"type": "string"},
                    "kwargsrepr": {"type": "string"},
                    "origin": {"type": "string"},
                },
            },
            "body": {
                "type": "array",
                "description": "[args, kwargs, embed]",
                "prefixItems": [
                    {
                        "type": "array",
                        "description": "args: the audio file's absolute path, readable by the prepare workers "
                        "under WHISPERQ_INPUT_DIRS",
                        "prefixItems": [{"type": "string", "pattern": "^/", "maxLength": 4096}],
                        "minItems": 1,
                        "maxItems": 1,
                    },
                    {"$ref": "#/$defs/options"},
                    {
                        "type": "object",
                        "description": "embed: Celery's callbacks and chain; a producer sends them empty",
                        "properties": {
                            "callbacks": {"type": "null"},
                            "errbacks": {"type": "null"},
                            "chain": {"type": "null"},
                            "chord": {"type": "null"},
                        },
                    },
                ],
                "minItems": 3,
                "maxItems": 3,
            },
        },
        "$defs": {"uuid": {"type": "string", "pattern": uuid}, "options": message_options_schema()},
    }


SCHEMA_PATH = Path("docs/messages/transcribe.v1.schema.json")
PAGE_PATH = Path("docs/options.md")
DOOR_NAMES = {
    "form": "the page",
    "api": "`POST /v1/jobs`",
    "openai": "OpenAI's endpoint",
    "batch": "a batch's items",
    "rerun": "a re-run",
    "mqtt": "MQTT",
    "grpc": "gRPC",
    "delay": "`transcribe.delay()`",
    "raw": "a raw message",
}
_TYPES = {
    "text": "string",
    "choice": "one of {choices}",
    "flag": "boolean",
    "number": "number, {low:g} to {high:g}",
    "speakers": "`true`, a count or a range",
    "kinds": "`pii` or kinds",
    "words": "string, or a JSON list",
}


def schema_text() -> str:
    return json.dumps(message_schema(), indent=2, ensure_ascii=False) + "\n"


def page_text() -> str:
    """docs/options.md: every option, its type, the ways in that take it, what it does."""
    lines = [
        "# Every job option",
        "",
        "<!-- Written by `python -m models.pipeline.request` from models/pipeline/request.py: do not edit. -->",
        "",
        "Every way in takes a job's options under the same names, checked by the same code: a form",
        "field, a member of a JSON body, a keyword of `transcribe.delay()`, a field of gRPC's",
        "`SubmitRequest`, a member of an MQTT request or of a raw message's kwargs. A bad value is refused",
        "with a message that says what to send, before anything is stored or queued.",
        "",
        "| option | type | taken by | what it does |",
        "|---|---|---|---|",
    ]
    for o in OPTIONS:
        kind = _TYPES[o.kind].format(choices=", ".join(f"`{c}`" for c in o.choices), low=o.low or 0, high=o.high or 0)
        if o.max_length and o.kind in ("text", "words"):
            kind += f", at most {o.max_length} characters"
        if o.doors == DOORS:
            doors = "every way in"
        elif o.doors == NOT_OPENAI:
            doors = "every way in but OpenAI's endpoint"
        else:
            doors = ", ".join(DOOR_NAMES[d] for d in o.doors)
        lines.append(f"| `{o.name}` | {kind} | {doors} | {o.help} |")
    lines += [
        "",
        "A raw message may also carry who owns the job: "
        + ", ".join(f"`{name}`" for name in OWNERSHIP)
        + " ([From any language](producers.md)).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`python -m models.pipeline.request [--check]`: write the raw message's JSON Schema
    (docs/messages/transcribe.v1.schema.json) and docs/options.md, or check that they are what
    the declaration gives (from the repository's root)."""
    check = "--check" in argv
    root = Path(next((a for a in argv if a != "--check"), "."))
    stale = []
    for path, text in ((root / SCHEMA_PATH, schema_text()), (root / PAGE_PATH, page_text())):
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        path.write_text(text)
        print(path)
    if stale:
        print(f"{', '.join(stale)} not what the options' declaration gives: run `python -m models.pipeline.request`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = [
    "DOORS",
    "FIELDS",
    "OPTIONS",
    "OWNERSHIP",
    "POSITIONAL",
    "RERUN_KEPT",
    "Option",
    "message_schema",
    "names_for",
    "option",
    "page_options",
]
