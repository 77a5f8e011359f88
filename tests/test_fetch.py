"""Fetching audio by URL: real HTTP from a local server, with the size, time, redirect and
address limits. Only DNS answers are faked, where a name must resolve to a private address."""

from __future__ import annotations

import dataclasses
import re
import socket
import time

import pytest
from helpers import FIXTURES, Receiver
from test_webhooks import fake_dns, make_settings

from models.delivery.fetch import fetch_audio
from models.errors import PermanentJobError, TransientJobError

FOX = (FIXTURES / "fox.flac").read_bytes()
MB = 1024 * 1024


def endless(handler, receiver):
    """A chunked body that never ends (until the test is over)."""
    handler.send_response(200)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    block = b"\0" * 65536
    while not receiver.release.is_set():
        handler.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))


def dripping(handler, receiver):
    """Headers, then a byte every 0.1 s for 4 s: no single read ever waits long."""
    handler.send_response(200)
    handler.send_header("Content-Length", str(10_000))
    handler.end_headers()
    for _ in range(40):
        if receiver.release.wait(0.1):
            break
        handler.wfile.write(b"\0")
        handler.wfile.flush()


def test_fetch_writes_the_served_bytes(tmp_path):
    dest = tmp_path / "audio.flac"
    with Receiver({"/fox.flac": (200, {"Content-Type": "audio/flac"}, FOX)}) as receiver:
        written = fetch_audio(receiver.url("/fox.flac"), dest, make_settings(tmp_path))
    assert written == len(FOX) == 81107
    assert dest.read_bytes() == FOX
    [(method, path, headers, _)] = receiver.requests
    assert (method, path, headers["User-Agent"]) == ("GET", "/fox.flac", "whisperq-fetch/1")


def test_fetch_follows_up_to_three_redirects(tmp_path):
    routes = {"/fox.flac": (200, {}, FOX)}
    for n in range(1, 5):
        routes[f"/r{n}"] = (302 if n % 2 else 307, {"Location": f"/r{n - 1}" if n > 1 else "/fox.flac"}, b"")
    dest = tmp_path / "audio.flac"
    with Receiver(routes) as receiver:
        assert fetch_audio(receiver.url("/r3"), dest, make_settings(tmp_path)) == len(FOX)
        assert dest.read_bytes() == FOX
        dest.unlink()
        with pytest.raises(PermanentJobError, match="redirected more than 3 times"):
            fetch_audio(receiver.url("/r4"), dest, make_settings(tmp_path))
    assert not dest.exists()
    assert [r[1] for r in receiver.requests][-4:] == ["/r4", "/r3", "/r2", "/r1"]


@pytest.mark.parametrize(
    "location, words",
    [
        ("http://10.0.0.5/audio.flac", "redirects to a host that resolves to a private address;"),
        (
            "http://169.254.169.254/latest/meta-data/",
            "redirects to a host that resolves to a link-local (cloud metadata)",
        ),
        ("file:///etc/passwd", "redirects to a URL that cannot be fetched"),
    ],
)
def test_a_redirect_to_a_refused_address_is_permanent(tmp_path, location, words):
    dest = tmp_path / "audio.flac"
    with Receiver({"/go": (302, {"Location": location}, b"")}) as receiver, pytest.raises(PermanentJobError) as err:
        fetch_audio(receiver.url("/go"), dest, make_settings(tmp_path))
    assert words in str(err.value) and "audio_url" in str(err.value)
    assert location.split("/")[2] not in str(err.value) or location.startswith("file")  # the server's word stays out
    assert not dest.exists()


def test_a_name_resolving_to_a_private_address_is_refused(tmp_path, monkeypatch):
    fake_dns(monkeypatch, {"files.internal": ["10.0.0.5"]})
    with pytest.raises(PermanentJobError) as err:
        fetch_audio("https://files.internal/a.flac", tmp_path / "a.flac", make_settings(tmp_path))
    assert str(err.value) == (
        "audio_url host files.internal resolves to a private address (10.0.0.5); audio is "
        "fetched from public addresses only unless WHISPERQ_FETCH_ALLOW includes it (as "
        "host:port or network:port)"
    )


def test_loopback_needs_the_allow_list(tmp_path):
    dest = tmp_path / "audio.flac"
    with (
        Receiver({"/fox.flac": (200, {}, FOX)}) as receiver,
        pytest.raises(PermanentJobError, match="loopback address"),
    ):
        fetch_audio(receiver.url("/fox.flac"), dest, make_settings(tmp_path, WHISPERQ_FETCH_ALLOW=None))
    assert receiver.requests == [] and not dest.exists()


