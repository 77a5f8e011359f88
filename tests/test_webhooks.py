"""Completion webhooks: signatures, address checks and one delivery attempt, over real HTTP
to a receiver on loopback. Only DNS answers are faked, where a name must resolve to a
private address."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import os
import re
import socket
import ssl
import stat
import time
from datetime import UTC, datetime, timedelta

import pytest
from helpers import Receiver, self_signed

from config import ConfigError, Settings
from models.delivery import outbound, webhooks
from models.errors import InvalidRequest
from models.retry import RetryPolicy

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def make_settings(tmp_path, **env) -> Settings:
    environ = {
        "WHISPERQ_DATA_DIR": str(tmp_path / "data"),
        "WHISPERQ_WEBHOOK_SECRET": SECRET,
        "WHISPERQ_WEBHOOK_ALLOW": "127.0.0.0/8",
        "WHISPERQ_FETCH_ALLOW": "127.0.0.0/8",
        "WHISPERQ_WEBHOOK_TIMEOUT": "2",
    }
    environ.update(env)
    return Settings.from_env({k: v for k, v in environ.items() if v is not None})


def fake_dns(monkeypatch, names: dict) -> list:
    """Answer for the names given (a list of addresses, or a function returning one); pass
    everything else, IP literals included, to the real resolver. Returns the names looked up."""
    real, asked = socket.getaddrinfo, []

    def getaddrinfo(host, port, *args, **kwargs):
        if host not in names:
            return real(host, port, *args, **kwargs)
        asked.append(host)
        answer = names[host]() if callable(names[host]) else names[host]
        if isinstance(answer, BaseException):
            raise answer
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answer]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def slow(handler, receiver):
    receiver.release.wait(10)


# --- signatures -------------------------------------------------------------------------


def test_sign_reproduces_the_standard_webhooks_test_vector():
    body = b'{"test": 2432232314}'
    signature = webhooks.sign(SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body)
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    headers = {
        "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "webhook-timestamp": "1614265330",
        "webhook-signature": signature,
    }
    webhooks.verify(SECRET, headers, body, tolerance=10**10)
    with pytest.raises(ValueError, match="too far"):
        webhooks.verify(SECRET, headers, body)  # from 2021: a replay


def test_a_raw_secret_signs_with_its_utf8_bytes():
    expected = base64.b64encode(hmac.new("sécret".encode(), b"msg_1.1700000000.{}", hashlib.sha256).digest()).decode()
    assert webhooks.sign("sécret", "msg_1", 1700000000, b"{}") == "v1," + expected


def signed(secret=SECRET, msg_id="msg_1", timestamp=None, body=b'{"a":1}'):
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "Webhook-Id": msg_id,
        "Webhook-Timestamp": str(timestamp),
        "Webhook-Signature": webhooks.sign(secret, msg_id, timestamp, body),
    }


def test_verify_accepts_a_fresh_signature_among_several():
    headers = signed()
    headers["Webhook-Signature"] = "v1,bm9wZQ== " + headers["Webhook-Signature"]  # rotation: old and new key
    webhooks.verify(SECRET, headers, b'{"a":1}')


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda h, b: (h, b'{"a":2}'), "no webhook-signature matches"),
        (
            lambda h, b: (signed(secret="whsec_" + base64.b64encode(b"another key 12345").decode()), b),
            "no webhook-signature matches",
        ),
        (lambda h, b: (signed(timestamp=int(time.time()) - 301), b), "too far"),
        (lambda h, b: (signed(timestamp=int(time.time()) + 301), b), "too far"),
        (lambda h, b: ({k: v for k, v in h.items() if k != "Webhook-Signature"}, b), "missing or malformed"),
        (lambda h, b: (dict(h, **{"Webhook-Timestamp": "soon"}), b), "missing or malformed"),
        (
            lambda h, b: (dict(h, **{"Webhook-Signature": "v2," + h["Webhook-Signature"][3:]}), b),
            "no webhook-signature",
        ),
    ],
)
def test_verify_rejects_tampering_replays_and_missing_headers(change, words):
    headers, body = change(signed(), b'{"a":1}')
    with pytest.raises(ValueError, match=words):
        webhooks.verify(SECRET, headers, body)


# --- URL and address checks ---------------------------------------------------------------


@pytest.mark.parametrize(
    "url, words",
    [
        ("ftp://example.com/hook", "scheme 'ftp'"),
        ("example.com/hook", "scheme '(none)'"),
        ("https://user:pw@example.com/hook", "credentials"),
        ("https:///hook", "no host"),
        ("https://example.com:99999/hook", "malformed host or port"),
        ("https://example.com/" + "a" * 2100, "at most 2048"),
        ("https://example.com/a b", "spaces or control characters"),
        ("https://example.com:0/hook", "malformed host or port"),
    ],
)
def test_bad_callback_urls_say_what_to_fix(tmp_path, url, words):
    with pytest.raises(InvalidRequest, match="callback_url") as err:
        outbound.check_callback_url(url, make_settings(tmp_path))
    assert words in str(err.value)


@pytest.mark.parametrize(
    "address, kind",
    [
        ("127.0.0.1", "loopback"),
        ("10.0.0.5", "private"),
        ("192.168.1.10", "private"),
        ("169.254.169.254", "link-local (cloud metadata)"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("100.64.0.1", "non-public"),
        ("::1", "loopback"),
        ("::ffff:10.0.0.1", "private"),
        ("fd00::1", "private"),
        ("fe80::1", "link-local (cloud metadata)"),
        ("2002:a00:1::1", "private"),  # 6to4 wrapping 10.0.0.1
        ("fec0::1", "site-local"),
        ("fec0:1:2::3", "site-local"),
    ],
)
def test_non_public_addresses_are_refused(tmp_path, address, kind):
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(InvalidRequest) as err:
        outbound.check_callback_url(f"http://{host}/hook", make_settings(tmp_path, WHISPERQ_WEBHOOK_ALLOW=None))
    assert f"a {kind} address ({address})" in str(err.value)
    assert "WHISPERQ_WEBHOOK_ALLOW" in str(err.value)


def test_a_name_resolving_to_a_private_address_is_refused(tmp_path, monkeypatch):
    fake_dns(monkeypatch, {"hooks.internal": ["93.184.216.34", "10.0.0.5"]})  # one bad answer is enough
    with pytest.raises(InvalidRequest) as err:
        outbound.check_callback_url("https://hooks.internal/done", make_settings(tmp_path))
    assert str(err.value) == (
        "callback_url host hooks.internal resolves to a private address (10.0.0.5); webhooks go "
        "to public addresses only unless WHISPERQ_WEBHOOK_ALLOW includes it (as host:port or "
        "network:port)"
    )


def test_public_names_pass_and_come_back_normalised(tmp_path, monkeypatch):
    fake_dns(monkeypatch, {"hooks.example.com": ["93.184.216.34", "2606:2800:220:1::"]})
    settings = make_settings(tmp_path)
    assert (
        outbound.check_callback_url("HTTPS://Hooks.Example.COM:443/done?x=1#frag", settings)
        == "https://hooks.example.com/done?x=1"
    )
    assert outbound.resolve_allowed("https://hooks.example.com/", settings) == ["93.184.216.34", "2606:2800:220:1::"]
    assert (
        outbound.check_callback_url("http://hooks.example.com/café?q=ü&r=%20", settings)
        == "http://hooks.example.com/caf%C3%A9?q=%C3%BC&r=%20"
    )


def test_public_addresses_pass_however_written(tmp_path):
    settings = make_settings(tmp_path, WHISPERQ_WEBHOOK_ALLOW=None)
    for url in ("http://93.184.216.34/x", "http://[::ffff:93.184.216.34]/x", "https://[2606:2800:220:1::]:8443/x"):
        assert outbound.check_callback_url(url, settings) == url
        assert len(outbound.resolve_allowed(url, settings)) == 1


def test_the_allow_list_admits_private_networks(tmp_path, monkeypatch):
    fake_dns(monkeypatch, {"hooks.internal": ["10.1.2.3"]})
    settings = make_settings(tmp_path, WHISPERQ_WEBHOOK_ALLOW="10.0.0.0/8, 127.0.0.0/8")
    assert outbound.check_callback_url("http://hooks.internal:8080/x", settings) == "http://hooks.internal:8080/x"
    with pytest.raises(InvalidRequest, match=re.escape("192.168.0.1")):
        outbound.check_callback_url("http://192.168.0.1/x", settings)


def test_allow_entries_are_scoped_to_a_port_and_a_purpose(tmp_path, monkeypatch):
    """An entry opens one port of a host (not its database next door), and only for its own
    purpose: a webhook target is not thereby a place audio may be fetched from."""
    fake_dns(monkeypatch, {"hooks.internal": ["10.1.2.3"], "files.internal": ["10.9.9.9"]})
    settings = make_settings(
        tmp_path, WHISPERQ_WEBHOOK_ALLOW="10.1.2.3:8443,[fd00::/8]:443,files.internal:80", WHISPERQ_FETCH_ALLOW=None
    )
    assert outbound.check_callback_url("https://hooks.internal:8443/x", settings)
    assert outbound.check_callback_url("https://[fd00::5]/x", settings)
    assert outbound.check_callback_url("http://files.internal/x", settings)  # by name, on its port
    for refused in (
        "http://hooks.internal:5432/x",
        "https://10.1.2.3/x",
        "https://[fd00::5]:8443/x",
        "https://files.internal/x",
        "http://10.9.9.9/x",
    ):
        with pytest.raises(InvalidRequest, match="WHISPERQ_WEBHOOK_ALLOW"):
            outbound.check_callback_url(refused, settings)
    with pytest.raises(InvalidRequest, match="audio is fetched from public addresses only unless WHISPERQ_FETCH_ALLOW"):
        outbound.check_url("https://hooks.internal:8443/a.flac", settings, "audio_url")
    fetching = make_settings(tmp_path, WHISPERQ_WEBHOOK_ALLOW=None, WHISPERQ_FETCH_ALLOW="10.1.2.3:8443")
    assert outbound.check_url("https://hooks.internal:8443/a.flac", fetching, "audio_url")
    with pytest.raises(InvalidRequest, match="WHISPERQ_WEBHOOK_ALLOW"):
        outbound.check_callback_url("https://hooks.internal:8443/x", fetching)
    legacy = make_settings(
        tmp_path, WHISPERQ_WEBHOOK_ALLOW=None, WHISPERQ_FETCH_ALLOW=None, WHISPERQ_WEBHOOK_ALLOW_NETWORKS="10.0.0.0/8"
    )  # as earlier versions read it: both
    assert outbound.check_callback_url("http://hooks.internal/x", legacy)
    assert outbound.check_url("http://hooks.internal/x", legacy, "audio_url")


def test_an_unresolvable_host_is_an_invalid_request(tmp_path, monkeypatch):
    fake_dns(monkeypatch, {"nowhere.example": lambda: socket.gaierror(socket.EAI_NONAME, "Name or service not known")})
    with pytest.raises(InvalidRequest, match=re.escape("callback_url host nowhere.example does not resolve")):
        outbound.check_callback_url("https://nowhere.example/x", make_settings(tmp_path))


# --- delivery -------------------------------------------------------------------------------


def test_delivery_posts_signed_compact_json(tmp_path):
    settings = make_settings(tmp_path)
    payload = {"type": "job.completed", "data": {"job_id": "j1", "text": "naïve"}}
    with Receiver({"/hook": (204, {}, b"")}) as receiver:
        attempt = webhooks.deliver(receiver.url("/hook?token=abc"), payload, msg_id="msg_j1", settings=settings)
        unicode_path = webhooks.deliver(receiver.url("/hook/é"), payload, msg_id="msg_j1", settings=settings)
    assert (attempt.delivered, attempt.retryable, attempt.status_code, attempt.error) == (True, False, 204, None)
    assert attempt.at.tzinfo is UTC and 0 <= attempt.duration_ms < 2000
    assert (unicode_path.status_code, unicode_path.delivered) == (404, False)  # sent, percent-encoded
    [(method, path, headers, body), second] = receiver.requests
    assert (method, path, second[1]) == ("POST", "/hook?token=abc", "/hook/%C3%A9")
    assert body == json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    assert headers["Content-Type"] == "application/json"
    assert headers["User-Agent"] == "whisperq-webhooks/1"
    assert headers["webhook-id"] == "msg_j1"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 5
    webhooks.verify(SECRET, dict(headers.items()), body)
    with pytest.raises(ValueError):
        webhooks.verify("whsec_" + base64.b64encode(b"not the secret 16").decode(), dict(headers.items()), body)


@pytest.mark.parametrize(
    "status, delivered, retryable",
    [
        (200, True, False),
        (202, True, False),
        (500, False, True),
        (503, False, True),
        (429, False, True),
        (410, False, False),
        (400, False, False),
        (404, False, False),
    ],
)
def test_status_codes_decide_retries(tmp_path, status, delivered, retryable):
    with Receiver({"/hook": (status, {}, b"busy, try later" if status >= 400 else b"ok")}) as receiver:
        attempt = webhooks.deliver(receiver.url("/hook"), {}, msg_id="m", settings=make_settings(tmp_path))
    assert (attempt.status_code, attempt.delivered, attempt.retryable) == (status, delivered, retryable)
    assert (attempt.error is None) == delivered
    if not delivered:
        # the standard phrase only: what the receiver wrote is never shown to the job's owner
        assert attempt.error.startswith(f"HTTP {status} ") and "busy, try later" not in attempt.error


def test_redirects_are_not_followed(tmp_path):
    with Receiver({"/old": (302, {"Location": "/new"}, b""), "/new": (200, {}, b"")}) as receiver:
        attempt = webhooks.deliver(receiver.url("/old"), {}, msg_id="m", settings=make_settings(tmp_path))
    assert (attempt.status_code, attempt.delivered, attempt.retryable) == (302, False, False)
    assert attempt.error == "HTTP 302 Found: redirects are not followed; set callback_url to the final URL"
    assert [r[1] for r in receiver.requests] == ["/old"]


@pytest.fixture()
def chatty_server():
    """A server that answers every request with its own reason phrase, a Location and a body
    that name internal things: none of it may reach a client through an attempt or an error."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(5)

    def serve():
        for _ in range(4):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                body = b"db-primary.corp:5432 password=hunter2"
                conn.sendall(
                    b"HTTP/1.1 %d internal db-primary.corp down\r\nLocation: http://10.1.2.3/admin\r\n"
                    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (serve.status, len(body), body)
                )

    serve.status = 500
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield serve, f"http://127.0.0.1:{listener.getsockname()[1]}/x"
    listener.close()


