"""The conformance matrix: every way in × the job's options × every way out, against the
processes `whisperq run` starts (supervisord, gunicorn's gevent web worker, the pools, the gRPC
door, the MQTT bridge, beat), once on each store and each broker:

| setup | broker | database | audio store | CI step |
|---|---|---|---|---|
| embedded | the embedded Redis | SQLite | the data dir | the default |
| rabbitmq | RabbitMQ (a vhost of its own) | PostgreSQL (a database of its own) | PostgreSQL | RabbitMQ + PostgreSQL |
| sqs | SQS (moto on loopback) | SQLite | S3 (moto) | SQS |

In each, one recording of two voices (a name to listen for, a phone number to hide) goes in
through every way in: the page (Chromium, signed in, its More options), a multipart upload, a
URL, a batch item, a re-run, OpenAI's endpoint (the `openai` package), `transcribe.delay()`
(another process, finding the stack by its data dir), MQTT (Mosquitto), gRPC (stubs generated
from the .proto) and a raw message on the setup's broker; each with every option its door
takes (models.pipeline.request): speakers, redact, hotwords, word timestamps, language,
priority, model and a callback, and an idempotency key where the door has one (sent twice:
one job). Every job is then read through every way out: GET, the four transcript formats,
gRPC's GetJob and the webhook; and its own door's: the MQTT reply, WatchJob, delay().get()
and OpenAI's answer. Each cell is a check; a failed cell names its door, option and way out.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from helpers import Receiver, flite, free_port, need_service, proto_stubs, wait_until
from stack import WHISPERQ, Stack, run_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

CONVERSATION = (
    ("slt", "Good morning. This is Siobhan from the billing team, calling about your account."),
    ("rms", "Thank you. Please call me back at four one five, five five five, zero one three two."),
)
HOTWORDS = "Siobhan"
KEY_NAME = "conformance"
# What every door that takes it is sent (the callback's URL is the receiver's, per door).
ASKED = {
    "language": "en",
    "priority": "high",
    "model": "tiny.en",
    "word_timestamps": "true",
    "speakers": "true",
    "redact": "pii",
    "hotwords": HOTWORDS,
}
FORMATS = ("txt", "json", "srt", "vtt")
# The way in as models.pipeline.request names it (a URL is the API's JSON body).
DECLARED = {"url": "api"}
DOORS_WITH_HOOKS = ("api", "url", "batch", "batch-itself", "rerun", "delay", "mqtt", "grpc", "raw")
DIGITS = re.compile(r"\d[\d ,.-]{4,}\d")  # the phone number, in any of Whisper's spellings


# -- what a transcript must show ---------------------------------------------------------------------


def option_problems(job: dict, door: str) -> dict[str, list[str]]:
    """Each option a door takes, as a job's view shows it: what is wrong with it (empty: nothing)."""
    from models.pipeline.request import names_for

    result = job.get("result") or {}
    segments = result.get("segments") or []
    analyses = {k: (v or {}).get("status") for k, v in (result.get("analyses") or {}).items()}
    text = result.get("text") or ""
    out: dict[str, list[str]] = {}
    if door == "analyses":  # a transcript alone: what the analyses and the words put in it
        taken = {"speakers", "redact", "word_timestamps"}
    else:
        taken = set(names_for(DECLARED.get(door, door))) | {"word_timestamps"}  # OpenAI's: by its granularities
    if "speakers" in taken:
        out["speakers"] = [
            f"{what}"
            for what, wrong in (
                (f"speakers {result.get('speakers')}, not two", len(set(result.get("speakers") or ())) < 2),
                ("a segment without a speaker", not segments or not all(s.get("speaker") for s in segments)),
                ("a word without a speaker", not all(w.get("speaker") for s in segments for w in s.get("words") or ())),
                (f"the analysis {analyses.get('speakers')}", analyses.get("speakers") != "DONE"),
            )
            if wrong
        ]
    if "redact" in taken:
        out["redact"] = [
            what
            for what, wrong in (
                (f"the phone number is in the text: {text[:160]!r}", bool(DIGITS.search(text))),
                (f"nothing redacted: {result.get('redacted')}", (result.get("redacted") or {}).get("count", 0) < 1),
                (f"the analysis {analyses.get('redact')}", analyses.get("redact") != "DONE"),
            )
            if wrong
        ]
    if "word_timestamps" in taken:
        words = job.get("word_timestamps") and segments and all(s.get("words") for s in segments)
        out["word_timestamps"] = [] if words else ["no words"]
    for name, wanted in (("priority", "high"), ("model", "tiny.en"), ("hotwords", HOTWORDS), ("language", "en")):
        if name in taken:
            out[name] = [] if job.get(name) == wanted else [f"{job.get(name)!r}, asked {wanted!r}"]
    if "callback_url" in taken and door not in ("rerun", "form"):  # a re-run's is its own; the page has none
        out["callback_url"] = [] if job.get("callback_url") else ["not kept"]
    return out