def test_too_large_by_its_length_is_refused_before_reading(tmp_path):
    dest = tmp_path / "audio.flac"
    settings = make_settings(tmp_path, WHISPERQ_MAX_UPLOAD_MB="1")
    with Receiver({"/big": (200, {}, b"\0" * (MB + 1)), "/exact": (200, {}, b"\1" * MB)}) as receiver:
        with pytest.raises(PermanentJobError, match="larger than the upload limit of 1 MB"):
            fetch_audio(receiver.url("/big"), dest, settings)
        assert not dest.exists()
        assert fetch_audio(receiver.url("/exact"), dest, settings) == MB  # the limit itself is fine


def test_an_endless_body_stops_at_the_limit_and_leaves_no_file(tmp_path):
    dest = tmp_path / "audio.flac"
    started = time.monotonic()
    with (
        Receiver({"/stream": endless}) as receiver,
        pytest.raises(PermanentJobError, match="WHISPERQ_MAX_UPLOAD_MB"),
    ):
        fetch_audio(receiver.url("/stream"), dest, make_settings(tmp_path, WHISPERQ_MAX_UPLOAD_MB="1"))
    assert time.monotonic() - started < 5
    assert not dest.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "status, error",
    [
        (404, PermanentJobError),
        (403, PermanentJobError),
        (410, PermanentJobError),
        (503, TransientJobError),
        (500, TransientJobError),
        (429, TransientJobError),
    ],
)
def test_http_errors_are_permanent_or_transient(tmp_path, status, error):
    dest = tmp_path / "audio.flac"
    with Receiver({"/a.flac": (status, {}, b"nope")}) as receiver, pytest.raises(error) as err:
        fetch_audio(receiver.url("/a.flac"), dest, make_settings(tmp_path))
    assert type(err.value) is error and f"audio_url answered HTTP {status}" in str(err.value)
    assert not dest.exists()


def test_a_dripping_server_hits_the_total_time_limit(tmp_path):
    dest = tmp_path / "audio.flac"
    settings = dataclasses.replace(make_settings(tmp_path), fetch_timeout_seconds=0.8)
    started = time.monotonic()
    with (
        Receiver({"/drip": dripping}) as receiver,
        pytest.raises(TransientJobError, match=re.escape("did not download within 0.8 s")),
    ):
        fetch_audio(receiver.url("/drip"), dest, settings)
    assert 0.7 < time.monotonic() - started < 3
    assert not dest.exists()


def test_a_closed_port_is_transient(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TransientJobError, match="connection refused"):
        fetch_audio(f"http://127.0.0.1:{port}/a.flac", tmp_path / "a.flac", make_settings(tmp_path))


def test_a_cut_off_body_is_transient_and_leaves_no_file(tmp_path):
    def cut(handler, receiver):
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(FOX)))
        handler.end_headers()
        handler.wfile.write(FOX[:1000])
        handler.close_connection = True

    dest = tmp_path / "audio.flac"
    with (
        Receiver({"/cut": cut}) as receiver,
        pytest.raises(TransientJobError, match=f"connection closed with {len(FOX) - 1000} bytes still to come"),
    ):
        fetch_audio(receiver.url("/cut"), dest, make_settings(tmp_path))
    assert not dest.exists()


@pytest.mark.parametrize(
    "url, words",
    [
        ("ftp://example.com/a.flac", "audio_url has scheme 'ftp'"),
        ("https://user:pw@example.com/a.flac", "audio_url contains credentials"),
        ("", "audio_url is empty"),
    ],
)
def test_bad_urls_are_permanent(tmp_path, url, words):
    with pytest.raises(PermanentJobError, match=words):
        fetch_audio(url, tmp_path / "a.flac", make_settings(tmp_path))


def test_an_unknown_host_is_permanent_and_a_dns_hiccup_transient(tmp_path, monkeypatch):
    fake_dns(
        monkeypatch,
        {
            "gone.example": lambda: socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            "flaky.example": lambda: socket.gaierror(socket.EAI_AGAIN, "Temporary failure"),
        },
    )
    with pytest.raises(PermanentJobError, match=re.escape("gone.example does not exist")):
        fetch_audio("https://gone.example/a.flac", tmp_path / "a.flac", make_settings(tmp_path))
    with pytest.raises(TransientJobError, match=re.escape("flaky.example could not be resolved")):
        fetch_audio("https://flaky.example/a.flac", tmp_path / "a.flac", make_settings(tmp_path))
