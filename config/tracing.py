"""OpenTelemetry traces, on only when OTEL_EXPORTER_OTLP_ENDPOINT is set.

One trace follows a job: the web request, whisperq.transcribe in the prepare pool,
whisperq.infer in the inference pool and whisperq.notify, because each task message
carries the W3C `traceparent` header of the span that sent it. Spans go out over
OTLP/HTTP; the SDK reads the standard OTEL_* variables (OTEL_SERVICE_NAME,
OTEL_EXPORTER_OTLP_HEADERS, OTEL_TRACES_SAMPLER, ...). Needs the `[otel]` extra; without
it a set endpoint logs one warning and tracing stays off. Spans carry no audio, file
names or transcripts: task ids, task names, queues and HTTP routes only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger(__name__)

_provider: Any = None


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if (env.get("OTEL_SDK_DISABLED") or "").strip().lower() == "true":
        return False
    return bool((env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or "").strip())


def new_provider(service: str, exporter: Any = None, environ: Mapping[str, str] | None = None) -> Any:
    """A tracer provider for this process: OTLP/HTTP in batches, or `exporter` span by
    span (tests). None when OpenTelemetry is not installed."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        log.warning(
            "OTEL_EXPORTER_OTLP_ENDPOINT is set but OpenTelemetry is not installed "
            "(pip install 'whisperq[otel]'); tracing stays off"
        )
        return None
    env = os.environ if environ is None else environ
    provider = TracerProvider(
        resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or f"whisperq-{service}"})
    )
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def setup_tracing(service: str) -> Any:
    """This process's provider (made once and made global), or None when tracing is off."""
    global _provider
    if _provider is None and enabled():
        _provider = new_provider(service)
        if _provider is not None:
            from opentelemetry import trace

            trace.set_tracer_provider(_provider)
    return _provider


def _inject_trace_context(headers: dict[str, Any] | None = None, **_kwargs: object) -> None:
    # The web process does not register the tasks it sends by name, so the Celery
    # instrumentation cannot trace its publishes: the current span (the request's) goes
    # into the message headers here instead.
    if headers is not None:
        from opentelemetry.propagate import inject

        inject(headers)


def instrument_flask(app: Flask, provider: Any) -> None:
    """Server spans for each request; task messages sent meanwhile continue its trace."""
    from celery.signals import before_task_publish
    from opentelemetry.instrumentation.flask import FlaskInstrumentor

    # opentelemetry-instrumentation-flask ships py.typed but leaves instrument_app unannotated.
    FlaskInstrumentor().instrument_app(app, tracer_provider=provider)  # type: ignore[no-untyped-call]
    before_task_publish.connect(_inject_trace_context, weak=False, dispatch_uid="whisperq.tracing.inject")


def instrument_celery(provider: Any) -> None:
    """Spans for each task run and each publish from a task, parented across messages."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor

    # opentelemetry-instrumentation-celery ships py.typed but leaves __init__ unannotated.
    instrumentor = CeleryInstrumentor()  # type: ignore[no-untyped-call]
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(tracer_provider=provider)


def uninstrument() -> None:
    """Undo the process-wide hooks (tests)."""
    from celery.signals import before_task_publish

    before_task_publish.disconnect(dispatch_uid="whisperq.tracing.inject")
    try:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
    except ImportError:
        return
    # Unannotated __init__, as in instrument_celery.
    if CeleryInstrumentor().is_instrumented_by_opentelemetry:  # type: ignore[no-untyped-call]
        CeleryInstrumentor().uninstrument()  # type: ignore[no-untyped-call]


def init_web(app: Flask) -> bool:
    """Called by create_app; a no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set."""
    provider = setup_tracing("web")
    if provider is not None:
        instrument_flask(app, provider)
    return provider is not None


def init_worker(pool: str = "worker") -> bool:
    """Called in each process that runs tasks (for prefork: in each child, after the
    fork, so that no exporter thread or connection is shared across the fork)."""
    provider = setup_tracing(pool)
    if provider is not None:
        instrument_celery(provider)
    return provider is not None
