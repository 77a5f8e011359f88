"""The MQTT harness the bridge's tests share (tests/test_mqtt.py, tests/test_mqtt_limits.py): the
local Mosquitto, a fresh topic prefix per test, a listening and publishing MQTT v5 client, the
bridge as its own process (`whisperq mqtt`), what the jobs' rows and owed replies count, and a
Mosquitto that may be stopped and started again. conftest.py loads its fixtures: mosquitto,
prefix, listener, bridge, restartable_mosquitto."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from helpers import CLIPS, FIXTURES, need_service, wait_until, word_error_rate

ROOT = Path(__file__).resolve().parent.parent
MOSQUITTO = ("127.0.0.1", 1883)
MOSQUITTO_CONF = Path("/etc/mosquitto/mosquitto.conf")
FOX, REPORT = str(FIXTURES / "fox.flac"), str(FIXTURES / "report.opus")
TEXTS = {FOX: CLIPS["fox.flac"]["text"], REPORT: CLIPS["report.opus"]["text"]}


def mosquitto_up(timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(MOSQUITTO, timeout=timeout):
            return True
    except OSError:
        return False


@pytest.fixture()
def mosquitto():
    if not mosquitto_up():
        need_service(f"Mosquitto on {MOSQUITTO[0]}:{MOSQUITTO[1]} is unreachable")
    return MOSQUITTO


@pytest.fixture()
def prefix(mosquitto):
    return f"wqtest-{uuid.uuid4().hex[:10]}"


class Listener:
    """An MQTT v5 client on a persistent session (so it misses nothing while Mosquitto
    restarts) that reads every reply under PREFIX/replies/#, and publishes requests."""

    def __init__(
        self,
        prefix: str,
        address=MOSQUITTO,
        user: tuple[str, str] | None = None,
        reading: str | None = None,
        ca: str | None = None,
    ):
        import paho.mqtt.client as mqtt
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.prefix, self.address, self.messages, self.cond = prefix, address, [], threading.Condition()
        self.client_id = f"{prefix}-{user[0] if user else 'listener'}"
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, protocol=mqtt.MQTTv5)
        if user is not None:
            self.client.username_pw_set(*user)
        if ca is not None:
            self.client.tls_set(ca_certs=ca)
        self.client.reconnect_delay_set(1, 2)
        self.client.on_connect = lambda c, *_: c.subscribe(reading or f"{prefix}/replies/#", qos=1)
        self.subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_message = self._received
        expiry = Properties(PacketTypes.CONNECT)
        expiry.SessionExpiryInterval = 600 if address == MOSQUITTO else 0
        self.client.connect(*address, keepalive=10, clean_start=False, properties=expiry)
        self.client.loop_start()
        assert self.subscribed.wait(10), "the listener's subscription was not acknowledged"

    def _received(self, _client, _userdata, message) -> None:
        correlation = getattr(message.properties, "CorrelationData", None)
        with self.cond:
            self.messages.append((message.topic, json.loads(message.payload), correlation))
            self.cond.notify_all()

    def send(self, client: str, payload, properties: dict | None = None) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = None
        if properties:
            props = Properties(PacketTypes.PUBLISH)
            for name, value in properties.items():
                setattr(props, name, value)
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        # back from a broker restart: paho reconnects by itself
        wait_until(self.client.is_connected, 30, "the listener did not reconnect to Mosquitto")
        info = self.client.publish(f"{self.prefix}/requests/{client}", data, qos=1, properties=props)
        info.wait_for_publish(10)

    def replies(self, correlation_id: str | None = None, kind: str | None = None) -> list[dict]:
        with self.cond:
            return [
                m
                for _t, m, _c in self.messages
                if (correlation_id is None or m.get("correlation_id") == correlation_id)
                and (kind is None or m["type"] == kind)
            ]

    def wait_for(self, check, timeout: float = 120.0, what: str = "replies"):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not check():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} within {timeout} s; got {json.dumps(self.messages)[:3000]}")
                self.cond.wait(min(left, 0.5))

    def results(self, correlation_ids, timeout: float = 180.0) -> dict[str, dict]:
        self.wait_for(
            lambda: all(self.replies(c, "result") for c in correlation_ids),
            timeout,
            f"results for all of {sorted(correlation_ids)}",
        )
        return {c: self.replies(c, "result")[0] for c in correlation_ids}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        if self.address == MOSQUITTO:
            forget_session(self.client_id)


def forget_session(client_id: str) -> None:
    """Connect once with a clean start and no expiry, so Mosquitto drops the session."""
    import paho.mqtt.client as mqtt

    if not mosquitto_up():
        return
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    try:
        client.connect(*MOSQUITTO, keepalive=10, clean_start=True)
        client.loop_start()
        wait_until(client.is_connected, 10, "no connection to Mosquitto to drop the session with")
        client.disconnect()
        client.loop_stop()
    except OSError:
        pass


