"""The MQTT bridge (`whisperq mqtt`) against the real Mosquitto on 127.0.0.1:1883, with the
real worker pools and real audio: requests in, status changes and results out on the
requesting client's reply topic; bad requests answered with what to fix and no job; a
request sent twice makes one job; and nothing is lost while Mosquitto restarts, the bridge is
away or killed. Each test uses topics of its own (a fresh prefix), and the bridge runs as its
own process, as the Procfile's `mqtt` line does. The settings, the request reading and the
Procfile's optional line are checked without a broker."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import pytest
from helpers import FIXTURES, Receiver, need_service, self_signed, wait_until
from mqtt_harness import FOX, REPORT, ROOT, Listener, check_result, job_rows, replies_owed

# --- without a broker ----------------------------------------------------------------------------


def test_settings_from_the_environment():
    from config import ConfigError
    from config.mqtt import MqttSettings, configured

    mq = MqttSettings.from_env(
        {"WHISPERQ_MQTT_URL": "mqtts://bridge:p%40ss@mqtt.internal", "WHISPERQ_MQTT_CLIENTS": "billing=3f0c, *=9a1b"}
    )
    assert (mq.host, mq.port, mq.tls, mq.username, mq.password) == ("mqtt.internal", 8883, True, "bridge", "p@ss")
    assert (mq.client_id, mq.request_topic, mq.reply_prefix, mq.protocol) == (
        "whisperq-bridge",
        "whisperq/requests/+",
        "whisperq/replies",
        "5",
    )
    assert mq.clients == (("billing", "3f0c"), ("*", "9a1b"))
    assert mq.client_of("whisperq/requests/billing") == "billing" and mq.client_of("whisperq/other/billing") is None
    assert (
        "p@ss" not in json.dumps(mq.describe()) and mq.describe()["broker"] == "mqtts://bridge:***@mqtt.internal:8883"
    )
    assert MqttSettings.from_env({"WHISPERQ_MQTT_URL": "mqtt://127.0.0.1"}).port == 1883
    assert configured({"WHISPERQ_MQTT_URL": "mqtt://h"}) and not configured({"WHISPERQ_MQTT_URL": " "})
    for env, named in [
        ({}, "WHISPERQ_MQTT_URL is not set"),
        ({"WHISPERQ_MQTT_URL": "http://h"}, "WHISPERQ_MQTT_URL has scheme 'http'"),
        ({"WHISPERQ_MQTT_URL": "mqtt://h/x"}, "no path"),
        ({"WHISPERQ_MQTT_URL": "mqtt://h", "WHISPERQ_MQTT_REQUEST_TOPIC": "a/#"}, "exactly one '+'"),
        ({"WHISPERQ_MQTT_URL": "mqtt://h", "WHISPERQ_MQTT_REQUEST_TOPIC": "a/+/+"}, "exactly one '+'"),
        ({"WHISPERQ_MQTT_URL": "mqtt://h", "WHISPERQ_MQTT_REPLY_PREFIX": "r/+"}, "without wildcards"),
        ({"WHISPERQ_MQTT_URL": "mqtt://h", "WHISPERQ_MQTT_CLIENTS": "bad name=k"}, "NAME=KEY_ID"),
        ({"WHISPERQ_MQTT_URL": "mqtt://h", "WHISPERQ_MQTT_PROTOCOL": "4"}, "WHISPERQ_MQTT_PROTOCOL"),
    ]:
        with pytest.raises(ConfigError, match=named.replace("+", r"\+")):
            MqttSettings.from_env(env)


def test_a_request_is_read_with_its_reply_topic_and_correlation_id():
    from config.mqtt import MqttSettings
    from web.mqtt.requests import Refused, read_request

    mq = MqttSettings.from_env({"WHISPERQ_MQTT_URL": "mqtt://h"})
    req = read_request(
        mq,
        "whisperq/requests/alice",
        json.dumps(
            {"audio_ref": FOX, "correlation_id": "c1", "reply_to": "whisperq/replies/alice/calls", "language": "en"}
        ).encode(),
    )
    assert (req.client, req.correlation_id, req.reply_topic, req.source) == (
        "alice",
        "c1",
        "whisperq/replies/alice/calls",
        "path",
    )
    assert req.body == {"path": FOX, "language": "en"}

    class V5:  # MQTT v5's response topic and correlation data stand in for the payload's
        ResponseTopic, CorrelationData = "whisperq/replies/alice/x", b"c2"

    req = read_request(mq, "whisperq/requests/alice", b'{"audio_url": "https://example.com/a.mp3"}', V5())
    assert (req.correlation_id, req.reply_topic, req.source) == ("c2", "whisperq/replies/alice/x", "audio_url")

    def refused(payload, topic="whisperq/requests/alice", **kw) -> Refused:
        with pytest.raises(Refused) as caught:
            read_request(mq, topic, payload if isinstance(payload, bytes) else json.dumps(payload).encode(), **kw)
        return caught.value

    # Another client's topic is never a reply topic: the error goes to the requester's own.
    other = refused({"path": FOX, "correlation_id": "c", "reply_to": "whisperq/replies/bob"})
    assert (other.code, other.reply_topic) == ("forbidden", "whisperq/replies/alice") and "reply_to must be" in str(
        other
    )
    assert refused({"path": FOX, "correlation_id": "c", "reply_to": "whisperq/replies/alice2"}).code == "forbidden"
    assert "correlation_id is missing" in str(refused({"path": FOX}))
    assert "not JSON" in str(refused(b"\xff not json"))
    assert "exactly one of 'audio_url'" in str(
        refused({"path": FOX, "audio_url": "https://e.com/a", "correlation_id": "c"})
    )
    assert "unknown field(s) 'colour'" in str(refused({"path": FOX, "correlation_id": "c", "colour": "red"}))
    assert "must not be retained" in str(refused({"path": FOX, "correlation_id": "c"}, retained=True))
    assert refused(b"x" * (65 * 1024)).code == "too_large"
    assert (
        refused({"path": FOX, "correlation_id": "c"}, topic="whisperq/requests/b%20d").reply_topic
        == "whisperq/replies/b%20d"
    )


def test_the_procfile_line_runs_only_where_the_bridge_is_configured():
    from web.supervise import procfile_processes, wanted

    processes = procfile_processes(ROOT / "Procfile")
    assert ("mqtt", "whisperq mqtt") in processes
    run, left_out = wanted(processes, {})
    assert left_out == ["mqtt"] and "mqtt" not in dict(run) and {"web", "prepare", "inference"} <= set(dict(run))
    run, left_out = wanted(processes, {"WHISPERQ_MQTT_URL": "mqtt://127.0.0.1:1883"})
    assert left_out == [] and dict(run)["mqtt"] == "whisperq mqtt"


# --- against Mosquitto ---------------------------------------------------------------------------


@pytest.mark.integration
def test_requests_get_their_status_changes_and_results(bridge, listener, prefix, client, settings):
    """By path (a file under WHISPERQ_INPUT_DIRS), by audio_url (a local HTTP server, through the
    fetch guard), and with MQTT v5's response topic and correlation data instead of fields."""
    bridge().start()
    fox = (FIXTURES / "fox.flac").read_bytes()
    with Receiver({"/fox.flac": (200, {"Content-Type": "audio/flac"}, fox)}) as receiver:
        listener.send("alice", {"path": FOX, "correlation_id": "by-path", "language": "en", "word_timestamps": True})
        listener.send(
            "alice",
            {
                "audio_url": receiver.url("/fox.flac"),
                "correlation_id": "by-url",
                "reply_to": f"{prefix}/replies/alice/calls",
                "priority": "high",
            },
        )
        listener.send(
            "bob",
            {"audio_ref": REPORT, "temperature": 0},
            properties={"ResponseTopic": f"{prefix}/replies/bob/v5", "CorrelationData": b"by-v5"},
        )
        results = listener.results(["by-path", "by-url", "by-v5"])
    for correlation, path in (("by-path", FOX), ("by-url", FOX), ("by-v5", REPORT)):
        job = check_result(results[correlation], path)
        # The result is the job as GET /v1/jobs/<id> shows it, transcript and all.
        shown = client.get(f"/v1/jobs/{job['job_id']}").get_json()
        assert {k: v for k, v in job.items() if not k.endswith("_url") and k != "transcript_urls"} == {
            k: v for k, v in shown.items() if not k.endswith("_url") and k != "transcript_urls"
        }
        # Status changes came first: every message but the last is a status, the last the result.
        messages = listener.replies(correlation)
        assert [m["type"] for m in messages][-1] == "result" and len(messages) >= 2, messages
        assert all(m["type"] == "status" and m["job_id"] == job["job_id"] for m in messages[:-1]), messages
        assert messages[0]["status"] in ("PENDING", "PROCESSING")
    assert results["by-path"]["job"]["word_timestamps"] is True
    assert results["by-path"]["job"]["result"]["segments"][0]["words"]
    assert results["by-url"]["job"]["priority"] == "high" and results["by-url"]["job"]["audio_url"].endswith(
        "/fox.flac"
    )
    topics = {m["correlation_id"]: (t, c) for t, m, c in listener.messages}
    assert topics["by-path"] == (f"{prefix}/replies/alice", b"by-path")
    assert topics["by-url"] == (f"{prefix}/replies/alice/calls", b"by-url")
    assert topics["by-v5"] == (f"{prefix}/replies/bob/v5", b"by-v5")
    assert Path(FOX).exists() and Path(REPORT).exists()  # a caller's own files are read in place
    # the last replies' PUBACKs settle them
    wait_until(lambda: not replies_owed(settings), 10, "replies are still owed")


