"""SQS as the broker (CELERY_BROKER_URL=sqs://, kombu's SQS transport with models.compat's
channel) against moto's server on loopback: the one tests/s3_server.py starts for the S3 tests,
which answers SQS's API too, reached through AWS's own variables as a deployment reaches SQS.

Each test with workers starts its own (conftest.start_worker; on SQS a worker is ready when its
log says so, there is no remote control to ping) on a queue prefix, data dir and database of its
own, so nothing of the session's broker or workers takes part: a job through SQS end to end; a
backlog taken in priority order; a worker killed mid-job whose message SQS hands out again after
its visibility timeout, the engine run once; a poison job in both dead-letter stores, replayed.
The rest checks the settings, the names and what SQS cannot do, without workers.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from api import submit_id, wait_for_job
from helpers import CLIPS, long_recording, make_job, wait_until, word_error_rate, write_wav

pytestmark = pytest.mark.sqs

ADMIN = {"Authorization": f"Bearer {os.environ.get('WHISPERQ_ADMIN_TOKEN', '')}"}


# -- the stack ----------------------------------------------------------------------------------


@dataclass
class SqsStack:
    """A web app and workers of a test's own on SQS (the loopback server's), under a queue
    prefix of its own: `start(pool)` starts a worker as the Procfile does."""

    settings: Any
    env: dict[str, str]
    celery: Any
    app: Any
    tmp: Path
    aws: Any
    workers: list = field(default_factory=list)

    @property
    def client(self):
        return self.app.test_client()

    @property
    def rt(self):
        return self.app.extensions["whisperq"]

    def start(self, pool: str, tag: str = "", **env: str):
        from conftest import start_worker

        from config import INFERENCE_QUEUE, PREPARE_QUEUE

        queue, kind, slots = {
            "prepare": (PREPARE_QUEUE, "prefork", 1),
            "inference": (INFERENCE_QUEUE, "threads", 8),
        }[pool]
        name = f"sqs-{pool}{tag}-{uuid.uuid4().hex[:6]}"
        worker = start_worker(self.celery, self.tmp, name, queue, kind, slots, extra_env={**self.env, **env})
        self.workers.append(worker)
        return worker

    def sqs(self):
        return self.aws.client("sqs")

    def url(self, queue: str) -> str:
        from config.celeryconfig import sqs_name

        return self.sqs().get_queue_url(QueueName=sqs_name(self.settings, queue))["QueueUrl"]

    def job(self, job_id: str):
        from models.jobs.record import Job

        with self.rt.db.session() as session:
            job = session.get(Job, job_id)
            session.expunge(job)
            return job

    def output(self) -> str:
        return "\n".join(w.output()[-4000:] for w in self.workers)


@pytest.fixture()
def sqs_stack(settings, sqs_env, tmp_path, monkeypatch):
    """make(**variables): the stack on settings read from the environment with these
    variables on top (the workers get the same), on SQS under a prefix of the test's own."""
    from conftest import stop_worker

    import tasks.broker.sqs
    from config import Settings
    from models.db import Database
    from tasks.app import celery_for
    from web import create_app

    monkeypatch.setattr(tasks.broker.sqs, "SCAN_VISIBILITY", 2)  # a scan hides what it read for 2 s, not 30
    stacks: list[SqsStack] = []

    def make(**variables: str) -> SqsStack:
        data = tmp_path / "data"
        env = {
            "CELERY_BROKER_URL": "sqs://",
            "CELERY_RESULT_BACKEND": "",
            "DATABASE_URL": f"sqlite:///{data / 'whisperq.db'}",
            "WHISPERQ_DATA_DIR": str(data),
            "WHISPERQ_SQS_QUEUE_PREFIX": f"t{uuid.uuid4().hex[:8]}-",
            **variables,
        }
        for name, value in env.items():  # Celery reads CELERY_BROKER_URL before its configuration
            monkeypatch.setenv(name, value)
        private = Settings.from_env()
        Database(private.database_url).upgrade()
        app = create_app({"SETTINGS": private, "TESTING": True})
        stack = SqsStack(private, env, celery_for(private), app, tmp_path, sqs_env)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        for worker in stack.workers:
            if worker.proc.poll() is None:
                stop_worker(worker)


