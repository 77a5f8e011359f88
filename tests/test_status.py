"""`whisperq status`: what an operator looks at first, from heartbeats, broker and database."""

import json
import os
import time

import pytest
from api import upload

pytestmark = [pytest.mark.integration, pytest.mark.brokers]


def test_status_shows_workers_queues_and_dead_letters(client, runner, worker, celery_app):
    from web.cli import cli

    deadline = time.monotonic() + 30
    while True:  # the heartbeat comes within WHISPERQ's 10 s interval of the worker's start
        report = json.loads(runner.invoke(cli, ["status", "--json"]).output)
        if {"prepare", "inference", "notify"} <= {w["pool"] for w in report["workers"]} or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert {"prepare", "inference", "notify"} <= {w["pool"] for w in report["workers"]}, report["workers"]
    assert all(w["last_seen_seconds"] < 30 for w in report["workers"])
    with worker.paused(celery_app):
        for _ in range(2):
            resp = upload(client, filename="f.flac", priority="low")
            assert resp.status_code == 202, resp.get_json()
        report = json.loads(runner.invoke(cli, ["status", "--json"]).output)
        text = runner.invoke(cli, ["status"]).output
        # the same report over the admin API, which works on every broker (SQS has no Flower)
        admin = {"Authorization": f"Bearer {os.environ['WHISPERQ_ADMIN_TOKEN']}"}
        over_http = client.get("/v1/admin/status", headers=admin)
        anonymous = client.get("/v1/admin/status")
    assert report["queues"]["whisperq.prepare"]["waiting"] >= 2, report
    assert report["queues"]["whisperq.prepare"]["oldest_seconds"] >= 0
    assert isinstance(report["dead_letters"], int)
    assert "whisperq.prepare" in text and "inference" in text and "dead letters" in text
    assert over_http.status_code == 200 and anonymous.status_code == 401
    body = over_http.get_json()
    assert body["queues"]["whisperq.prepare"]["waiting"] >= 2 and body["transport"] in ("redis", "amqp")
    assert {"prepare", "inference"} <= set(body["pools"]) and body["pools"]["inference"]["models"] == ["tiny.en"]


def test_workers_are_shown_by_host_with_its_disk_and_memory(client, runner, worker):
    import socket

    from web.cli import cli

    host = socket.gethostname()
    deadline = time.monotonic() + 30
    while True:
        hosts = json.loads(runner.invoke(cli, ["status", "--json"]).output)["hosts"]
        if {"prepare", "inference", "notify"} <= set(
            hosts.get(host, {}).get("workers", {})
        ) or time.monotonic() > deadline:
            break
        time.sleep(1)
    mine = hosts[host]
    assert {"prepare", "inference", "notify"} <= set(mine["workers"]) and "tiny.en" in mine["models"]
    assert mine["disk_free_bytes"] > 0 and mine["memory_available_bytes"] > 0
    assert f"host {host}" in runner.invoke(cli, ["status"]).output
    ready = client.get("/readyz").get_json()
    assert ready["hosts"][host]["workers"]["inference"] >= 1 and ready["hosts"][host]["disk"] == "ok", ready
    metrics = client.get("/metrics").get_data(as_text=True)
    assert f'whisperq_host_workers{{host="{host}",pool="inference"}}' in metrics
    assert f'whisperq_host_disk_free_bytes{{host="{host}"}}' in metrics
    assert f'whisperq_host_memory_available_bytes{{host="{host}"}}' in metrics