@pytest.mark.integration
def test_bad_requests_get_an_error_saying_what_to_fix_and_make_no_job(bridge, listener, prefix, settings, tmp_path):
    bridged = bridge().start()
    not_audio = Path(os.path.realpath(tmp_path)) / "notes.flac"  # under WHISPERQ_INPUT_DIRS (the temp dir)
    not_audio.write_text("these are not the droids you are looking for\n" * 20)
    before = job_rows(settings)
    bad = {
        "bad-json": (b"{not json", "not JSON"),
        "bad-language": ({"path": FOX, "language": "xx"}, "language 'xx' is not a Whisper language code"),
        "bad-priority": ({"path": FOX, "priority": "urgent"}, "priority 'urgent' is not one of"),
        "outside": ({"path": "/etc/hostname"}, "is outside your input directories"),
        "relative": ({"path": "fox.flac"}, "path must be the absolute path"),
        "missing": ({"path": str(FIXTURES / "no-such.flac")}, "there is no file"),
        "not-audio": ({"path": str(not_audio)}, "decoded"),
        "no-audio": ({"language": "en"}, "exactly one of 'audio_url'"),
        "bad-url": ({"audio_url": "ftp://example.com/a.mp3"}, "use an http:// or https:// URL"),
        "private-url": ({"audio_url": "http://10.1.2.3/a.mp3"}, "10.1.2.3"),
        "unknown": ({"path": FOX, "colour": "red"}, "unknown field(s) 'colour'"),
        "not-yours": ({"path": FOX, "reply_to": f"{prefix}/replies/bob"}, "reply_to must be"),
    }
    for correlation, (payload, _) in bad.items():
        if isinstance(payload, bytes):
            listener.send("alice", payload, properties={"CorrelationData": correlation.encode()})
        else:
            listener.send("alice", {**payload, "correlation_id": correlation})
    listener.send("alice", {"path": FOX})  # no correlation id at all
    listener.wait_for(lambda: len(listener.replies(kind="error")) == len(bad) + 1, 60, "an error for every request")
    for correlation, (_, says) in bad.items():
        [error] = listener.replies(correlation)
        assert error["type"] == "error" and says in error["error"]["message"], (correlation, error)
    [anonymous] = listener.replies(None, "error")[-1:]
    assert anonymous["correlation_id"] is None and "correlation_id is missing" in anonymous["error"]["message"]
    assert {t for t, _m, _c in listener.messages} == {f"{prefix}/replies/alice"}  # nothing on bob's topic
    assert listener.replies(None, "status") == [] and job_rows(settings) == before
    # Each was acknowledged: a restarted bridge is not handed them again.
    bridged.stop()
    bridged.start()
    # A request sent now is handed to the restarted bridge after any its session still held.
    listener.send("alice", {"path": FOX, "priority": "urgent", "correlation_id": "after-restart"})
    listener.wait_for(lambda: listener.replies("after-restart"), 60, "an answer after the restart")
    assert len(listener.replies(kind="error")) == len(bad) + 2
    assert job_rows(settings) == before


