"""The MQTT bridge's limits, against the real Mosquitto on 127.0.0.1:1883: one client can make
the bridge neither keep a request bigger than a request may be (refused `too_large` as it
comes, its bytes dropped), nor hold more than WHISPERQ_MQTT_QUEUE requests (with that many it
reads no more, and the broker keeps the rest), and every request is answered, none dropped. The
shipped Mosquitto configuration's limits are checked on a Mosquitto of the test's own; and that
Mosquitto still keeps a Receive Maximum slot for each message too big for its subscriber, which
is why the bridge announces no MQTT v5 Maximum Packet Size."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from helpers import FIXTURES, need_service, wait_until
from mqtt_harness import FOX, MOSQUITTO, ROOT, bridges, check_result, forget_session

SHIPPED_CONF = ROOT / "deploy" / "mosquitto" / "whisperq.conf"


# --- without a broker ----------------------------------------------------------------------------


def test_the_queue_bound_is_a_setting_with_a_clear_error():
    from config import ConfigError
    from config.mqtt import MqttSettings

    base = {"WHISPERQ_MQTT_URL": "mqtt://h"}
    assert MqttSettings.from_env(base).queue == 100
    assert MqttSettings.from_env({**base, "WHISPERQ_MQTT_QUEUE": "7"}).queue == 7
    assert MqttSettings.from_env(base).describe()["queue"] == "100"
    for bad in ("0", "-1", "ten", "1.5", "65536"):
        with pytest.raises(ConfigError, match="WHISPERQ_MQTT_QUEUE"):
            MqttSettings.from_env({**base, "WHISPERQ_MQTT_QUEUE": bad})


def test_the_largest_packet_of_a_request_leaves_room_for_its_topic_and_properties():
    """MAX_PACKET (what the broker's max_packet_size must let through) leaves room, above the
    largest payload read_request takes, for the fixed header, the longest topic a client may
    use and the v5 properties a request may carry (response topic, correlation data)."""
    from models.delivery.mqtt_replies import MAX_CORRELATION, MAX_TOPIC
    from web.mqtt.requests import MAX_PACKET, MAX_PAYLOAD

    assert MAX_PACKET >= MAX_PAYLOAD + 5 + (2 + MAX_TOPIC) * 2 + 2 + (3 + MAX_CORRELATION) + 64
    assert MAX_PACKET <= 2 * MAX_PAYLOAD


def test_the_shipped_mosquitto_conf_bounds_packets_and_queues():
    from web.mqtt.requests import MAX_PACKET

    conf = _limits(SHIPPED_CONF)
    # Above the largest request (one the bridge would take is never cut by the broker) and well
    # above it, for replies (results carry the transcript); far below MQTT's 256 MiB.
    assert 64 * MAX_PACKET <= conf["max_packet_size"] <= 64 * 1024 * 1024
    assert 0 < conf["max_queued_messages"] <= 100_000 and 0 < conf["max_queued_bytes"] <= 1024**3
    assert 0 < conf["max_inflight_messages"] <= 100


def _limits(path: Path) -> dict[str, int]:
    found = {}
    for line in path.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) == 2 and words[0] in (
            "max_packet_size",
            "max_queued_messages",
            "max_queued_bytes",
            "max_inflight_messages",
        ):
            found[words[0]] = int(words[1])
    return found


# --- against Mosquitto ---------------------------------------------------------------------------


@pytest.fixture()
def bridge_alone(prefix, tmp_path, database):
    """The bridge without worker pools: enough for requests it refuses."""
    yield from bridges(prefix, tmp_path)


def peak_rss_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM), KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M).group(1))


def published(client, topic: str, payload: bytes, qos: int, properties=None) -> None:
    info = client.publish(topic, payload, qos=qos, properties=properties)
    info.wait_for_publish(10)
    assert info.is_published(), f"the listener could not publish to {topic}"


@pytest.mark.integration
def test_a_flood_bigger_than_the_queue_waits_at_the_broker_and_memory_stays_bounded(bridge_alone, listener, prefix):
    """400 requests of 60 KiB (24 MiB) at QoS 1, published as fast as the broker takes them, then
    a burst of 200 small ones at QoS 0 (which MQTT does not hold back), at a bridge whose
    WHISPERQ_MQTT_QUEUE is 5. Each request names a file that is not there, so the bridge takes
    each through the API's checks and refuses it. Every request gets exactly its own reply (none
    refused for want of room, none lost), the queue never held more than 5 (the bridge stopped
    reading instead), and the bridge's peak memory grew by far less than the flood."""
    bound, qos1, qos0 = 5, 400, 200
    bridged = bridge_alone(WHISPERQ_MQTT_QUEUE=str(bound)).start()
    topic = f"{prefix}/requests/alice"

    def request(name: str, size: int = 60 * 1024) -> bytes:  # padded with JSON's own white space
        body = json.dumps({"path": str(FIXTURES / f"no-such-{name}.flac"), "correlation_id": name})
        return body.encode().ljust(size)

    listener.send("alice", request("warm-up"))
    listener.wait_for(lambda: listener.replies("warm-up"), 30, "the warm-up's reply")
    before = peak_rss_kib(bridged.proc.pid)
    names = [f"q1-{n}" for n in range(qos1)] + [f"q0-{n}" for n in range(qos0)]
    for name in names[:qos1]:
        published(listener.client, topic, request(name), 1)
    sent = [listener.client.publish(topic, request(name, 0), qos=0) for name in names[qos1:]]  # at once
    for info in sent:
        info.wait_for_publish(10)
    listener.wait_for(lambda: all(listener.replies(n) for n in names), 300, "a reply to every request")
    grown = peak_rss_kib(bridged.proc.pid) - before
    for name in names:
        [reply] = listener.replies(name)
        assert reply["type"] == "error" and "there is no file" in reply["error"]["message"], reply
    bridged.stop()
    stats = re.search(
        r"at most (\d+) requests queued, WHISPERQ_MQTT_QUEUE \d+; waited for room (\d+) times", bridged.output()
    )
    assert stats is not None, bridged.output()[-3000:]
    print(f"bridge peak RSS before the flood {before} KiB, grown by {grown} KiB during it; {stats.group(0)}")
    assert int(stats.group(1)) <= bound
    assert int(stats.group(2)) >= 1  # the burst of QoS 0 at least filled the queue: it read no more until room
    assert grown < 8 * 1024, f"the bridge's peak memory grew by {grown} KiB under a 24 MiB flood"


