"""A job submitted by a producer that is not Celery: the message of docs/messages (checked
against its JSON schema) written with a plain broker client, redis-py or pika."""

import base64
import json
import uuid
from pathlib import Path

import pytest
from api import wait_for_job
from helpers import CLIPS, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.brokers]

SCHEMA = json.loads((ROOT / "docs" / "messages" / "transcribe.v1.schema.json").read_text())
STEPS = {"high": 0, "normal": 3, "low": 6}  # Redis: the priority sub-list of each tier
AMQP = {"high": 9, "normal": 5, "low": 1}  # RabbitMQ: the message priority of each tier


def message(job_id: str, audio: str, **options) -> dict:
    """The message as docs/producers.md writes it, in any language."""
    message = envelope("whisperq.transcribe", job_id, [audio], options)
    import jsonschema

    jsonschema.validate(message, SCHEMA)
    return message


def envelope(task: str, job_id: str, args: list, kwargs: dict, headers: dict | None = None) -> dict:
    """Any task's message in Celery's protocol 2, as a plain client writes it."""
    return {
        "headers": {
            "lang": "py",
            "task": task,
            "id": job_id,
            "root_id": job_id,
            "parent_id": None,
            "group": None,
            "retries": 0,
            "eta": None,
            "expires": None,
            "origin": "a-producer-in-another-language",
            **(headers or {}),
        },
        "body": [args, kwargs, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}],
    }


def send_redis(url: str, msg: dict, priority: str, pool: str = "prepare") -> None:
    import redis

    envelope = {
        "body": base64.b64encode(json.dumps(msg["body"]).encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": msg["headers"],
        "properties": {
            "correlation_id": msg["headers"]["id"],
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "whisperq", "routing_key": pool},
            "priority": STEPS[priority],
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    queue = f"whisperq.{pool}" + (f":{STEPS[priority]}" if STEPS[priority] else "")
    client = redis.Redis.from_url(url)
    client.lpush(queue, json.dumps(envelope))
    client.close()


def send_amqp(url: str, msg: dict, priority: str, pool: str = "prepare") -> None:
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        exchange="whisperq",
        routing_key=pool,
        body=json.dumps(msg["body"]).encode(),
        mandatory=True,
        properties=pika.BasicProperties(
            content_type="application/json",
            content_encoding="utf-8",
            headers=msg["headers"],
            correlation_id=msg["headers"]["id"],
            delivery_mode=2,
            priority=AMQP[priority],
        ),
    )
    connection.close()


def send(settings, msg: dict, priority: str = "normal", pool: str = "prepare") -> None:
    """`msg` written to the queue of `pool` (whisperq.<pool>) with the broker's plain client."""
    url = settings.broker_url
    if url.startswith("redis"):
        send_redis(url, msg, priority, pool)
    elif url.startswith(("amqp", "pyamqp")):
        url = url.replace("pyamqp://", "amqp://")
        send_amqp(url[:-2] + "/%2F" if url.endswith("//") else url, msg, priority, pool)  # pika spells vhost / as %2F
    else:
        pytest.skip(f"no plain client for a {url.split('://')[0]} broker")


def test_a_job_written_by_a_plain_broker_client_completes(client, worker, settings):
    job_id = str(uuid.uuid4())
    send(
        settings,
        message(
            job_id,
            str(CLIPS["fox.flac"]["path"]),
            language="en",
            priority="high",
            word_timestamps=True,
            prompt="A fox.",
            temperature=0.0,
        ),
        priority="high",
    )
    job = wait_for_job(client, job_id, timeout=180)
    assert job["status"] == "COMPLETED", job
    assert job["priority"] == "high" and "fox" in job["result"]["text"].lower()
    assert job["result"]["segments"][0]["words"]


def test_a_bad_option_in_a_plain_message_fails_the_job_saying_why(client, worker, settings):
    job_id = str(uuid.uuid4())
    msg = message(job_id, str(CLIPS["fox.flac"]["path"]), language="en")
    msg["body"][1]["temperature"] = 7  # what the schema refuses; a producer may still send it
    send(settings, msg)
    job = wait_for_job(client, job_id, timeout=180)
    assert job["status"] == "FAILED" and "temperature must be a number from 0 to 1" in job["error"], job
    assert job["attempts"] in (0, 1)  # refused at once, never retried
    # an option no door declares (models.pipeline.request): refused by name, not ignored
    unknown_id = str(uuid.uuid4())
    msg = message(unknown_id, str(CLIPS["fox.flac"]["path"]), language="en")
    msg["body"][1]["diarise"] = True
    send(settings, msg)
    job = wait_for_job(client, unknown_id, timeout=180)
    assert job["status"] == "FAILED" and "unknown option(s) 'diarise'" in job["error"], job


def test_the_schema_refuses_what_the_worker_would_refuse():
    import jsonschema

    good = message(str(uuid.uuid4()), "/srv/audio/call.wav", priority="low")
    for broken in ({"priority": "urgent"}, {"temperature": 2}, {"speed": "fast"}, {"word_timestamps": "yes"}):
        bad = json.loads(json.dumps(good))
        bad["body"][1].update(broken)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, SCHEMA)
    relative = json.loads(json.dumps(good))
    relative["body"][0] = ["call.wav"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(relative, SCHEMA)
    assert Path(ROOT / "docs" / "producers.md").read_text().count("whisperq.prepare") >= 2