def engine_runs(stack: SqsStack, job_id: str) -> int:
    return stack.job(job_id).engine_runs or 0


# -- through real workers -----------------------------------------------------------------------


@pytest.mark.integration
def test_a_job_goes_through_sqs_end_to_end(sqs_stack):
    from config.celeryconfig import DEAD_LETTER_QUEUE, sqs_max_receives, sqs_visibility_timeout

    stack = sqs_stack()
    stack.start("prepare")
    stack.start("inference")
    job_id = submit_id(stack.client, "fox.flac", language="en")
    job = wait_for_job(stack.client, job_id, timeout=240)
    assert job["status"] == "COMPLETED", (job, stack.output())
    assert word_error_rate(CLIPS["fox.flac"]["text"], job["result"]["text"]) <= 0.2, job["result"]["text"]
    assert stack.job(job_id).engine_runs == 1
    from models.jobs.ledger import passes

    assert [p.outcome for p in passes(stack.rt.db, [job_id])[job_id]] == ["stored"]

    # the queues as the workers declared them: one per tier, each its pool's visibility timeout,
    # and the redrive policy to the dead-letter queue
    sqs, settings = stack.sqs(), stack.settings
    dead_arn = sqs.get_queue_attributes(QueueUrl=stack.url(DEAD_LETTER_QUEUE), AttributeNames=["QueueArn"])
    for queue in ("whisperq.prepare:high", "whisperq.prepare", "whisperq.inference:low", "whisperq.notify"):
        attributes = sqs.get_queue_attributes(QueueUrl=stack.url(queue), AttributeNames=["All"])["Attributes"]
        assert int(attributes["VisibilityTimeout"]) == sqs_visibility_timeout(settings)
        redrive = json.loads(attributes["RedrivePolicy"])
        assert redrive["deadLetterTargetArn"] == dead_arn["Attributes"]["QueueArn"]
        assert int(redrive["maxReceiveCount"]) == sqs_max_receives(settings)

    # a producer that is not Celery (docs/producers.md, On SQS): the envelope as JSON, sent to
    # the tier's queue with a plain SQS client
    from test_producers import message

    raw_id, audio = str(uuid.uuid4()), stack.tmp / "raw.flac"
    shutil.copy(CLIPS["fox.flac"]["path"], audio)
    raw = message(raw_id, str(audio), language="en", priority="high")
    envelope = {
        "body": base64.b64encode(json.dumps(raw["body"]).encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": raw["headers"],
        "properties": {
            "correlation_id": raw_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "whisperq", "routing_key": "prepare:high"},
            "priority": 9,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    sqs.send_message(QueueUrl=stack.url("whisperq.prepare:high"), MessageBody=json.dumps(envelope))
    done = wait_for_job(stack.client, raw_id, timeout=240)
    assert done["status"] == "COMPLETED" and done["priority"] == "high", (done, stack.output())
    assert word_error_rate(CLIPS["fox.flac"]["text"], done["result"]["text"]) <= 0.2

    # the prepare queue runs only the prepare pool's tasks: an infer message sent there (by a
    # producer whose policy allows that queue alone) is dropped unread, and so is an unsigned
    # sweep, which that queue does carry; the job they name is left as it was
    from test_attacks import dropped, infer_message
    from test_producers import envelope as celery_message

    before = (stack.job(raw_id).status, stack.job(raw_id).attempts, stack.job(raw_id).engine_runs)
    sent = {"whisperq.infer": str(uuid.uuid4()), "whisperq.sweep": str(uuid.uuid4())}
    for task, message_id in sent.items():
        args = [infer_message(raw_id, f"prepared/{raw_id[:2]}/{raw_id}.npy")] if task == "whisperq.infer" else []
        body = celery_message(task, message_id, args, {})
        wrapped = dict(
            envelope, body=base64.b64encode(json.dumps(body["body"]).encode()).decode(), headers=body["headers"]
        )
        sqs.send_message(QueueUrl=stack.url("whisperq.prepare:high"), MessageBody=json.dumps(wrapped))
    wait_until(
        lambda: (
            dropped("whisperq.infer", sent["whisperq.infer"]) + ": a task of the inference pool" in stack.output()
            and dropped("whisperq.sweep", sent["whisperq.sweep"]) + ": unsigned" in stack.output()
        ),
        120,
        "the prepare worker did not drop both messages",
    )
    assert (stack.job(raw_id).status, stack.job(raw_id).attempts, stack.job(raw_id).engine_runs) == before

    ready = stack.client.get("/readyz").get_json()  # the broker answers: kombu lists the prefix's queues
    assert ready["checks"]["broker"] == "ok" and ready["models"]["tiny.en"] == 1, ready
    metrics = stack.client.get("/metrics").get_data(as_text=True)  # the depths, one per tier, from SQS

    assert 'whisperq_queue_depth{priority="high",queue="whisperq.prepare"} 0.0' in metrics
    assert 'whisperq_metrics_source_up{source="broker"} 1.0' in metrics


@pytest.mark.integration
def test_a_backlog_is_taken_high_first(sqs_stack):
    """Jobs queued while no worker runs, low first: one prepare worker (one slot) then takes
    every high one before any normal, and every normal before any low."""
    stack = sqs_stack()
    submitted = [(tier, submit_id(stack.client, "fox.flac", language="en", priority=tier)) for tier in ("low",) * 2]
    submitted += [(tier, submit_id(stack.client, "fox.flac", language="en", priority=tier)) for tier in ("normal",) * 2]
    submitted += [(tier, submit_id(stack.client, "fox.flac", language="en", priority=tier)) for tier in ("high",) * 2]
    stack.start("prepare")
    wait_until(
        lambda: all(stack.job(job_id).started_at for _, job_id in submitted),
        180,
        "the prepare worker did not start them all",
    )
    order = [tier for tier, job_id in sorted(submitted, key=lambda s: stack.job(s[1]).started_at)]
    assert order == ["high", "high", "normal", "normal", "low", "low"], (order, stack.output())
    stack.start("inference")
    for _, job_id in submitted:
        assert wait_for_job(stack.client, job_id, timeout=240)["status"] == "COMPLETED", stack.output()


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_held_message_stays_hidden_while_its_worker_lives_and_comes_back_soon_after_a_kill(sqs_stack):
    """Two inference workers ask the same queues. The one that took the job holds it for three
    visibility timeouts (its batch waits 25 s; the timeout is 8 s): its heartbeat keeps the
    message hidden, so the other is never handed it. SIGKILLed, it extends nothing more: SQS
    hands the message to the other within a timeout, which takes the job's claim once the dead
    holder's lease lapsed, and runs the engine once; the killed run cost an attempt."""
    import socket
    import time

    from config import INFERENCE_QUEUE

    visibility = 8
    stack = sqs_stack(WHISPERQ_SQS_VISIBILITY_TIMEOUT=str(visibility), WHISPERQ_MAX_ATTEMPTS="4")
    stack.start("prepare")
    slow = stack.start("inference", "-a", WHISPERQ_BATCH_WAIT_MS="25000")  # holds its job 25 s at least
    samples, text = long_recording(repeats=2)
    path = write_wav(stack.tmp / "long.wav", samples)
    job_id = submit_id(stack.client, None, data=path.read_bytes(), filename="long.wav", language="en")
    holder = f"{socket.gethostname()}:{slow.proc.pid}"
    wait_until(lambda: stack.job(job_id).claim_holder == holder, 180, "the inference worker never took the job")
    taken = time.monotonic()
    other = stack.start("inference", "-b")  # ready (its log says so) while the first holds the job
    url = stack.url(INFERENCE_QUEUE)

    def hidden() -> int:
        attributes = stack.sqs().get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
        )
        return int(attributes["Attributes"]["ApproximateNumberOfMessagesNotVisible"])

    # Proof the other worker had its chance: two timeouts and more have passed since the take,
    # and the message is still hidden, held by the first.
    wait_until(lambda: time.monotonic() - taken > 2.5 * visibility, 60, "the clock stopped")
    assert hidden() == 1 and stack.job(job_id).claim_holder == holder
    assert f"Task whisperq.infer[{job_id}] received" not in other.output(), other.output()[-3000:]

    os.kill(slow.proc.pid, signal.SIGKILL)
    slow.proc.wait()
    killed = time.monotonic()
    killed_job = stack.job(job_id)
    assert killed_job.status == "PROCESSING" and (killed_job.engine_runs or 0) == 0, "the job ended before the kill"
    wait_until(
        lambda: f"Task whisperq.infer[{job_id}] received" in other.output(),
        visibility * 3,
        "SQS never handed the killed worker's message out again",
    )
    handed_back = time.monotonic() - killed
    job = wait_for_job(stack.client, job_id, timeout=240)
    assert job["status"] == "COMPLETED", (job, stack.output())
    assert handed_back <= visibility * 2, handed_back
    assert engine_runs(stack, job_id) == 1, stack.output()
    # the engine ledger: the killed worker's pass (its batch waited: it may not have begun) never
    # ended; the other's was stored; nothing else went through the engine
    from models.jobs.ledger import Explained, passes, problems

    ledger = passes(stack.rt.db, [job_id])
    assert problems(ledger, Explained(killed=frozenset({slow.proc.pid}))) == {}, ledger
    assert [p.outcome for p in ledger[job_id]][-1] == "stored"
    assert job["attempts"] >= 2, job  # the killed run cost an attempt
    assert other.output().count(f"job {job_id}: transcript stored") == 1
    assert word_error_rate(text, job["result"]["text"]) <= 0.25


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_a_poison_job_ends_in_both_dead_letter_stores_and_is_replayed(sqs_stack):
    """A job whose audio is not there yet uses up its attempts: the database keeps it (error,
    traceback, attempts) and its message is in SQS's dead-letter queue, marked as rejected by
    a worker. Replayed once the audio is there, it completes, and the sweeper's pass deletes
    the message, as the job is a dead letter no more."""
    from models.jobs.deadletter import get_dead
    from tasks import transcribe
    from tasks.broker.sqs import dead_messages, reconcile

    stack = sqs_stack(WHISPERQ_MAX_ATTEMPTS="2", WHISPERQ_RETRY_MAX_SECONDS="1")
    stack.start("prepare")
    stack.start("inference")
    poison_path = stack.tmp / "not-synced-yet.flac"
    poison = transcribe.delay(str(poison_path), language="en")
    job = wait_for_job(stack.client, poison.id, timeout=180)
    assert job["status"] == "FAILED" and job["attempts"] == 2, (job, stack.output())
    dead = get_dead(stack.rt, poison.id)
    assert dead["attempts"] == 2 and "does not exist" in dead["error"] and "Traceback" in dead["traceback"]

    in_sqs = wait_until(
        lambda: [m for m in dead_messages(stack.celery) if m.job_id == poison.id],
        60,
        "the rejected message never reached the SQS dead-letter queue",
    )
    assert in_sqs[0].task == "whisperq.transcribe" and in_sqs[0].rejected_from.endswith("whisperq-prepare")
    assert reconcile(stack.celery, stack.rt).deleted == []  # a dead letter in both: left as it is

    shutil.copy(CLIPS["fox.flac"]["path"], poison_path)  # the operator fixes the cause
    assert stack.client.post(f"/v1/admin/dead-letters/{poison.id}/replay", headers=ADMIN).status_code == 202
    job = wait_for_job(stack.client, poison.id, timeout=180)
    assert job["status"] == "COMPLETED" and job["attempts"] == 1, (job, stack.output())
    assert word_error_rate(CLIPS["fox.flac"]["text"], job["result"]["text"]) <= 0.2
    wait_until(  # hidden for a moment by the scan above
        lambda: poison.id in reconcile(stack.celery, stack.rt).deleted, 60, "the replayed job's message stayed"
    )
    assert not [m for m in dead_messages(stack.celery) if m.job_id == poison.id]


# -- without workers ----------------------------------------------------------------------------


def test_a_message_sqs_dead_lettered_on_its_own_becomes_a_dead_letter_in_the_database(sqs_stack):
    """A message received maxReceiveCount times (its workers died each time before they could
    count an attempt) is moved by SQS, unmarked: the sweeper's pass records its job as a dead
    letter, marks the message, and leaves it alone from then on (a replay is not undone)."""
    import base64

    from config.celeryconfig import DEAD_LETTER_QUEUE
    from models.jobs.deadletter import get_dead, replay
    from tasks.broker import run_sweep
    from tasks.broker.sqs import dead_messages, declare, reconcile

    stack = sqs_stack()
    declare(stack.celery)
    job = make_job(stack.rt, None, filename="a.flac", duration=4.0, language="en", priority="normal")
    payload = {"body": "", "headers": {"id": job.id, "task": "whisperq.transcribe"}, "properties": {}}
    body = base64.b64encode(json.dumps(payload).encode()).decode()
    stack.sqs().send_message(QueueUrl=stack.url(DEAD_LETTER_QUEUE), MessageBody=body)

    report = run_sweep(stack.celery, rt=stack.rt)  # beat's pass: no worker is asked anything on SQS
    assert report.dead == [job.id] and report.requeued == []
    assert "SQS moved it to the dead-letter queue" in get_dead(stack.rt, job.id)["error"]
    assert stack.job(job.id).status == "FAILED"
    marked = wait_until(lambda: dead_messages(stack.celery), 60, "the message was not put back, marked")
    assert [(m.job_id, m.rejected_from) for m in marked] == [(job.id, "redrive")]
    replay(stack.rt, job.id)  # no audio was stored: it fails again, but it is no dead letter now
    wait_until(lambda: job.id in reconcile(stack.celery, stack.rt).deleted, 60, "the marked message stayed")
    assert stack.job(job.id).status == "PENDING"


def test_sqs_urls_name_nothing_but_the_scheme(tmp_path):
    from config import ConfigError, Settings

    ok = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "CELERY_BROKER_URL": "sqs://"})
    assert ok.broker_url == "sqs://" and ok.celery_result_backend() == f"db+{ok.database_url}"
    for bad in ("sqs://AKIAEXAMPLE:secret@", "sqs://localhost:4566", "sqs://sqs.eu-west-1.amazonaws.com"):
        with pytest.raises(ConfigError, match="write sqs:// alone") as err:
            Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "CELERY_BROKER_URL": bad})
        assert "secret" not in str(err.value)
    with pytest.raises(ConfigError, match=r"WHISPERQ_SQS_QUEUE_PREFIX='prod\.' is not a queue name prefix"):
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_SQS_QUEUE_PREFIX": "prod."})


