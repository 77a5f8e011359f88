"""OpenTelemetry: off unless OTEL_EXPORTER_OTLP_ENDPOINT is set; when on, a request's
trace goes into the task messages it sends, and a task run continues the trace it was
sent from (an in-memory exporter instead of OTLP)."""

import pytest

from config import tracing


def test_off_without_an_endpoint(app, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert not tracing.enabled()
    assert tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not tracing.enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"})
    assert tracing.setup_tracing("web") is None and not tracing.init_worker()
    assert not getattr(app, "_is_instrumented_by_opentelemetry", False)  # create_app added nothing


def test_a_request_and_its_tasks_share_a_trace(app):
    pytest.importorskip("opentelemetry.sdk")
    pytest.importorskip("opentelemetry.instrumentation.flask")
    pytest.importorskip("opentelemetry.instrumentation.celery")
    from celery import Celery
    from celery.signals import before_task_publish
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    exporter = InMemorySpanExporter()
    provider = tracing.new_provider("test", exporter=exporter)
    celery = Celery("tracing-test", set_as_current=False)

    @celery.task(name="whisperq.infer", shared=False)
    def infer():
        return 1

    headers: dict = {}

    @app.post("/_publish")
    def publish():  # what web.uploads does, without a broker: the publish signal
        before_task_publish.send(
            sender="whisperq.transcribe",
            body=((), {}, {}),
            exchange="",
            routing_key="prepare",
            headers=headers,
            properties={},
            declare=[],
            retry_policy=None,
        )
        return "sent"

    @app.post("/_eager")
    def eager():
        infer.apply()
        return "ran"

    tracing.instrument_flask(app, provider)
    client = app.test_client()
    try:
        assert client.post("/_publish").status_code == 200
        tracing.instrument_celery(provider)
        assert client.post("/_eager").status_code == 200
    finally:
        tracing.uninstrument()

    servers = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER]
    assert len(servers) == 2
    sent = servers[0].context
    assert headers["traceparent"].startswith(f"00-{sent.trace_id:032x}-{sent.span_id:016x}-")
    run = [s for s in exporter.get_finished_spans() if s.name == "run/whisperq.infer"]
    assert run and run[0].context.trace_id == servers[1].context.trace_id
    assert run[0].parent.span_id == servers[1].context.span_id
    assert run[0].resource.attributes["service.name"] == "whisperq-test"
