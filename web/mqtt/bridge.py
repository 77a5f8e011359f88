"""The bridge's connection and threads (paho-mqtt 2.x).

- paho's network thread (`loop_start`) keeps the connection: it reconnects by itself with a
  backoff from 1 s doubling to 30 s, and sends again whatever QoS 1 message the broker had
  not acknowledged. The session is persistent (a fixed client id; clean_session/clean_start
  off, and on MQTT v5 a session expiry), so the broker keeps the subscription and the
  requests that arrive while the bridge is away.
- One thread takes the requests in the order they came and acknowledges each (manual acks,
  in the order the requests came) only once its job and what it is owed are in the database,
  or its error reply is out. A database or job queue that is away keeps the request
  unacknowledged and tried again.
- Bounded: at most WHISPERQ_MQTT_QUEUE requests wait between the two, each at most a
  request's size (a bigger one waits as its `too_large` refusal, its bytes dropped at once;
  the broker's max_packet_size bounds what is read). When the queue is full the network
  thread waits for room, so it reads nothing more and the broker keeps the rest: nothing is
  refused or dropped for want of room. That number is also the bridge's MQTT v5 Receive
  Maximum, which a broker that keeps to it never lets come to that (Mosquitto 2.0.11 does not
  keep to it once acknowledgements flow). Nothing the requests' thread does waits for the
  network thread (an error reply's PUBACK is looked for between requests), so the two cannot
  wait for each other; a requests' thread held up (a database away) for longer than the keep
  alive costs the connection, and the requests come again on the next.
- No MQTT v5 Maximum Packet Size is announced: Mosquitto (2.0.11 at least) drops a QoS 1
  message bigger than that for its subscriber but never gives back its Receive Maximum slot,
  so that many big requests would stop every request reaching the bridge until it reconnects
  (tests/test_mqtt_limits.py checks the broker still does).
- The main thread publishes what is owed (web.mqtt.replies) as jobs move, and on SIGTERM
  stops: the request being taken is finished, replies in flight get a few seconds, and what
  is not acknowledged stays with the broker (requests) or the database (replies) for next time.
"""

from __future__ import annotations

import json
import logging
import queue
import signal
import threading
import time
from collections import deque

from flask import Flask

from config.mqtt import MqttSettings
from models.delivery.mqtt_replies import record_request

from .replies import Replier
from .requests import MAX_PAYLOAD, Refused, read_request, too_large
from .submit import TRANSIENT, principal_for, resolve_keys, submit

log = logging.getLogger(__name__)

KEEPALIVE = 30
POLL_SECONDS = 0.5  # how often owed replies are looked at when nothing wakes the loop earlier
ERROR_REPLY_WAIT = 10.0  # an error reply's PUBACK is looked for this long before its request is acknowledged
DRAIN_SECONDS = 5.0