def test_without_pycurl_sqs_stops_at_start_saying_what_to_install(tmp_path, monkeypatch):
    import sys

    from config import ConfigError, Settings

    monkeypatch.setitem(sys.modules, "pycurl", None)
    with pytest.raises(ConfigError, match=r"sqs:// needs pycurl .*pip install 'whisperq\[sqs\]'"):
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "CELERY_BROKER_URL": "sqs://"})


def test_a_received_message_is_hidden_a_minute_by_default_and_workers_extend_it_every_third(tmp_path):
    from config import ConfigError, Settings
    from config.celeryconfig import celery_config, sqs_heartbeat, sqs_visibility_timeout

    settings = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "CELERY_BROKER_URL": "sqs://"})
    # with default settings a killed worker's job is handed out again within the claim's lease
    assert sqs_visibility_timeout(settings) == 60 <= Settings.from_env({}).claim_lease_seconds
    options = celery_config(settings)["broker_transport_options"]
    assert options["visibility_timeout"] == 60 and options["whisperq_heartbeat"] == sqs_heartbeat(settings) == 20
    assert options["wait_time_seconds"] == 1 and options["queue_name_prefix"] == ""

    # a message can be held 12 hours at most from its receipt, extended or not
    long = {"WHISPERQ_DATA_DIR": str(tmp_path), "CELERY_BROKER_URL": "sqs://", "WHISPERQ_MAX_AUDIO_SECONDS": "36000"}
    with pytest.raises(ConfigError, match=r"at most 43200 s, and the inference pool may hold one .*lower WHISPERQ_MAX"):
        celery_config(Settings.from_env(long))