@pytest.mark.integration
def test_oversized_requests_are_refused_as_they_come_and_the_next_gets_its_result(bridge, listener):
    """Requests of 1 MiB (16 times the limit), at QoS 1 and 0: each refused too_large on the
    requester's own topic, without taking the bridge down or holding it up; the request sent
    right after them gets its result."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    bridged = bridge().start()
    huge = [f"huge-{n}" for n in range(6)]
    for n, name in enumerate(huge):
        payload = json.dumps({"path": FOX, "correlation_id": name, "pad": "x" * (1 << 20)}).encode()
        correlated = Properties(PacketTypes.PUBLISH)  # what is not read cannot name its correlation_id
        correlated.CorrelationData = name.encode()
        published(listener.client, f"{listener.prefix}/requests/alice", payload, 1 if n % 2 == 0 else 0, correlated)
    listener.send("alice", {"path": FOX, "correlation_id": "normal"})
    check_result(listener.results(["normal"])["normal"], FOX)
    for name in huge:  # each answered (before "normal": the bridge answers in the order they came)
        [refused] = listener.replies(name)
        assert refused["type"] == "error" and refused["error"]["code"] == "too_large", refused
        assert "the limit is 64 KiB" in refused["error"]["message"]
    assert bridged.proc.poll() is None and "disconnected from the MQTT broker" not in bridged.output()
    assert "Traceback" not in bridged.output()


def _private_mosquitto(tmp_path: Path, extra: str) -> tuple[subprocess.Popen, int]:
    """A Mosquitto of the test's own on a free port of 127.0.0.1 (anonymous, no persistence)."""
    if shutil.which("mosquitto") is None:
        need_service("the mosquitto command, for a Mosquitto with the shipped configuration's limits")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nuser root\n{extra}")
    log = tmp_path / "mosquitto.log"
    broker = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=log.open("w"))

    def listening() -> bool:
        assert broker.poll() is None, f"the private Mosquitto exited:\n{log.read_text()}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    try:
        wait_until(listening, 20, f"the private Mosquitto did not listen on {port}")
    except AssertionError:
        broker.kill()
        raise
    return broker, port