@pytest.mark.integration
def test_a_request_sent_twice_makes_one_job_owned_by_its_clients_key(bridge, listener, settings, database):
    """On MQTT 3.1.1, with keys required: the client's configured key owns the job; a client
    with no key is refused; the same correlation id for another request is a conflict."""
    from models.access.apikeys import create_key
    from models.runtime import Runtime

    record, _secret = create_key(Runtime(settings), name=f"mqtt-{uuid.uuid4().hex[:6]}", tier="standard")
    bridge(
        WHISPERQ_MQTT_PROTOCOL="3.1.1", WHISPERQ_ALLOW_ANONYMOUS="false", WHISPERQ_MQTT_CLIENTS=f"carol={record.id}"
    ).start()
    before = job_rows(settings)
    request = {"path": FOX, "correlation_id": "twice"}
    listener.send("carol", request)
    listener.send("carol", request)
    listener.send("carol", {"path": REPORT, "correlation_id": "twice"})  # the same id, another request
    listener.send("dave", {"path": FOX, "correlation_id": "no-key"})
    listener.wait_for(
        lambda: listener.replies("twice", "result") and listener.replies("no-key"),
        120,
        "the result, and the refusal of the client without a key",
    )
    job = check_result(listener.replies("twice", "result")[0], FOX)
    assert job["priority"] == "normal"  # the standard tier's default
    from models.jobs.operations import get_job

    assert get_job(Runtime(settings), job["job_id"]).owner == record.id
    [conflict] = listener.replies("twice", "error")
    assert conflict["error"]["code"] == "idempotency_conflict"
    [refused] = listener.replies("no-key")
    assert refused["error"]["code"] == "unauthorized" and "WHISPERQ_MQTT_CLIENTS" in refused["error"]["message"]
    # Asked again once its result was delivered: the same job's result again, no new job.
    wait_until(lambda: not replies_owed(settings), 10, "replies are still owed")
    listener.send("carol", request)
    listener.wait_for(lambda: len(listener.replies("twice", "result")) == 2, 60, "the result again")
    assert {r["job_id"] for r in listener.replies("twice", "result")} == {job["job_id"]}
    assert {m["job_id"] for m in listener.replies("twice") if m["type"] != "error"} == {job["job_id"]}
    assert job_rows(settings) == before + 1


