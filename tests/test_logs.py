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


# --- no secrets from URLs or SQL parameters ------------------------------------------

PRESIGNED = "https://bucket.s3.amazonaws.com/a/b.wav?X-Amz-Signature=deadbeefsig&X-Amz-Credential=AKIAX"


def test_redact_url_keeps_scheme_host_and_path():
    from config.logs import redact_url

    assert redact_url(PRESIGNED) == "https://bucket.s3.amazonaws.com/a/b.wav?\u2026"
    assert redact_url("https://hooks.example.com/h?token=s3cret#frag") == "https://hooks.example.com/h?\u2026"
    assert redact_url("https://alice:pw@example.com:8443/x") == "https://***@example.com:8443/x"
    assert redact_url("https://example.com/plain") == "https://example.com/plain"
    assert redact_url("/v1/jobs?token=abc") == "/v1/jobs?\u2026"
    assert redact_url(None) == ""


def test_log_lines_lose_url_queries_and_credentials():
    from config.logs import RedactUrls

    def formatted(rec, formatter):
        RedactUrls().filter(rec)
        return formatter.format(rec)

    for formatter in (JsonFormatter(), logging.Formatter("%(message)s")):
        line = formatted(record("job %s: fetching %s (%d tries)", "j-1", PRESIGNED, 2), formatter)
        assert "deadbeefsig" not in line and "AKIAX" not in line
        assert "https://bucket.s3.amazonaws.com/a/b.wav?\u2026" in line and "2 tries" in line
        line = formatted(record("webhook to https://u:hunter2@h.example/cb?token=t0k3n failed"), formatter)
        assert "hunter2" not in line and "t0k3n" not in line and "h.example/cb" in line
        try:
            raise ConnectionError(f"cannot reach {PRESIGNED}")
        except ConnectionError:
            rec = record("fetch failed", exc_info=sys.exc_info())
        line = formatted(rec, formatter)
        assert "deadbeefsig" not in line and "ConnectionError" in line


def test_access_log_atoms_stay_a_mapping_without_the_referrer_query():
    from config.logs import RedactUrls

    class Atoms(dict):  # gunicorn's SafeAtoms: a dict subclass the access format reads from
        pass

    atoms = Atoms(
        h="127.0.0.1", r="GET /v1/jobs HTTP/1.1", s=200, f="https://app.example/?session=abc", D=1500, U="/v1/jobs"
    )
    rec = logging.LogRecord("gunicorn.access", logging.INFO, __file__, 1, '%(h)s "%(r)s" %(s)s "%(f)s"', (), None)
    rec.args = atoms
    RedactUrls().filter(rec)
    assert rec.args is atoms
    assert rec.getMessage() == '127.0.0.1 "GET /v1/jobs HTTP/1.1" 200 "https://app.example/?\u2026"'


def test_web_logging_installs_the_redaction(monkeypatch):
    from config.logs import RedactUrls, configure_web

    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers = []
    try:
        configure_web("json")
        assert any(isinstance(f, RedactUrls) for f in root.handlers[0].filters)
    finally:
        root.handlers, root.level = saved, level


def test_sql_parameters_stay_out_of_errors_and_echo(tmp_path, caplog):
    from sqlalchemy import Column, Integer, MetaData, String, Table, insert
    from sqlalchemy.exc import IntegrityError

    from models.db import Database

    db = Database(f"sqlite:///{tmp_path}/params.db")
    things = Table("things", MetaData(), Column("id", Integer, primary_key=True), Column("secret", String, unique=True))
    things.create(db.engine)
    db.engine.echo = True
    with (
        caplog.at_level(logging.INFO, logger="sqlalchemy.engine"),
        pytest.raises(IntegrityError) as raised,
        db.session() as session,
    ):
        session.execute(insert(things).values(secret="sk-bound-value-1"))
        session.execute(insert(things).values(secret="sk-bound-value-1"))
    assert "UNIQUE constraint failed" in str(raised.value)
    assert "sk-bound-value-1" not in str(raised.value)
    assert caplog.records and "sk-bound-value-1" not in caplog.text
    db.dispose()