def test_queues_are_split_by_tier_and_asked_highest_first(tmp_path):
    from config import Settings
    from config.celeryconfig import (
        consumed_in_order,
        models_of,
        pool_of,
        route,
        sqs_name,
        sqs_queues,
        sqs_router,
        tier_of_number,
    )

    settings = Settings.from_env(
        {
            "WHISPERQ_DATA_DIR": str(tmp_path),
            "CELERY_BROKER_URL": "sqs://",
            "WHISPERQ_SQS_QUEUE_PREFIX": "prod-",
            "WHISPERQ_MODELS": "tiny.en=bundled:tiny.en, base=bundled:base",
        }
    )
    assert route("sqs://", "whisperq.prepare", "high") == "whisperq.prepare:high"
    assert route("sqs://", "whisperq.prepare", "normal") == "whisperq.prepare"
    assert route("sqs://", "whisperq.notify", "low") == "whisperq.notify"  # deliveries have no tiers
    assert route("redis://x", "whisperq.prepare", "high") == "whisperq.prepare"
    assert consumed_in_order(["whisperq.inference", "whisperq.inference.base"]) == [
        "whisperq.inference:high",
        "whisperq.inference.base:high",
        "whisperq.inference",
        "whisperq.inference.base",
        "whisperq.inference:low",
        "whisperq.inference.base:low",
    ]
    assert consumed_in_order(["whisperq.notify"]) == ["whisperq.notify"]
    assert pool_of("whisperq.inference.base:low") == "inference" and pool_of("whisperq.prepare:high") == "prepare"
    assert models_of(settings, consumed_in_order(["whisperq.inference", "whisperq.inference.base"])) == [
        "base",
        "tiny.en",
    ]
    assert sqs_queues(settings)["whisperq.inference.base:high"] == "inference.base:high"
    assert sqs_name(settings, "whisperq.inference.base:high") == "prod-whisperq-inference-base_high"
    assert [tier_of_number(n) for n in (9, 5, 1, None)] == ["high", "normal", "low", "normal"]
    assert sqs_router("whisperq.transcribe", (), {}, {"priority": 9}) == {"queue": "whisperq.prepare:high"}
    assert sqs_router("whisperq.sweep", (), {}, {"priority": 9}) == {"queue": "whisperq.prepare:high"}
    assert sqs_router("other.task", (), {}, {}) is None