# --- restarts -----------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(900)  # a Mosquitto restart, then waits of 240 + 120 s (setup.cfg's default is 300)
def test_nothing_is_lost_while_mosquitto_restarts_and_the_bridge_is_away(
    bridge, listener, restartable_mosquitto, settings
):
    """Jobs that finish while Mosquitto is down and the bridge is killed (its unsent replies
    die with it: they come from the database), requests sent while no bridge runs, and
    requests sent while Mosquitto restarts under running jobs: every request gets its result,
    each makes one job, and the bridge reconnects by itself."""
    from models.jobs.operations import get_job
    from models.runtime import Runtime

    rt = Runtime(settings)
    bridged = bridge().start()
    paths: dict[str, str] = {}

    def send(correlation: str) -> None:
        paths[correlation] = FOX if len(paths) % 2 == 0 else REPORT
        listener.send("alice", {"path": paths[correlation], "correlation_id": correlation})

    def accepted(names) -> dict[str, str]:
        listener.wait_for(
            lambda: all(listener.replies(c, "status") or listener.replies(c, "result") for c in names),
            60,
            f"the first reply of each of {names}",
        )
        return {c: listener.replies(c)[0]["job_id"] for c in names}

    before = job_rows(settings)
    first = [f"first-{n}" for n in range(4)]
    for name in first:
        send(name)
    jobs = accepted(first)

    def meanwhile() -> None:  # Mosquitto is down: the jobs finish, their results cannot go out
        wait_until(
            lambda: all(get_job(rt, j).state.finished for j in jobs.values()),
            120,
            "the jobs did not finish while Mosquitto was down",
        )
        bridged.kill()  # what paho held for the broker is gone: what is owed is in the database

    restartable_mosquitto(down=1.0, during=meanwhile)
    away = [f"away-{n}" for n in range(3)]
    for name in away:
        send(name)  # nobody takes these until the bridge is back: the broker keeps them for its session
    bridged.start()
    accepted(away)
    restartable_mosquitto(down=2.0)  # under running jobs, the bridge connected
    during = [f"during-{n}" for n in range(3)]
    for name in during:
        send(name)  # while the bridge may still be reconnecting
    results = listener.results(list(paths), timeout=240)
    for correlation, result in results.items():
        check_result(result, paths[correlation])
    assert len({r["job_id"] for r in results.values()}) == len(paths) == 10
    assert job_rows(settings) == before + len(paths)
    assert listener.replies(kind="error") == []
    assert bridged.output().count("session resumed") >= 2 and "disconnected from the MQTT broker" in bridged.output()
    wait_until(lambda: not replies_owed(settings), 10, "replies are still owed")