def transcript_problems(result: dict | None) -> list[str]:
    """What is wrong with a transcript asked for with every option (empty: nothing)."""
    if not result:
        return ["no transcript"]
    text = result.get("text") or ""
    out = [] if "billing" in text.lower() else [f"not the recording's words: {text[:120]!r}"]
    if not all("avg_logprob" in s for s in result.get("segments") or []):
        out.append("a segment without its scores")
    as_job = {"result": result, "word_timestamps": True}
    return out + [p for name, ps in option_problems(as_job, "analyses").items() for p in ps]


def job_problems(job: dict, door: str) -> list[str]:
    """What is wrong with a job's view: its status, every option as asked, its transcript."""
    if job.get("status") != "COMPLETED":
        return [f"status {job.get('status')}: {job.get('error')}"]
    problems = [f"{name}: {p}" for name, ps in option_problems(job, door).items() for p in ps]
    return problems + transcript_problems(job.get("result"))


# -- the setups -------------------------------------------------------------------------------------


@dataclass
class Setup:
    name: str
    settings: dict[str, str]
    raw: Any  # sends a raw message: raw(matrix, job_id, kwargs)
    cleanup: list = field(default_factory=list)


def _embedded(tmp: Path, aws=None) -> Setup:
    return Setup("embedded", {}, raw_redis)


def _rabbitmq(tmp: Path, aws=None) -> Setup:
    """RabbitMQ on a vhost of its own, PostgreSQL on a database of its own, audio in PostgreSQL."""
    if shutil.which("rabbitmqctl") is None:
        need_service("rabbitmqctl is not installed")
    suffix = uuid.uuid4().hex[:8]
    vhost, database = f"conformance-{suffix}", f"whisperq_conformance_{suffix}"
    for argv in (["add_vhost", vhost], ["set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"]):
        made = subprocess.run(["rabbitmqctl", "-q", *argv], capture_output=True, text=True, timeout=60)
        if made.returncode != 0:
            need_service(f"RabbitMQ: rabbitmqctl {' '.join(argv)}: {made.stderr.strip()}")
    _postgres(f"CREATE DATABASE {database}")
    setup = Setup(
        "rabbitmq",
        {
            "CELERY_BROKER_URL": f"amqp://guest:guest@127.0.0.1:5672/{vhost}",
            "DATABASE_URL": f"postgresql+psycopg://postgres@127.0.0.1:5432/{database}",
            "WHISPERQ_STORAGE": "postgres",
        },
        raw_amqp,
    )
    setup.cleanup += [
        lambda: subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True, timeout=60),
        lambda: _postgres(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
    ]
    return setup


def _postgres(statement: str) -> None:
    try:
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            conn.execute(statement)
    except Exception as exc:
        need_service(f"PostgreSQL on 127.0.0.1:5432: {exc}")


def _sqs(tmp: Path, aws=None) -> Setup:
    """SQS and S3 on moto's server on loopback, through AWS's own variables; SQLite."""
    bucket, prefix = f"conformance-{uuid.uuid4().hex[:8]}", f"c{uuid.uuid4().hex[:8]}-"
    aws.client("s3").create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    return Setup(
        "sqs",
        {
            **aws.env,
            "CELERY_BROKER_URL": "sqs://",
            "WHISPERQ_STORAGE": f"s3://{bucket}/jobs",
            "WHISPERQ_SQS_QUEUE_PREFIX": prefix,
        },
        raw_sqs,
    )


# -- raw messages, as a producer in another language writes them (docs/producers.md) -----------------


def raw_message(job_id: str, path: str, kwargs: dict) -> dict:
    from test_producers import message

    return message(job_id, path, **kwargs)  # checked against the published schema


