"""Logs: JSON lines naming the job, and no transcript in Celery's success line. A real
job's logs (web and workers under `whisperq run`) are checked in test_run.py."""
import json
import logging
import sys
import uuid

import pytest
from celery import Celery

from config.logs import OMITTED, JsonFormatter, job_context, omit_task_results, wants_json


def record(msg, *args, name="models.jobs.operations", level=logging.INFO, exc_info=None):
    return logging.LogRecord(name, level, __file__, 1, msg, args, exc_info)


def test_a_line_is_one_json_object():
    try:
        raise ValueError("boom")
    except ValueError:
        rec = record("job %s prepared: %.1f s of audio", "j-1", 4.5, level=logging.WARNING, exc_info=sys.exc_info())
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    out = json.loads(line)
    assert out["message"] == "job j-1 prepared: 4.5 s of audio"
    assert (out["level"], out["logger"], out["job_id"]) == ("WARNING", "models.jobs.operations", "j-1")
    assert out["ts"].endswith("Z") and "ValueError: boom" in out["exc"]


def test_format_setting(monkeypatch):
    assert wants_json("json") and not wants_json("text")
    monkeypatch.setenv("WHISPERQ_LOG_FORMAT", "text")
    assert not wants_json()


def test_task_lines_carry_the_task_and_the_job():
    app = Celery("logs-test", set_as_current=False)
    seen = {}

    @app.task(name="whisperq.infer", bind=True, shared=False)
    def infer(self):
        self.request.delivery_info = {"routing_key": "inference"}
        self.request.whisperq_attempt = 2
        seen.update(json.loads(JsonFormatter().format(record("batch done", name="models.pipeline.inference"))))
        return {"text": "secret words"}

    task_id = str(uuid.uuid4())
    infer.apply(task_id=task_id)
    assert seen["job_id"] == seen["task_id"] == task_id
    assert (seen["task"], seen["queue"], seen["attempt"]) == ("whisperq.infer", "whisperq.inference", 2)
    assert job_context() == {}  # outside the task: nothing


def test_request_lines_carry_the_job(app):
    job_id = str(uuid.uuid4())
    with app.test_request_context(f"/v1/jobs/{job_id}"):
        assert job_context()["job_id"] == job_id


def test_celery_success_line_omits_the_result(caplog):
    omit_task_results()
    app = Celery("logs-test", set_as_current=False)

    @app.task(name="whisperq.infer", shared=False)
    def infer():
        return {"text": "the quarterly finance numbers"}

    with caplog.at_level(logging.INFO, logger="celery.app.trace"):
        result = infer.apply()
    assert result.get()["text"] == "the quarterly finance numbers"  # the caller still gets it
    lines = [r for r in caplog.records if r.name == "celery.app.trace"]
    assert lines and "succeeded in" in lines[-1].getMessage()
    assert OMITTED in lines[-1].getMessage() and "quarterly" not in lines[-1].getMessage()
    assert "quarterly" not in JsonFormatter().format(lines[-1])


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_web_logging_set_up_like_basic_config(fmt, monkeypatch):
    from config.logs import configure_web

    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers = []
    try:
        configure_web(fmt)
        configure_web(fmt)  # once only
        assert len(root.handlers) == 1
        assert isinstance(root.handlers[0].formatter, JsonFormatter) is (fmt == "json")
    finally:
        root.handlers, root.level = saved, level
