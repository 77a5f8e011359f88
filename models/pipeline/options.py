"""A job's options, checked the same at every door: the API's form and JSON, the OpenAI
endpoint, re-runs and `transcribe.delay()`. A bad option raises InvalidRequest (a ValueError)
whose message says what to send, before anything is stored or queued. Which options there
are, and their bounds, is models.pipeline.request's declaration (`FIELDS` is its names)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from config.celeryconfig import inference_queue
from models.analysis import requested
from models.delivery.outbound import check_url
from models.errors import InvalidRequest, ModelNotServed
from models.jobs.operations import check_options
from models.jobs.record import JobOptions
from models.jobs.workers import served_models
from models.pipeline.request import option
from models.registry.catalog import check_language, multilingual, route_models

if TYPE_CHECKING:
    from config import Settings
    from models.runtime import Runtime

MAX_PROMPT = option("prompt").max_length or 0
MAX_HOTWORDS = option("hotwords").max_length or 0
TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off", "")


def _text(form: Mapping[str, Any], name: str) -> str | None:
    value = form.get(name)
    if value is None or isinstance(value, bool):
        return value if value is None else str(value).lower()
    if not isinstance(value, str):
        raise InvalidRequest(f"field {name!r} must be a string")
    return value


def parse_options(form: Mapping[str, Any], settings: Settings, default_priority: str = "normal") -> JobOptions:
    language = (_text(form, "language") or "").strip().lower() or None
    if language == "auto":
        language = None
    priority = (_text(form, "priority") or default_priority).strip().lower()
    task = (_text(form, "task") or "transcribe").strip().lower()
    check_options(language, priority, task)
    model = (_text(form, "model") or "").strip() or None  # a model or an alias: chosen when the job is made
    language = language or settings.default_language
    for spec in route_models(settings, model):
        check_language(settings, language, spec.name)
        if task == "translate" and not multilingual(settings, spec.name):
            variant = f" (a variant of {model!r})" if model and model != spec.name else ""
            raise InvalidRequest(
                f"task 'translate' needs a multilingual model; {spec.name!r}{variant} is "
                "English-only (GET /v1/models lists the models)"
            )
    words = (_text(form, "word_timestamps") or "").strip().lower()
    if words not in TRUE + FALSE:
        raise InvalidRequest(f"word_timestamps must be true or false, not {words!r}")
    collect = (_text(form, "collect") or "").strip().lower()
    if collect not in TRUE + FALSE:
        raise InvalidRequest(
            f"collect must be true (keep this job's audio and transcript as training data) or false, not {collect!r}"
        )
    callback_url = (_text(form, "callback_url") or "").strip() or None
    if callback_url is not None:
        callback_url = check_url(callback_url, settings, "callback_url")  # public addresses only
    prompt = (_text(form, "prompt") or "").strip() or None
    if prompt is not None and len(prompt) > MAX_PROMPT:
        raise InvalidRequest(
            f"prompt is {len(prompt)} characters; keep it to {MAX_PROMPT} (Whisper reads its last 224 tokens)"
        )
    hotwords = parse_hotwords(form.get("hotwords"))
    analyses = requested(form)
    raw_temperature = form.get("temperature")
    temperature = None
    if raw_temperature not in (None, ""):
        try:
            temperature = float(raw_temperature)
        except (TypeError, ValueError):
            temperature = -1.0
        if not 0.0 <= temperature <= 1.0:
            raise InvalidRequest(f"temperature must be a number from 0 to 1, not {raw_temperature!r}")
    return JobOptions(
        language=language,
        priority=priority,
        task=task,
        callback_url=callback_url,
        # speakers are told word by word: a job that asks for them gets its words' times
        word_timestamps=words in TRUE or "speakers" in analyses,
        prompt=prompt,
        hotwords=hotwords,
        analyses=analyses or None,
        temperature=temperature or None,
        model=model,
        collect=collect in TRUE,
    )


def parse_hotwords(value: Any) -> str | None:
    """Words to listen for (names, jargon), as faster-whisper's `hotwords` takes them: one
    string. Given as a comma-separated string or a JSON list of strings."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, (list, tuple)):
        if not all(isinstance(v, str) for v in value):
            raise InvalidRequest("hotwords must be a list of strings, or one string of words separated by commas")
        words = [v.strip() for v in value]
    elif isinstance(value, str):
        words = [v.strip() for v in value.split(",")]
    else:
        raise InvalidRequest("hotwords must be a list of strings, or one string of words separated by commas")
    joined = ", ".join(w for w in words if w)
    if len(joined) > MAX_HOTWORDS:
        raise InvalidRequest(
            f"hotwords are {len(joined)} characters; keep them to {MAX_HOTWORDS} (Whisper reads at most 223 tokens)"
        )
    if any(not w.isprintable() for w in words):
        raise InvalidRequest("hotwords must be printable text")
    return joined or None


def check_served(rt: Runtime, model: str | None) -> None:
    """A model other than the default needs a live inference worker to take its jobs (each of
    an alias's variants: any of them may be drawn)."""
    unserved = [spec.name for spec in route_models(rt.settings, model) if spec.name != rt.settings.default_model]
    unserved = [name for name in unserved if name not in served_models(rt)] if unserved else []
    if unserved:
        name = unserved[0]
        raise ModelNotServed(
            f"no inference worker serves the model {name!r}"
            f"{f' (a variant of {model!r})' if model and model != name else ''} now; an operator "
            f"starts one with `celery -A tasks.worker worker -Q {inference_queue(rt.settings, name)}` "
            "(/readyz lists the models served)"
        )