def raw_redis(m: Matrix, job_id: str, path: str, kwargs: dict) -> None:
    from test_producers import send_redis

    url = (m.stack.data_dir / "broker.url").read_text().strip()  # what `whisperq env` exports
    send_redis(url, raw_message(job_id, path, kwargs), kwargs["priority"])


def raw_amqp(m: Matrix, job_id: str, path: str, kwargs: dict) -> None:
    from test_producers import send_amqp

    send_amqp(m.setup.settings["CELERY_BROKER_URL"], raw_message(job_id, path, kwargs), kwargs["priority"])


def raw_sqs(m: Matrix, job_id: str, path: str, kwargs: dict) -> None:
    from config import Settings
    from config.celeryconfig import route, sqs_name

    msg = raw_message(job_id, path, kwargs)
    settings = Settings.from_env({"WHISPERQ_DATA_DIR": str(m.tmp), **m.setup.settings})
    sqs = m.aws.client("sqs")
    url = sqs.get_queue_url(QueueName=sqs_name(settings, route("sqs://", "whisperq.prepare", kwargs["priority"])))
    sqs.send_message(QueueUrl=url["QueueUrl"], MessageBody=json.dumps(_envelope(msg, 9)))


def _envelope(msg: dict, priority: int) -> dict:
    job_id = msg["headers"]["id"]
    return {
        "body": base64.b64encode(json.dumps(msg["body"]).encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": msg["headers"],
        "properties": {
            "correlation_id": job_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "whisperq", "routing_key": "prepare"},
            "priority": priority,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }


# -- the matrix ------------------------------------------------------------------------------------


@dataclass
class Matrix:
    setup: Setup
    stack: Stack
    tmp: Path
    key: str
    recording: Path
    hooks: Receiver
    stubs: Any
    aws: Any = None
    jobs: dict[str, str] = field(default_factory=dict)  # door -> job id
    outs: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # door -> way out -> problems
    asked: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # door -> option -> problems
    extra: dict[str, Any] = field(default_factory=dict)  # what a door's own way out answered

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def callback(self, door: str) -> str:
        return self.hooks.url(f"/hook/{door}")

    def options(self, door: str, **more: str) -> dict[str, str]:
        from models.pipeline.request import names_for

        asked = {k: v for k, v in ASKED.items() if k in names_for(door)}
        if "callback_url" in names_for(door):
            asked["callback_url"] = self.callback(door)
        return {**asked, **more}

    def attempt(self, door: str, step, way: str = "submitted"):
        """Run one door's step; what it raised is a failed cell (so a pass counts every cell that
        fails, rather than stopping at the first), and None."""
        try:
            return step()
        except Exception as exc:
            self.cell(door, way, [f"{type(exc).__name__}: {str(exc)[:300]}"])
            return None

    def cell(self, door: str, way: str, problems: list[str]) -> None:
        self.outs.setdefault(door, {})[way] = problems

    def option(self, door: str, name: str, problems: list[str]) -> None:
        self.asked.setdefault(door, {})[name] = problems

    def get(self, path: str, **kw) -> requests.Response:
        return requests.get(self.stack.base + path, headers=self.headers, timeout=60, **kw)

    def post(self, path: str, **kw) -> requests.Response:
        headers = {**self.headers, **kw.pop("headers", {})}
        return requests.post(self.stack.base + path, headers=headers, timeout=120, **kw)

    def finished(self, job_id: str, timeout: float = 600) -> dict:
        def done():
            job = self.get(f"/v1/jobs/{job_id}?wait=20").json()
            return job if job.get("status") in ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED") else None

        return self.stack.wait(done, timeout, f"job {job_id}")


# -- the ways in --------------------------------------------------------------------------------------


def door_form(m: Matrix) -> None:
    """The page in Chromium: signed in with the key, the file chosen, More options ticked."""
    from selenium.webdriver.common.by import By
    from test_browser import by_id, start_chromium, wait_for

    browser = start_chromium(m.tmp / "chromium")
    try:
        browser.get(m.stack.base + "/login")
        by_id(browser, "key").send_keys(m.key)
        browser.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
        wait_for(browser, lambda: browser.current_url.rstrip("/") == m.stack.base, 20, "sign-in did not go home")
        by_id(browser, "file").send_keys(str(m.recording))
        browser.find_element(By.CSS_SELECTOR, "select[name=language] option[value=en]").click()
        browser.find_element(By.CSS_SELECTOR, "input[name=priority][value=high]").click()
        more = by_id(browser, "more-options")
        more.find_element(By.TAG_NAME, "summary").click()
        for name in ("speakers", "redact", "word_timestamps"):
            box = by_id(browser, f"opt-{name}")
            assert box.is_enabled(), f"{name} is not offered: {more.text}"
            box.click()
        by_id(browser, "opt-hotwords").send_keys(HOTWORDS)
        browser.save_screenshot(str(m.tmp / "form-options.png"))
        by_id(browser, "submit").click()
        wait_for(browser, lambda: "/jobs/" in browser.current_url, 60, "the upload did not open the job page")
        m.jobs["form"] = browser.current_url.rstrip("/").rsplit("/", 1)[-1]
        job = m.finished(m.jobs["form"])
        browser.get(browser.current_url)  # the finished job, as its page shows it
        wait_for(browser, lambda: by_id(browser, "status").get_attribute("data-status") == "COMPLETED", 60, "page")
        page = by_id(browser, "segments").text
        problems = [] if "Speaker A" in page and not DIGITS.search(page) else [f"the job page shows {page[:200]!r}"]
        m.cell("form", "the job page", problems)
        assert job["status"] == "COMPLETED", job
    finally:
        browser.quit()


def _idempotent(m: Matrix, door: str, send) -> None:
    """Send twice under one idempotency key: the same job both times."""
    key = f"conformance-{door}-{uuid.uuid4().hex[:8]}"
    first, second = send(key), send(key)
    ok = first.status_code == 202 and second.status_code == 200
    ids = {
        first.json().get("job_id") or first.json().get("batch_id"),
        second.json().get("job_id") or second.json().get("batch_id"),
    }
    m.cell(door, "idempotency key", [] if ok and len(ids) == 1 else [f"{first.status_code} {second.status_code} {ids}"])
    assert first.status_code == 202, first.text
    m.jobs[door] = first.json().get("job_id") or first.json().get("batch_id")


def door_api(m: Matrix) -> None:
    def send(key: str) -> requests.Response:
        with m.recording.open("rb") as fh:
            return m.post(
                "/v1/jobs",
                files={"file": ("call.wav", fh)},
                data=m.options("api"),
                headers={"Idempotency-Key": key},
            )

    _idempotent(m, "api", send)


def door_url(m: Matrix) -> None:
    body = {"audio_url": m.hooks.url("/audio/call.wav"), **m.options("api"), "callback_url": m.callback("url")}
    body["word_timestamps"] = True  # a JSON body takes JSON values
    _idempotent(m, "url", lambda key: m.post("/v1/jobs", json=body, headers={"Idempotency-Key": key}))


def door_batch(m: Matrix) -> None:
    item = {"audio_url": m.hooks.url("/audio/call.wav"), **m.options("batch")}
    item.pop("priority")  # one priority a batch
    body = {"items": [item], "priority": "high", "callback_url": m.callback("batch-itself")}
    _idempotent(m, "batch", lambda key: m.post("/v1/batches", json=body, headers={"Idempotency-Key": key}))
    batch = m.get(f"/v1/batches/{m.jobs['batch']}").json()
    m.jobs["batch"] = batch["jobs"][0]["job_id"]


def door_rerun(m: Matrix, original: str) -> None:
    resp = m.post(f"/v1/jobs/{original}/rerun", json={"callback_url": m.callback("rerun")})
    assert resp.status_code == 202, resp.text
    m.jobs["rerun"] = resp.json()["job_id"]


def door_openai(m: Matrix) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=m.stack.base + "/v1", api_key=m.key, timeout=600)
    with m.recording.open("rb") as fh:
        raw = client.audio.transcriptions.with_raw_response.create(
            model="whisper-1",
            file=fh,
            response_format="verbose_json",
            timestamp_granularities=["word", "segment"],
            language="en",
            extra_body={"speakers": "true", "redact": "pii", "hotwords": HOTWORDS},
        )
    m.jobs["openai"] = raw.headers["x-job-id"]
    answer = raw.parse()
    body = answer.model_dump() if hasattr(answer, "model_dump") else dict(answer)
    segments = body.get("segments") or []
    problems = []
    if DIGITS.search(body.get("text") or "") or "billing" not in (body.get("text") or "").lower():
        problems.append(f"text {body.get('text')!r}")
    if not segments or not all((s.get("speaker") if isinstance(s, dict) else None) for s in segments):
        problems.append(f"segments without speakers: {segments[:2]}")
    if not body.get("words"):
        problems.append("no words")
    m.cell("openai", "OpenAI's answer", problems)