@pytest.mark.parametrize("status", [500, 404, 302])
def test_nothing_the_remote_server_writes_is_echoed(tmp_path, chatty_server, status):
    from models.delivery.fetch import fetch_audio
    from models.errors import WhisperqError as JobError

    serve, url = chatty_server
    serve.status = status
    attempt = webhooks.deliver(url, {}, msg_id="m", settings=make_settings(tmp_path))
    try:
        fetch_audio(url, tmp_path / "audio", make_settings(tmp_path))
    except JobError as exc:
        fetched = str(exc)
    for said in (attempt.error, fetched):
        assert said.startswith(("HTTP ", "audio_url answered HTTP ", "audio_url")), said
        for leak in ("db-primary", "hunter2", "10.1.2.3", "internal"):
            assert leak not in said, said


def test_a_receiver_that_hangs_times_out_retryably(tmp_path):
    settings = dataclasses.replace(make_settings(tmp_path), webhook_timeout_seconds=0.5)
    with Receiver({"/hook": slow}) as receiver:
        attempt = webhooks.deliver(receiver.url("/hook"), {}, msg_id="m", settings=settings)
    assert (attempt.status_code, attempt.delivered, attempt.retryable) == (None, False, True)
    assert attempt.error == "timed out after 0.5 s"
    assert 400 <= attempt.duration_ms < 3000