def test_the_shipped_limits_disconnect_a_client_that_sends_too_big_a_packet(tmp_path):
    """Mosquitto with the limits of deploy/mosquitto/whisperq.conf: it tells MQTT v5 clients
    its max_packet_size when they connect, takes the largest request the bridge takes, and
    disconnects a client that sends a bigger packet (the message goes nowhere)."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from models.delivery.mqtt_replies import MAX_CORRELATION, MAX_TOPIC
    from web.mqtt.requests import MAX_PAYLOAD

    limits = _limits(SHIPPED_CONF)
    broker, port = _private_mosquitto(tmp_path, "".join(f"{k} {v}\n" for k, v in limits.items()))
    try:
        connected, gone, told = threading.Event(), threading.Event(), {}

        def on_connect(_c, _u, _flags, reason, properties) -> None:
            told["max"] = getattr(properties, "MaximumPacketSize", None)
            connected.set()

        def on_disconnect(_c, _u, _flags, reason, _properties) -> None:
            told["reason"] = reason
            gone.set()

        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="limits", protocol=mqtt.MQTTv5)
        client.on_connect, client.on_disconnect = on_connect, on_disconnect
        client.connect("127.0.0.1", port, keepalive=10)
        client.loop_start()
        try:
            assert connected.wait(10), "no CONNACK from the private Mosquitto"
            assert told["max"] == limits["max_packet_size"]
            # The largest request: the largest payload, a client name of 64, the longest reply topic
            # and correlation data.
            topic, largest = "whisperq/requests/" + "c" * 64, Properties(PacketTypes.PUBLISH)
            largest.ResponseTopic = ("whisperq/replies/" + "c" * 64 + "/" + "r" * MAX_TOPIC)[:MAX_TOPIC]
            largest.CorrelationData = b"k" * MAX_CORRELATION
            published(client, topic, b"x" * MAX_PAYLOAD, 1, largest)
            client.publish(topic, b"x" * (limits["max_packet_size"] + 1), qos=1)
            assert gone.wait(30), "Mosquitto took a packet bigger than its max_packet_size"
            assert told["reason"].is_failure, told["reason"]
            assert "disconnected due to oversize packet" in (tmp_path / "mosquitto.log").read_text()
        finally:
            client.loop_stop()
    finally:
        broker.terminate()
        broker.wait(10)


def test_mosquitto_keeps_a_receive_slot_for_each_message_too_big_for_its_subscriber(mosquitto, prefix):
    """Why the bridge announces no MQTT v5 Maximum Packet Size (web/mqtt/bridge.py): Mosquitto
    drops a QoS 1 message bigger than its subscriber's limit, as it should, but never gives
    back the Receive Maximum slot it took, so Receive Maximum such messages stop every QoS 1
    message to that subscriber until it reconnects. Should this fail, Mosquitto gives the slot
    back: the bridge may announce MAX_PACKET (web.mqtt.requests) on CONNECT."""
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    from web.mqtt.requests import MAX_PACKET

    topic, got, cond = f"{prefix}/requests/x", [], threading.Condition()

    def subscriber() -> mqtt.Client:
        subscribed = threading.Event()
        sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{prefix}-sub", protocol=mqtt.MQTTv5)
        sub.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        sub.on_subscribe = lambda *_: subscribed.set()

        def on_message(_c, _u, message) -> None:
            with cond:
                got.append(message.payload[:16])
                cond.notify_all()

        sub.on_message = on_message
        props = Properties(PacketTypes.CONNECT)
        props.MaximumPacketSize, props.ReceiveMaximum, props.SessionExpiryInterval = MAX_PACKET, 2, 60
        sub.connect(*MOSQUITTO, keepalive=10, clean_start=False, properties=props)
        sub.loop_start()
        assert subscribed.wait(10)
        return sub

    def wait_for(payload: bytes) -> None:
        with cond:
            assert cond.wait_for(lambda: payload in got, 10), f"{payload!r} never came; got {got}"

    sub = subscriber()
    pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"{prefix}-pub", protocol=mqtt.MQTTv5)
    pub.connect(*MOSQUITTO, keepalive=10)
    pub.loop_start()
    try:
        for _ in range(2):
            published(pub, topic, b"x" * (MAX_PACKET + 1), 1)
        published(pub, topic, b"after", 1)
        published(pub, topic, b"marker", 0)  # QoS 0 is not held back: it comes past a QoS 1 message held
        wait_for(b"marker")
        assert b"after" not in got, "Mosquitto gave the slots back: the bridge may announce its Maximum Packet Size"
        sub.disconnect()
        sub.loop_stop()
        sub = subscriber()  # a new connection, new slots: what was held comes
        wait_for(b"after")
    finally:
        sub.disconnect()
        sub.loop_stop()
        pub.disconnect()
        pub.loop_stop()
        forget_session(f"{prefix}-sub")