class Bridge:
    def __init__(self, app: Flask, mq: MqttSettings):
        import paho.mqtt.client as mqtt

        self.app, self.mq, self.rt = app, mq, app.extensions["whisperq"]
        self.keys = resolve_keys(self.rt, mq)
        self.stopping, self.wake, self.connected = threading.Event(), threading.Event(), threading.Event()
        # (connection, message, its refusal where it was refused as it came), in the order they came
        self.requests: queue.Queue = queue.Queue(maxsize=mq.queue)
        self.generation = 0  # connections made: a request of an earlier one is not acknowledged on a later one
        # Requests taken, to acknowledge in the order they came: (connection, message id, QoS, the PUBACK
        # of its error reply awaited first, if any, and until when; not the request itself, whose bytes
        # go once it is taken); only the requests' thread touches it.
        self.unacked: deque = deque()
        self.deepest = 0  # the most requests the queue held at once
        self.waits, self.waited = 0, 0.0  # how often, and for how long, the network thread waited for room
        self.v5 = mq.protocol == "5"
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=mq.client_id,
            protocol=mqtt.MQTTv5 if self.v5 else mqtt.MQTTv311,
            clean_session=None if self.v5 else False,
            manual_ack=True,
        )
        if mq.username is not None:
            self.client.username_pw_set(mq.username, mq.password)
        if mq.tls:
            self.client.tls_set(ca_certs=mq.ca_file)  # the system's CAs unless WHISPERQ_MQTT_CA; host name checked
        self.client.reconnect_delay_set(min_delay=1, max_delay=30)
        self.client.on_connect, self.client.on_disconnect = self._connected, self._disconnected
        self.client.on_subscribe, self.client.on_message = self._subscribed, self._received
        self.client.on_publish = self._published
        self.replies = Replier(app, lambda topic, message, correlation: self._send(topic, message, correlation).mid)

    # --- paho's callbacks (its network thread) ----------------------------------------------

    def _connected(self, client, _userdata, flags, reason, _properties) -> None:
        if reason.is_failure:
            log.error(
                "the MQTT broker %s refused the connection: %s (check WHISPERQ_MQTT_URL's user and password)",
                self.mq.describe()["broker"],
                reason,
            )
            return
        self.generation += 1
        self.connected.set()
        log.info(
            "connected to %s as %s (session %s)",
            self.mq.describe()["broker"],
            self.mq.client_id,
            "resumed" if flags.session_present else "new",
        )
        if self.v5:
            from paho.mqtt.subscribeoptions import SubscribeOptions

            # Retained messages are not requests: leave them out (MQTT 3.1.1 refuses them in read_request).
            client.subscribe(self.mq.request_topic, options=SubscribeOptions(qos=1, retainHandling=2))
        else:
            client.subscribe(self.mq.request_topic, qos=1)

    def _subscribed(self, _client, _userdata, _mid, reasons, _properties) -> None:
        if any(r.is_failure for r in reasons):
            log.error(
                "the MQTT broker refused the subscription to %s (%s); check its ACL for %s",
                self.mq.request_topic,
                ", ".join(str(r) for r in reasons),
                self.mq.client_id,
            )
        else:
            log.info("subscribed to %s; replies under %s/<client>", self.mq.request_topic, self.mq.reply_prefix)

    def _disconnected(self, _client, _userdata, _flags, reason, _properties) -> None:
        self.connected.clear()
        if getattr(reason, "value", None) == 0x8E:  # MQTT v5 "Session taken over"
            log.error(
                "another client connected with the client id %s and took this bridge's session: run exactly one "
                "bridge (or give each its own WHISPERQ_MQTT_CLIENT_ID and request topic)",
                self.mq.client_id,
            )
        elif not self.stopping.is_set():
            log.warning("disconnected from the MQTT broker (%s); reconnecting", reason)

    def _received(self, _client, _userdata, message) -> None:
        refused = None
        if len(message.payload) > MAX_PAYLOAD:  # it waits as its refusal: its bytes go now
            try:
                refused = too_large(self.mq, message.topic, message.payload, message.properties, bool(message.retain))
            except Exception:  # a bug must not end paho's network thread (it raises what a callback raised)
                log.exception("MQTT request on %s: reading its size failed", message.topic)
                refused = Refused(
                    "too_large",
                    f"the request is {len(message.payload)} bytes; the limit is {MAX_PAYLOAD // 1024} KiB",
                    self.mq.reply_topic(self.mq.client_of(message.topic) or ""),
                )
            message.payload = b""
        entry = (self.generation, message, refused)
        try:
            self.requests.put_nowait(entry)
        except queue.Full:  # wait for room, reading nothing more meanwhile: the broker keeps the rest
            since = time.monotonic()
            self.waits += 1
            if self.waits == 1 or self.waits % 100 == 0:
                log.warning(
                    "the MQTT bridge's queue is full (%d requests, WHISPERQ_MQTT_QUEUE): it reads no more "
                    "until there is room, the broker keeps the rest (%d times so far)",
                    self.mq.queue,
                    self.waits,
                )
            while True:
                try:
                    self.requests.put(entry, timeout=0.5)
                    break
                except queue.Full:
                    if self.stopping.is_set():
                        return  # not acknowledged: the broker sends it again next time
            self.waited += time.monotonic() - since
        self.deepest = max(self.deepest, self.requests.qsize())

    def _published(self, _client, _userdata, mid, reason, _properties) -> None:
        self.replies.acknowledged(mid, str(reason) if reason is not None and reason.is_failure else None)

    # --- publishing ---------------------------------------------------------------------------

    def _send(self, topic: str, message: dict, correlation_id: str | None):
        """Publish at QoS 1; paho queues it while the connection is down and sends it when it is back."""
        properties = None
        if self.v5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            properties = Properties(PacketTypes.PUBLISH)
            properties.ContentType, properties.PayloadFormatIndicator = "application/json", 1
            if correlation_id is not None:
                properties.CorrelationData = correlation_id.encode()
        return self.client.publish(topic, json.dumps(message).encode(), qos=1, properties=properties)

    def _refuse(self, refused: Refused):
        """Send the error reply; its request is acknowledged once the broker has it (`_acknowledge`)."""
        return self._send(refused.reply_topic, refused.reply(), refused.correlation_id)

    # --- requests (their own thread) ------------------------------------------------------------

    def _take_requests(self) -> None:
        while not self.stopping.is_set():
            self._acknowledge()
            try:
                generation, message, refused = self.requests.get(timeout=0.05 if self.unacked else 0.5)
            except queue.Empty:
                continue
            done = self._handle(message, refused)
            if done is not False:
                self.unacked.append(
                    (
                        generation,
                        message.mid,
                        message.qos,
                        None if done is True else done,
                        time.monotonic() + ERROR_REPLY_WAIT,
                    )
                )
            del message
        deadline = time.monotonic() + 2.0  # stopping: error replies on their way get a moment
        while self.unacked and self.connected.is_set() and time.monotonic() < deadline:
            self._acknowledge()
            time.sleep(0.02)

    def _acknowledge(self) -> None:
        """Acknowledge the requests taken, in the order they came, each once its error reply (if
        any) has reached the broker, or has had ERROR_REPLY_WAIT to."""
        while self.unacked:
            generation, mid, qos, reply, until = self.unacked[0]
            if reply is not None and generation == self.generation and time.monotonic() < until:
                try:
                    if not reply.is_published():
                        return
                except (RuntimeError, ValueError):  # not sent yet: the connection is down
                    return
            self.unacked.popleft()
            if qos > 0 and generation == self.generation and self.connected.is_set():
                self.client.ack(mid, qos)
            # Else it came on an earlier connection: the broker delivers it again (found again, then acked).

    def _handle(self, message, refused: Refused | None = None):
        """Take one request: True once done, the PUBACK to wait for where it was refused, False if
        the bridge stopped before it could be taken."""
        if refused is not None:  # refused as it came (too large to keep)
            log.info("MQTT request on %s refused: %s", message.topic, refused.code)
            return self._refuse(refused)
        delay = 1.0
        while not self.stopping.is_set():
            try:
                req = read_request(self.mq, message.topic, message.payload, message.properties, bool(message.retain))
                job, created = submit(self.app, req, principal_for(self.rt, self.keys, req))
                record_request(self.rt, req.client, req.correlation_id, job.id, req.reply_topic)
                log.info("job %s %s for MQTT client %s", job.id, "submitted" if created else "found again", req.client)
                self.wake.set()
                return True
            except Refused as refusal:
                log.info("MQTT request on %s refused: %s", message.topic, refusal.code)
                return self._refuse(refusal)
            except TRANSIENT as exc:
                log.warning(
                    "MQTT request on %s not taken now (%s: %s); trying again in %.0f s",
                    message.topic,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                if self.stopping.wait(delay):
                    return False
                delay = min(delay * 2, 30.0)
            except Exception:  # a bug must not stop every request behind this one
                log.exception("MQTT request on %s failed", message.topic)
                client = self.mq.client_of(message.topic) or ""
                return self._refuse(
                    Refused(
                        "internal_error",
                        "the bridge hit an unexpected error; it has been logged",
                        self.mq.reply_topic(client),
                    )
                )
        return False

    # --- the process ------------------------------------------------------------------------------

    def stop(self, *_args) -> None:
        self.stopping.set()
        self.wake.set()

    def run(self) -> int:
        """Until SIGTERM or SIGINT; the exit status."""
        import paho.mqtt.client as mqtt

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.stop)
        properties = None
        if self.v5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            properties = Properties(PacketTypes.CONNECT)
            properties.SessionExpiryInterval = self.mq.session_expiry_seconds
            properties.ReceiveMaximum = self.mq.queue  # no more unacknowledged QoS 1 requests than the queue holds
        self.client.connect_async(
            self.mq.host,
            self.mq.port,
            keepalive=KEEPALIVE,
            clean_start=False if self.v5 else mqtt.MQTT_CLEAN_START_FIRST_ONLY,
            properties=properties,
        )
        self.client.loop_start()
        worker = threading.Thread(target=self._take_requests, name="mqtt-requests", daemon=True)
        worker.start()
        log.info("MQTT bridge started: %s", ", ".join(f"{k} {v}" for k, v in self.mq.describe().items() if v))
        while not self.stopping.is_set():
            try:
                self.replies.tick()
            except Exception as exc:  # the database away: what is owed stays owed
                log.warning("replies not published now (%s: %s)", type(exc).__name__, exc)
                self.stopping.wait(2.0)
            self.wake.wait(POLL_SECONDS)
            self.wake.clear()
        worker.join(ERROR_REPLY_WAIT + 5)
        deadline = time.monotonic() + DRAIN_SECONDS
        while self.replies.pending and self.connected.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
            self.replies.record_acknowledgements()
        self.replies.record_acknowledgements()
        self.client.disconnect()
        self.client.loop_stop()
        log.info(
            "MQTT bridge stopped (%d replies in flight left for next time; at most %d requests queued, "
            "WHISPERQ_MQTT_QUEUE %d; waited for room %d times, %.1f s in all)",
            self.replies.pending,
            self.deepest,
            self.mq.queue,
            self.waits,
            self.waited,
        )
        return 0