def test_names_are_kombus(tmp_path):
    """config.celeryconfig.sqs_name makes the names kombu's transport makes (tasks.broker.sqs declares
    the queues kombu then consumes)."""
    from kombu.transport import SQS

    from config import Settings
    from config.celeryconfig import DEAD_LETTER_QUEUE, sqs_name, sqs_queues

    settings = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_SQS_QUEUE_PREFIX": "a_b-"})
    for queue in [*sqs_queues(settings), DEAD_LETTER_QUEUE, "odd.name:with@all#sorts"]:
        assert sqs_name(settings, queue) == SQS.Channel.entity_name(None, "a_b-" + queue)


def test_the_webhook_backoff_cap_is_models(tmp_path):
    from config.celeryconfig import WEBHOOK_BACKOFF_CAP
    from models.retry import WEBHOOK_BACKOFF_CAP_SECONDS

    assert WEBHOOK_BACKOFF_CAP == WEBHOOK_BACKOFF_CAP_SECONDS


def test_what_needs_broadcast_says_so_on_sqs(tmp_path):
    """No broadcast on SQS: Flower refuses to start saying why, `whisperq run` leaves it out,
    and the sweeper asks no worker what it holds (holdings is empty at once)."""
    from config import ConfigError, Settings
    from config.flower import flower_command
    from tasks.app import celery_for
    from tasks.broker.transport import transport_for
    from web.supervise import wanted

    settings = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "CELERY_BROKER_URL": "sqs://"})
    with pytest.raises(ConfigError, match="SQS carries neither"):
        flower_command(settings, {})
    processes = [("web", "gunicorn"), ("flower", "whisperq flower"), ("beat", "celery beat")]
    assert wanted(processes, {"CELERY_BROKER_URL": "sqs://"}) == ([processes[0], processes[2]], ["flower"])
    assert wanted(processes, {"CELERY_BROKER_URL": "redis://x"}) == (processes, [])
    assert transport_for(celery_for(settings)).holdings() == {}
    assert celery_for(settings).conf.worker_send_task_events is False