def test_a_closed_port_is_retryable(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    attempt = webhooks.deliver(f"http://127.0.0.1:{port}/hook", {}, msg_id="m", settings=make_settings(tmp_path))
    assert (attempt.delivered, attempt.retryable, attempt.error) == (False, True, "connection refused")


def test_loopback_needs_the_allow_list(tmp_path):
    with Receiver({"/hook": (200, {}, b"")}) as receiver:
        refused = webhooks.deliver(
            receiver.url("/hook"), {}, msg_id="m", settings=make_settings(tmp_path, WHISPERQ_WEBHOOK_ALLOW=None)
        )
        allowed = webhooks.deliver(receiver.url("/hook"), {}, msg_id="m", settings=make_settings(tmp_path))
    assert (refused.delivered, refused.retryable, refused.status_code) == (False, False, None)
    assert refused.error.startswith("refused: callback_url host 127.0.0.1 resolves to a loopback address")
    assert allowed.delivered
    assert len(receiver.requests) == 1


def test_delivery_connects_to_the_checked_address_with_the_original_host(tmp_path, monkeypatch):
    asked = fake_dns(monkeypatch, {"hooks.example": ["127.0.0.1"]})
    with Receiver({"/hook": (200, {}, b"")}) as receiver:
        attempt = webhooks.deliver(
            receiver.url("/hook", host="hooks.example"), {}, msg_id="m", settings=make_settings(tmp_path)
        )
    assert attempt.delivered
    assert receiver.requests[0][2]["Host"] == f"hooks.example:{receiver.port}"
    assert asked == ["hooks.example"]  # looked up once, then the address was used


def test_dns_rebinding_after_the_check_is_refused_at_delivery(tmp_path, monkeypatch):
    answers = iter([["93.184.216.34"], ["127.0.0.1"]])
    fake_dns(monkeypatch, {"rebind.example": lambda: next(answers)})
    settings = make_settings(tmp_path, WHISPERQ_WEBHOOK_ALLOW=None)
    with Receiver({"/hook": (200, {}, b"")}) as receiver:
        url = outbound.check_callback_url(receiver.url("/hook", host="rebind.example"), settings)
        attempt = webhooks.deliver(url, {}, msg_id="m", settings=settings)
    assert (attempt.delivered, attempt.retryable) == (False, False)
    assert "loopback address (127.0.0.1)" in attempt.error
    assert receiver.requests == []


def tls_receiver_context(tmp_path, seen_names: list) -> tuple[ssl.SSLContext, str]:
    cert, key = self_signed(tmp_path, "hooks.example")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.sni_callback = lambda sock, name, ctx: seen_names.append(name)
    return context, str(cert)


def test_https_verifies_the_certificate_against_the_host_name_not_the_address(tmp_path, monkeypatch):
    names: list = []
    context, cert = tls_receiver_context(tmp_path, names)
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # trust the test certificate, as a CA bundle would
    fake_dns(monkeypatch, {"hooks.example": ["127.0.0.1"]})
    settings = make_settings(tmp_path)
    with Receiver({"/hook": (200, {}, b"")}, tls=context) as receiver:
        good = webhooks.deliver(
            receiver.url("/hook", host="hooks.example", scheme="https"), {"a": 1}, msg_id="m", settings=settings
        )
        by_address = webhooks.deliver(receiver.url("/hook", scheme="https"), {}, msg_id="m", settings=settings)
    assert (good.delivered, good.status_code) == (True, 200)
    assert names[0] == "hooks.example"
    assert receiver.requests[0][3] == b'{"a":1}'
    assert (by_address.delivered, by_address.retryable) == (False, True)
    assert by_address.error.startswith("TLS certificate not accepted") and "127.0.0.1" in by_address.error


# --- retries and payloads -------------------------------------------------------------------


def test_backoff_is_full_jitter_capped_at_an_hour(tmp_path):
    policy = RetryPolicy.for_webhooks(make_settings(tmp_path, WHISPERQ_WEBHOOK_RETRY_BASE_SECONDS="5"))
    third = [policy.backoff(3) for _ in range(2000)]
    assert all(0 <= d <= 20 for d in third)
    assert min(third) < 2 and max(third) > 18  # spread over the whole range
    late = [policy.backoff(n) for n in (12, 50, 10_000) for _ in range(300)]
    assert all(0 <= d <= 3600 for d in late) and max(late) > 3000


def test_retries_stop_after_the_window(tmp_path):
    policy = RetryPolicy.for_webhooks(make_settings(tmp_path, WHISPERQ_WEBHOOK_RETRY_WINDOW="3600"))
    first = datetime(2024, 1, 1, tzinfo=UTC)
    assert policy.next_delay(40, first, first + timedelta(minutes=59)) is not None  # no cap on attempts
    assert policy.next_delay(2, first, first + timedelta(minutes=61)) is None
    assert make_settings(tmp_path).webhook_retry_window_seconds == 86400.0


def job(status="COMPLETED", **extra):
    return dict(
        {
            "job_id": "j1",
            "status": status,
            "created_at": "2024-01-01T00:00:00Z",
            "finished_at": "2024-01-01T00:00:09Z",
            "error": None,
            "result": {"text": "hello", "segments": [{"start": 0, "end": 1, "text": "hello"}]},
        },
        **extra,
    )


def test_payload_inlines_a_small_transcript(tmp_path):
    payload = webhooks.payload_for(job(), "https://stt.example/v1/jobs/j1/transcript", make_settings(tmp_path))
    assert payload == {
        "type": "job.completed",
        "timestamp": "2024-01-01T00:00:09Z",
        "data": {
            "job_id": "j1",
            "owner": None,
            "status": "COMPLETED",
            "created_at": "2024-01-01T00:00:00Z",
            "finished_at": "2024-01-01T00:00:09Z",
            "error": None,
            "transcript_url": "https://stt.example/v1/jobs/j1/transcript",
            "result": job()["result"],
        },
    }


def test_payload_omits_a_transcript_over_the_limit(tmp_path):
    size = len(json.dumps(job()["result"], separators=(",", ":")))
    exact = make_settings(tmp_path, WHISPERQ_WEBHOOK_MAX_INLINE_BYTES=str(size))
    smaller = make_settings(tmp_path, WHISPERQ_WEBHOOK_MAX_INLINE_BYTES=str(size - 1))
    assert "result" in webhooks.payload_for(job(), "u", exact)["data"]
    data = webhooks.payload_for(job(), "u", smaller)["data"]
    assert "result" not in data and data["result_omitted"] is True and data["transcript_url"] == "u"


@pytest.mark.parametrize(
    "status, event",
    [
        ("FAILED", "job.failed"),
        ("EXPIRED", "job.expired"),
        ("CANCELLED", "job.cancelled"),
        ("completed", "job.completed"),
    ],
)
def test_payload_event_types(tmp_path, status, event):
    payload = webhooks.payload_for(job(status, result=None, error="bad audio"), "u", make_settings(tmp_path))
    assert payload["type"] == event and payload["data"]["error"] == "bad audio"
    assert "result" not in payload["data"] and "result_omitted" not in payload["data"]


def test_unfinished_jobs_have_no_event(tmp_path):
    with pytest.raises(ValueError, match="PENDING"):
        webhooks.payload_for(job("PENDING"), "u", make_settings(tmp_path))


# --- settings ----------------------------------------------------------------------------------


def test_webhook_settings_defaults(tmp_path):
    s = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path)})
    assert (
        s.webhook_secret,
        s.webhook_allow + s.fetch_allow,
        s.webhook_timeout_seconds,
        s.webhook_retry_base_seconds,
        s.webhook_retry_window_seconds,
        s.webhook_max_inline_bytes,
        s.fetch_timeout_seconds,
    ) == (None, (), 10.0, 5.0, 86400.0, 262144, 120.0)


