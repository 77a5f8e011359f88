"""`whisperq flower`: auth required off loopback, credentials kept out of argv, the
RabbitMQ management API derived from the broker URL. Flower's API with and without the
password is checked end to end in test_run.py."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, Settings
from config.flower import broker_api, flower_command, is_loopback

WHISPERQ = str(Path(sys.executable).parent / "whisperq")


def settings(tmp_path, **env):
    return Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), **env})


@pytest.mark.parametrize(
    "address, loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("", False),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("flower.example", False),
    ],
)
def test_loopback_addresses(address, loopback):
    assert is_loopback(address) is loopback


def test_basic_auth_is_validated_and_masked(tmp_path):
    s = settings(tmp_path, FLOWER_BASIC_AUTH="ops:s3cret-flower-pass, admin:other-flower-pass")
    assert s.flower_basic_auth == "ops:s3cret-flower-pass,admin:other-flower-pass"
    assert s.describe()["flower_basic_auth"] == "ops:***,admin:***"
    for bad in ("justauser", "ops:", ":pw", "a:b,,c:d"):
        with pytest.raises(ConfigError, match="FLOWER_BASIC_AUTH must be user:password"):
            settings(tmp_path, FLOWER_BASIC_AUTH=bad)


def test_credentials_go_through_the_environment_not_argv(tmp_path):
    s = settings(
        tmp_path,
        FLOWER_BASIC_AUTH="ops:s3cret-flower-pass",
        FLOWER_ADDRESS="0.0.0.0",
        FLOWER_PORT="5601",
        CELERY_BROKER_URL="amqp://app:pa%24s@rabbit.internal:5672/whisperq",
    )
    argv, env = flower_command(s, {"FLOWER_BROKER_API": "", "PATH": "/bin"})
    assert argv[1:] == [
        "-m",
        "celery",
        "-A",
        "tasks.worker",
        "flower",
        "--address=0.0.0.0",
        "--port=5601",
        "--max_tasks=10000",  # Flower's own 100,000 grew it by 50 MiB an hour in the soak, on and on
        "--persistent=True",
        f"--db={tmp_path.resolve() / 'flower.db'}",
    ]
    assert not [a for a in argv if "s3cret" in a or "pa%24s" in a]
    assert env["FLOWER_BASIC_AUTH"] == "ops:s3cret-flower-pass"
    assert env["FLOWER_BROKER_API"] == "http://app:pa%24s@rabbit.internal:15672/api/"


def test_broker_api_for_each_broker(tmp_path):
    assert broker_api(settings(tmp_path, CELERY_BROKER_URL="redis://127.0.0.1:6379/0")) is None
    assert (
        broker_api(settings(tmp_path, CELERY_BROKER_URL="amqp://127.0.0.1//"))
        == "http://guest:guest@127.0.0.1:15672/api/"
    )
    assert (
        broker_api(settings(tmp_path, CELERY_BROKER_URL="amqps://u:p@mq.example:5671//"))
        == "https://u:p@mq.example:15671/api/"
    )
    override = settings(
        tmp_path, CELERY_BROKER_URL="amqp://u:p@mq//", FLOWER_BROKER_API="https://u:p@mgmt.example/api/"
    )
    assert broker_api(override) == "https://u:p@mgmt.example/api/"
    # Redis: an inherited empty variable must not become an empty password for Flower.
    _, env = flower_command(
        settings(tmp_path, CELERY_BROKER_URL="redis://h:6379/0"), {"FLOWER_BASIC_AUTH": "", "FLOWER_BROKER_API": ""}
    )
    assert "FLOWER_BASIC_AUTH" not in env and "FLOWER_BROKER_API" not in env


def test_flower_refuses_a_network_address_without_auth(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}
    env.update(WHISPERQ_DATA_DIR=str(tmp_path), FLOWER_ADDRESS="0.0.0.0")
    out = subprocess.run([WHISPERQ, "flower"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "FLOWER_BASIC_AUTH is not set" in out.stderr and "FLOWER_ADDRESS=0.0.0.0" in out.stderr
    assert not (tmp_path / "flower.db").exists()


@pytest.mark.integration
@pytest.mark.brokers
def test_task_events_carry_no_transcript(client, worker, celery_app):
    """Flower shows what the task events carry: ids and references, never the transcript."""
    import threading

    from api import upload, wait_for_job
    from helpers import wait_until

    events: list[dict] = []
    ready = threading.Event()
    with celery_app.connection_for_read() as conn:
        receiver = celery_app.events.Receiver(conn, handlers={"*": events.append})

        def capture():
            ready.set()
            with contextlib.suppress(Exception):  # the connection closes under it at the end
                receiver.capture(limit=None, timeout=None, wakeup=False)

        thread = threading.Thread(target=capture, daemon=True)
        thread.start()
        assert ready.wait(5)

        def bound() -> bool:  # an event sent now is received: the receiver's queue is bound
            dispatcher.send("whisperq-test-bound")
            return any(e.get("type") == "whisperq-test-bound" for e in events)

        with celery_app.events.default_dispatcher() as dispatcher:
            wait_until(bound, 10, "the event receiver got none of the events sent to it")
        resp = upload(client)
        job_id = resp.get_json()["job_id"]
        done = wait_for_job(client, job_id)
        assert done["status"] == "COMPLETED"
        try:
            wait_until(
                lambda: any(e.get("type") == "task-succeeded" and e.get("uuid") == job_id for e in events),
                10,
                "no task-succeeded event",
            )
        finally:
            receiver.should_stop = True
    succeeded = [e for e in events if e.get("type") == "task-succeeded" and e.get("uuid") == job_id]
    assert succeeded, sorted({e.get("type") for e in events})
    words = [w for w in done["result"]["text"].split() if len(w) > 3]
    for event in events:
        shown = repr(event)
        assert not any(w in shown for w in words), event