@pytest.mark.integration
def test_the_acl_example_keeps_each_client_to_its_own_topics(bridge, tmp_path, settings, mosquitto):
    """deploy/mosquitto/whisperq.acl (the example in docs/clients/mqtt.md) on a Mosquitto of the test's own,
    over TLS (mqtts://, its certificate checked against WHISPERQ_MQTT_CA and the host name),
    with a password for the bridge and for each client: alice gets her result; she can neither
    submit as bob nor read his replies, nor have the bridge publish on his topics."""
    import secrets

    if shutil.which("mosquitto_passwd") is None or shutil.which("openssl") is None:
        need_service("mosquitto_passwd and openssl, for the ACL test's password file and certificate")
    cert, key = self_signed(tmp_path, "localhost")
    acl = ROOT / "deploy" / "mosquitto" / "whisperq.acl"
    assert (
        acl.read_text().strip() in (ROOT / "docs" / "clients" / "mqtt.md").read_text()
    )  # the docs show the file as it is
    passwords = {name: secrets.token_urlsafe(12) for name in ("whisperq-bridge", "alice", "bob")}
    for n, (name, password) in enumerate(passwords.items()):
        subprocess.run(
            ["mosquitto_passwd", *(["-c"] if n == 0 else []), "-b", str(tmp_path / "passwd"), name, password],
            check=True,
            capture_output=True,
            timeout=30,
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "mosquitto.conf").write_text(
        f"listener {port} 127.0.0.1\ncertfile {cert}\nkeyfile {key}\nallow_anonymous false\n"
        f"password_file {tmp_path / 'passwd'}\nacl_file {acl}\npersistence false\nuser root\n"
    )
    broker = subprocess.Popen(
        ["mosquitto", "-c", str(tmp_path / "mosquitto.conf")],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "mosquitto.log").open("w"),
    )
    try:

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                assert broker.poll() is None, (tmp_path / "mosquitto.log").read_text()
                return False

        wait_until(listening, 20, "the TLS Mosquitto is not listening")
        bridge(
            WHISPERQ_MQTT_URL=f"mqtts://whisperq-bridge:{passwords['whisperq-bridge']}@localhost:{port}",
            WHISPERQ_MQTT_CA=str(cert),
            WHISPERQ_MQTT_REQUEST_TOPIC="whisperq/requests/+",
            WHISPERQ_MQTT_REPLY_PREFIX="whisperq/replies",
        ).start()
        alice = Listener(
            "whisperq", ("localhost", port), ("alice", passwords["alice"]), "whisperq/replies/alice/#", ca=str(cert)
        )
        bob = Listener("whisperq", ("localhost", port), ("bob", passwords["bob"]), "whisperq/replies/#", ca=str(cert))
        try:
            before = job_rows(settings)
            alice.send("bob", {"path": FOX, "correlation_id": "as-bob"})  # not her topic: the broker drops it
            alice.send("alice", {"path": FOX, "correlation_id": "to-bob", "reply_to": "whisperq/replies/bob"})
            alice.send("alice", {"path": FOX, "correlation_id": "mine", "reply_to": "whisperq/replies/alice/jobs"})
            check_result(alice.results(["mine"])["mine"], FOX)
            [refused] = alice.replies("to-bob")
            assert refused["error"]["code"] == "forbidden"
            # Bob's own answer, published after alice's replies, reaches him: theirs had their chance.
            bob.send("bob", {"path": FOX, "priority": "urgent", "correlation_id": "bobs"})
            bob.wait_for(lambda: bob.messages, 60, "bob's own answer")
            assert alice.replies("as-bob") == []
            # bob's subscription to # shows him nothing of alice's
            assert [(t, m["correlation_id"]) for t, m, _c in bob.messages] == [("whisperq/replies/bob", "bobs")]
            assert {t for t, _m, _c in alice.messages} == {"whisperq/replies/alice", "whisperq/replies/alice/jobs"}
            assert job_rows(settings) == before + 1
        finally:
            alice.close()
            bob.close()
    finally:
        broker.terminate()
        broker.wait(10)