def test_a_generated_secret_is_shared_through_the_data_dir(tmp_path):
    first = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path)})
    secret = first.webhook_signing_secret()
    assert secret.startswith("whsec_") and len(base64.b64decode(secret[6:])) == 32
    assert Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path)}).webhook_signing_secret() == secret
    assert stat.S_IMODE(os.stat(tmp_path / "webhook-secret").st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["webhook-secret"]
    assert make_settings(tmp_path).webhook_signing_secret() == SECRET  # a configured one wins


def test_the_secret_is_masked_and_networks_listed(tmp_path):
    described = make_settings(
        tmp_path,
        WHISPERQ_WEBHOOK_ALLOW="10.0.0.0/8,[fd00::/8]:443,hooks.internal:443",
        WHISPERQ_FETCH_ALLOW="10.1.2.3, [fd00::1]:8080",
    ).describe()
    assert described["webhook_secret"] == "***"
    assert described["webhook_allow"] == "10.0.0.0/8,[fd00::/8]:443,hooks.internal:443"
    assert described["fetch_allow"] == "10.1.2.3,[fd00::1]:8080"


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("WHISPERQ_WEBHOOK_ALLOW_NETWORKS", "10.0.0.0/8,intranet", "'intranet'"),
        ("WHISPERQ_WEBHOOK_ALLOW", "10.0.0.0/33", "'10.0.0.0/33'"),
        ("WHISPERQ_FETCH_ALLOW", "10.0.0.1:99999", "port '99999'"),
        ("WHISPERQ_FETCH_ALLOW", "fd00::/8:443", "brackets"),
        ("WHISPERQ_WEBHOOK_ALLOW", "files/internal", "not a network, an address or a host name"),
        ("WHISPERQ_WEBHOOK_SECRET", "whsec_not*base64", "not base64"),
        ("WHISPERQ_WEBHOOK_TIMEOUT", "soon", "not a number"),
        ("WHISPERQ_WEBHOOK_MAX_INLINE_BYTES", "-1", "out of range"),
        ("WHISPERQ_FETCH_TIMEOUT", "0", "too small"),
    ],
)
def test_bad_webhook_settings_name_the_variable(tmp_path, name, value, words):
    with pytest.raises(ConfigError) as err:
        make_settings(tmp_path, **{name: value})
    assert name in str(err.value) and words in str(err.value)