class BridgeProcess:
    """`whisperq mqtt` as its own process, on this suite's database, broker and data dir."""

    def __init__(self, prefix: str, tmp: Path, **env: str):
        self.prefix, self.tmp, self.starts, self.proc = prefix, tmp, 0, None
        self.env = dict(
            os.environ,
            WHISPERQ_MQTT_URL=f"mqtt://{MOSQUITTO[0]}:{MOSQUITTO[1]}",
            WHISPERQ_MQTT_CLIENT_ID=f"{prefix}-bridge",
            WHISPERQ_MQTT_REQUEST_TOPIC=f"{prefix}/requests/+",
            WHISPERQ_MQTT_REPLY_PREFIX=f"{prefix}/replies",
            WHISPERQ_MQTT_SESSION_EXPIRY="10m",
            WHISPERQ_LOG_FORMAT="text",
        )
        self.env.update(env)

    @property
    def log(self) -> Path:
        return self.tmp / f"bridge-{self.starts}.log"

    def start(self, wait: bool = True) -> BridgeProcess:
        self.starts += 1
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("whisperq")), "mqtt"],
            cwd=ROOT,
            env=self.env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        if wait:
            self.wait_for_line("subscribed to", 60)
        return self

    def wait_for_line(self, text: str, timeout: float) -> None:
        def seen() -> bool:
            if self.proc.poll() is not None and text not in self.output():
                raise AssertionError(f"the bridge exited with {self.proc.returncode}:\n{self.output()}")
            return text in self.output()

        try:
            wait_until(seen, timeout, f"no {text!r} in the bridge's log")
        except AssertionError:
            raise AssertionError(f"the bridge did not log {text!r} within {timeout} s:\n{self.output()}") from None

    def output(self) -> str:
        return "\n".join((self.tmp / f"bridge-{n}.log").read_text(errors="replace") for n in range(1, self.starts + 1))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                assert self.proc.wait(30) == 0, self.output()
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"the bridge did not stop on SIGTERM within 30 s:\n{self.output()}") from None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture()
def listener(prefix):
    found = Listener(prefix)
    yield found
    found.close()


def bridges(prefix: str, tmp_path):
    """Start bridges with `make(**env)`; each still running is killed, and the bridge's
    session forgotten, when the test ends (a fixture's body: `yield from bridges(...)`)."""
    made: list[BridgeProcess] = []

    def make(**env: str) -> BridgeProcess:
        made.append(BridgeProcess(prefix, tmp_path, **env))
        return made[-1]

    yield make
    for one in made:
        if one.proc is not None and one.proc.poll() is None:
            one.kill()
    forget_session(f"{prefix}-bridge")


@pytest.fixture()
def bridge(prefix, tmp_path, worker):
    yield from bridges(prefix, tmp_path)


def job_rows(settings) -> int:
    from sqlalchemy import func, select

    from models.db import Database
    from models.jobs.record import Job

    db = Database(settings.database_url)
    try:
        with db.session() as session:
            return session.scalar(select(func.count()).select_from(Job))
    finally:
        db.dispose()


def replies_owed(settings) -> int:
    from models.db import Database
    from models.delivery.mqtt_replies import MqttReply

    db = Database(settings.database_url)
    try:
        with db.session() as session:
            return session.query(MqttReply).count()
    finally:
        db.dispose()


def check_result(result: dict, path: str) -> dict:
    assert result["status"] == "COMPLETED", result
    job = result["job"]
    assert job["job_id"] == result["job_id"] and job["status"] == "COMPLETED"
    assert word_error_rate(TEXTS[path], job["result"]["text"]) <= 0.05, job["result"]["text"]
    return job


# --- restarts -----------------------------------------------------------------------------------


def _mosquitto_pid() -> int:
    found = subprocess.run(["pgrep", "-x", "mosquitto"], capture_output=True, text=True).stdout.split()
    if len(found) != 1:
        need_service(f"one local mosquitto process to restart (found {len(found)})")
    return int(found[0])


def _start_mosquitto() -> None:
    if not mosquitto_up():
        subprocess.run(["mosquitto", "-d", "-c", str(MOSQUITTO_CONF)], check=True, timeout=30)
    wait_until(lambda: mosquitto_up(0.5), 30, "Mosquitto did not come back")


@pytest.fixture()
def restartable_mosquitto(mosquitto):
    """Stops Mosquitto (SIGTERM: it saves its sessions and queued messages, persistence being
    on) and starts it again as it was started; it is running again after the test, always."""
    if shutil.which("mosquitto") is None or not MOSQUITTO_CONF.exists():
        need_service(f"the mosquitto command and {MOSQUITTO_CONF}, to restart the broker")
    conf = MOSQUITTO_CONF.read_text().split()
    if "persistence" not in conf or conf[conf.index("persistence") + 1] != "true":
        need_service(f"{MOSQUITTO_CONF} with persistence true (a restart without it drops every session)")
    _mosquitto_pid()

    def restart(down: float = 3.0, during=None) -> None:
        pid = _mosquitto_pid()
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not Path(f"/proc/{pid}").exists(), 30, "Mosquitto did not stop")
        try:
            time.sleep(down)  # the outage itself, as long as asked: not a wait for an event
            if during is not None:
                during()
        finally:
            _start_mosquitto()

    try:
        yield restart
    finally:
        _start_mosquitto()