def door_delay(m: Matrix, path: Path) -> subprocess.Popen:
    """transcribe.delay() from another process that knows the data dir alone (docs/clients/delay.md;
    and the broker's and database's URLs where they are not the embedded ones)."""
    import shlex

    env = {k: v for k, v in m.stack.env.items() if k not in ("CELERY_BROKER_URL", "DATABASE_URL")}
    env.update({k: v for k, v in m.setup.settings.items() if k in ("CELERY_BROKER_URL", "DATABASE_URL")})
    if "CELERY_BROKER_URL" not in env:  # the embedded broker: `whisperq env` says where it is
        published = m.stack.data_dir / "broker.url"
        assert published.stat().st_mode & 0o777 == 0o600  # it holds the broker's password
        exports = subprocess.run([str(WHISPERQ), "env"], env=env, capture_output=True, text=True, timeout=60)
        assert exports.returncode == 0, exports.stderr
        assert f"export CELERY_BROKER_URL={shlex.quote(published.read_text().strip())}" in exports.stdout
        assert f"reads files under: {path.parent}" in exports.stdout
        assert path.parent.stat().st_mode & 0o777 == 0o700  # the inbox `whisperq run` made: owner only
    options = {**m.options("delay"), "word_timestamps": True, "api_key": m.key}
    program = (
        "import json, sys\nfrom tasks import transcribe\n"
        "r = transcribe.delay(sys.argv[1], **json.loads(sys.argv[2]))\n"
        "print(json.dumps({'id': r.id}), flush=True)\n"
        "print(json.dumps(r.get(timeout=900)), flush=True)\n"
    )
    out = (m.tmp / "delay.out").open("w")
    return subprocess.Popen(
        [sys.executable, "-c", program, str(path), json.dumps(options)],
        env=env,
        cwd=m.tmp,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def door_mqtt(m: Matrix, path: Path, prefix: str):
    from mqtt_harness import Listener

    listener = Listener(prefix)
    correlation = f"conformance-{uuid.uuid4().hex[:8]}"
    request = {"path": str(path), "correlation_id": correlation, **m.options("mqtt")}
    request["word_timestamps"] = True
    for _ in range(2):  # the same request twice: one job
        listener.send(KEY_NAME, request)
    return listener, correlation


def door_grpc(m: Matrix) -> threading.Thread:
    import grpc

    pb, rpc = m.stubs
    key = f"conformance-grpc-{uuid.uuid4().hex[:8]}"
    options = {k: v for k, v in m.options("grpc").items() if k != "word_timestamps"}
    head = pb.SubmitRequest(filename="call.wav", word_timestamps=True, idempotency_key=key, **options)
    data = m.recording.read_bytes()
    channel = grpc.insecure_channel(m.stack.grpc_target)
    stub = rpc.TranscriptionStub(channel)
    metadata = [("authorization", f"Bearer {m.key}")]

    def chunks():
        yield pb.UploadChunk(head=head, data=data[: len(data) // 2])
        yield pb.UploadChunk(data=data[len(data) // 2 :])

    first = stub.Upload(chunks(), metadata=metadata, timeout=120)
    second = stub.Upload(chunks(), metadata=metadata, timeout=120)
    m.cell("grpc", "idempotency key", [] if first.id == second.id else [f"{first.id} then {second.id}"])
    m.jobs["grpc"] = first.id

    def watch():
        seen = list(stub.WatchJob(pb.WatchJobRequest(id=first.id), metadata=metadata, timeout=900))
        m.extra["watch"] = seen
        channel.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def send_raw(m: Matrix, setup: Setup, path: Path) -> None:
    raw_id = str(uuid.uuid4())
    setup.raw(m, raw_id, str(path), {**m.options("raw"), "word_timestamps": True, "api_key": m.key})
    m.jobs["raw"] = raw_id


# -- the ways out ------------------------------------------------------------------------------------


def mqtt_reply(m: Matrix, listener, correlation: str) -> None:
    replies = listener.results([correlation], timeout=600)[correlation]
    m.jobs["mqtt"] = replies["job_id"]
    jobs = {r.get("job_id") for r in listener.replies(correlation)}
    m.cell("mqtt", "idempotency key", [] if jobs == {replies["job_id"]} else [f"jobs {jobs}"])
    m.cell("mqtt", "MQTT reply", job_problems(replies["job"] or {}, "mqtt"))


def watched(m: Matrix, watch: threading.Thread) -> None:
    from google.protobuf import json_format

    watch.join(900)
    seen = m.extra.get("watch") or []
    statuses = [pb_status(m, j) for j in seen]
    last = json_format.MessageToDict(seen[-1], preserving_proto_field_name=True) if seen else {}
    problems = [] if statuses and statuses[-1] == "COMPLETED" else [f"statuses {statuses}"]
    m.cell("grpc", "gRPC WatchJob", problems + transcript_problems(last.get("result")))


def delayed(m: Matrix, delay: subprocess.Popen) -> None:
    code = delay.wait(900)
    out = (m.tmp / "delay.out").read_text()
    assert code == 0, out[-3000:]
    lines = out.strip().splitlines()
    m.jobs["delay"] = json.loads(lines[0])["id"]
    m.cell("delay", "delay().get()", transcript_problems(json.loads(lines[-1])))


def read_everything(m: Matrix) -> None:
    """Every job through every way out every job has; each way out a cell of its own."""
    import grpc

    _pb, rpc = m.stubs
    channel = grpc.insecure_channel(m.stack.grpc_target)
    stub = rpc.TranscriptionStub(channel)
    for door, job_id in list(m.jobs.items()):
        job = m.attempt(door, lambda job_id=job_id: m.finished(job_id), "GET /v1/jobs/<id>")
        if job is None:
            continue
        m.cell(door, "GET /v1/jobs/<id>", job_problems(job, door))
        for name, problems in option_problems(job, door).items():
            m.option(door, name, problems)
        for fmt in FORMATS:
            m.attempt(
                door, lambda fmt=fmt, job_id=job_id, door=door: transcript_as(m, door, job_id, fmt), f"transcript {fmt}"
            )
        m.attempt(door, lambda job_id=job_id, door=door: got_by_grpc(m, stub, door, job_id), "gRPC GetJob")
    channel.close()
    from models.pipeline.request import names_for

    for door, job_id in list(m.jobs.items()):
        if "callback_url" in names_for(DECLARED.get(door, door)) and door != "form":  # the page has no webhook
            m.attempt(door, lambda door=door, job_id=job_id: hooked(m, door, job_id), "webhook")


def transcript_as(m: Matrix, door: str, job_id: str, fmt: str) -> None:
    resp = m.get(f"/v1/jobs/{job_id}/transcript?format={fmt}")
    text = resp.text
    problems = [] if resp.status_code == 200 else [f"{resp.status_code}: {text[:200]}"]
    said = "\n".join(line for line in text.splitlines() if "-->" not in line and not line.strip().isdigit())
    if fmt == "json":
        problems += transcript_problems(resp.json() if resp.status_code == 200 else None)
    elif DIGITS.search(said) or "billing" not in said.lower():
        problems.append(f"{text[:200]!r}")
    elif fmt == "txt" and not text.startswith("Speaker A: "):
        problems.append(f"no speaker labels: {text[:80]!r}")
    elif fmt == "vtt" and "<v Speaker A>" not in text:
        problems.append("no speaker voice tags")
    m.cell(door, f"transcript {fmt}", problems)


def got_by_grpc(m: Matrix, stub, door: str, job_id: str) -> None:
    from google.protobuf import json_format

    pb, _ = m.stubs
    message = stub.GetJob(pb.GetJobRequest(id=job_id), metadata=[("authorization", f"Bearer {m.key}")], timeout=60)
    viewed = json_format.MessageToDict(message, preserving_proto_field_name=True)
    viewed["job_id"] = viewed.pop("id")
    viewed["word_timestamps"] = viewed.get("word_timestamps", False)
    m.cell(door, "gRPC GetJob", job_problems(viewed, door))


def hooked(m: Matrix, door: str, job_id: str) -> None:
    """The receiver got job.completed for the job, with its transcript."""
    path = f"/hook/{door}"

    def delivered():
        for _method, got, _headers, body in list(m.hooks.requests):
            event = json.loads(body or b"{}")
            if got == path and event.get("data", {}).get("job_id") == job_id:
                return event
        return None

    event = m.stack.wait(delivered, 120, f"the webhook of {door}'s job")
    problems = [] if event["type"] == "job.completed" else [f"event {event['type']}"]
    m.cell(door, "webhook", problems + transcript_problems(event["data"].get("result")))


# -- the test ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recording(tmp_path_factory) -> Path:
    from models.speech import audio

    tmp = tmp_path_factory.mktemp("conversation")
    gap = np.zeros(audio.SAMPLE_RATE // 2, dtype=np.float32)
    parts = []
    for voice, text in CONVERSATION:
        parts += [audio.decode(flite(tmp, voice, text)), gap]
    import wave

    path = tmp / "call.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(audio.SAMPLE_RATE)
        out.writeframes((np.clip(np.concatenate(parts), -1, 1) * 32767).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    return proto_stubs(tmp_path_factory.mktemp("grpc-stubs"))


def run_matrix(setup: Setup, tmp: Path, recording: Path, stubs, aws=None) -> Matrix:
    if os.environ.get("REQUIRE_SERVICES") != "1":
        pytest.importorskip("resemblyzer")  # the speakers extra: installed by .ci/run
    from mqtt_harness import MOSQUITTO, forget_session, mosquitto_up

    if not mosquitto_up():
        need_service(f"Mosquitto on {MOSQUITTO[0]}:{MOSQUITTO[1]} is unreachable")
    prefix = f"wqconf-{uuid.uuid4().hex[:8]}"
    settings = {
        **setup.settings,
        "WHISPERQ_MQTT_URL": f"mqtt://{MOSQUITTO[0]}:{MOSQUITTO[1]}",
        "WHISPERQ_MQTT_CLIENT_ID": f"{prefix}-bridge",
        "WHISPERQ_MQTT_REQUEST_TOPIC": f"{prefix}/requests/+",
        "WHISPERQ_MQTT_REPLY_PREFIX": f"{prefix}/replies",
        "WHISPERQ_LOG_FORMAT": "text",
    }
    audio_bytes = recording.read_bytes()
    hooks = Receiver(
        {
            "/audio/call.wav": (200, {"Content-Type": "audio/wav"}, audio_bytes),
            **{
                f"/hook/{d}": (200, {}, b"")
                for d in ("api", "url", "batch", "batch-itself", "rerun", "delay", "mqtt", "grpc", "raw")
            },
        }
    )
    hooks.__enter__()
    # The key every door acts with (premium: it may ask for high), made on the stack's
    # settings before it starts, so that the MQTT bridge maps its client to it.
    created = subprocess.run(
        [str(WHISPERQ), "keys", "create", "--name", KEY_NAME, "--tier", "premium"],
        env=run_env(tmp, free_port(), **settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[0]
    key_id = re.search(r"key (\S+) \(", created.stderr).group(1)
    stack = Stack.start(tmp, **settings, WHISPERQ_MQTT_CLIENTS=f"{KEY_NAME}={key_id}")
    m = Matrix(setup, stack, tmp, key, recording, hooks, stubs, aws)
    listener = None
    try:
        stack.ready()
        inbox = stack.data_dir / "inbox"
        wait_until(inbox.is_dir, 60, "the inbox `whisperq run` makes")
        shutil.copy(recording, inbox / "call.wav")
        path = inbox / "call.wav"
        delay = m.attempt("delay", lambda: door_delay(m, path))
        mqtt = m.attempt("mqtt", lambda: door_mqtt(m, path, prefix))
        listener = mqtt[0] if mqtt else None
        watch = m.attempt("grpc", lambda: door_grpc(m))
        for door, submit in (("api", door_api), ("url", door_url), ("batch", door_batch)):
            m.attempt(door, lambda submit=submit: submit(m))
        m.attempt("raw", lambda: send_raw(m, setup, path))
        m.attempt("openai", lambda: door_openai(m))
        m.attempt("form", lambda: door_form(m))
        m.attempt("rerun", lambda: door_rerun(m, m.jobs["api"]))
        # the doors' own ways out
        if mqtt:
            m.attempt("mqtt", lambda: mqtt_reply(m, *mqtt), "MQTT reply")
        if watch:
            m.attempt("grpc", lambda: watched(m, watch), "gRPC WatchJob")
        if delay:
            m.attempt("delay", lambda: delayed(m, delay), "delay().get()")
        read_everything(m)
    finally:
        if listener is not None:
            listener.close()
            forget_session(f"{prefix}-bridge")
        code = stack.stop()
        hooks.__exit__(None, None, None)
    log = stack.output()
    m.cell("all", "the stack's log", [w for w in ("RecursionError", "MonkeyPatchWarning") if w in log])
    assert code in (0, -15, 143), log[-3000:]
    return m


WAYS_IN = ("form", "api", "url", "batch", "rerun", "openai", "delay", "mqtt", "grpc", "raw")
OWN_WAY_OUT = {
    "form": "the job page",
    "openai": "OpenAI's answer",
    "delay": "delay().get()",
    "mqtt": "MQTT reply",
    "grpc": "gRPC WatchJob",
}
WITH_KEY = ("api", "url", "batch", "mqtt", "grpc")  # the ways in that take an idempotency key


def expected(door: str) -> tuple[list[str], list[str]]:
    """The cells a way in must fill: its options, and its ways out."""
    from models.pipeline.request import names_for

    taken = names_for(DECLARED.get(door, door))
    options = [o for o in (*ASKED, "callback_url") if o in taken or o == "word_timestamps"]
    if door in ("rerun", "form"):
        options = [o for o in options if o != "callback_url"]
    ways = ["GET /v1/jobs/<id>", *(f"transcript {f}" for f in FORMATS), "gRPC GetJob"]
    ways += ["webhook"] if "callback_url" in options else []
    ways += [OWN_WAY_OUT[door]] if door in OWN_WAY_OUT else []
    ways += ["idempotency key"] if door in WITH_KEY else []
    return options, ways


def fill_missing(m: Matrix) -> None:
    """A cell a way in never reached (its job was never made or read) is a failed cell."""
    for door in WAYS_IN:
        options, ways = expected(door)
        for name in options:
            m.asked.setdefault(door, {}).setdefault(name, ["never reached"])
        for way in ways:
            m.outs.setdefault(door, {}).setdefault(way, ["never reached"])


def pb_status(m: Matrix, job) -> str:
    pb, _ = m.stubs
    return pb.Job.Status.Name(job.status)


def _table(title: str, rows: dict[str, dict[str, list[str]]]) -> list[str]:
    columns = sorted({c for row in rows.values() for c in row})
    lines = [title, "| way in | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for door, row in sorted(rows.items()):
        cells = ["ok" if row.get(c) == [] else ("n/a" if c not in row else "FAIL") for c in columns]
        lines.append(f"| {door} | " + " | ".join(cells) + " |")
    return lines


def report(m: Matrix) -> str:
    """The matrix as two tables, a row per way in: each option as the job shows it, and each way
    out (where every option is checked again); then every failed cell with its problems."""
    lines = [f"conformance matrix, {m.setup.name}:", ""]
    lines += [*_table("options (GET /v1/jobs/<id>; the webhook and the key in the ways out)", m.asked), ""]
    lines += [*_table("ways out", m.outs), ""]
    for rows in (m.asked, m.outs):
        lines += [f"{door} × {c}: {'; '.join(p)}" for door, row in rows.items() for c, p in row.items() if p]
    return "\n".join(lines)


def check(m: Matrix) -> None:
    fill_missing(m)
    text = report(m)
    print(text)
    (Path(os.environ.get("WHISPERQ_CONFORMANCE_DIR", m.tmp)) / f"conformance-{m.setup.name}.txt").write_text(text)
    cells = sum(len(row) for rows in (m.asked, m.outs) for row in rows.values())
    failed = [(door, c) for rows in (m.asked, m.outs) for door, row in rows.items() for c, p in row.items() if p]
    assert not failed, text
    assert set(m.jobs) >= set(WAYS_IN), text
    assert cells >= 10 * 14, text


def test_every_way_in_every_option_every_way_out_on_the_embedded_broker(tmp_path, recording, stubs):
    m = run_matrix(_embedded(tmp_path), tmp_path, recording, stubs)
    check(m)


@pytest.mark.rabbitmq
def test_every_way_in_every_option_every_way_out_on_rabbitmq_and_postgresql(tmp_path, recording, stubs):
    setup = _rabbitmq(tmp_path)
    try:
        check(run_matrix(setup, tmp_path, recording, stubs))
    finally:
        for undo in setup.cleanup:
            undo()


@pytest.mark.sqs
def test_every_way_in_every_option_every_way_out_on_sqs_and_s3(tmp_path, recording, stubs, s3_env):
    check(run_matrix(_sqs(tmp_path, s3_env), tmp_path, recording, stubs, s3_env))
