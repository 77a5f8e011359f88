"""Outbound HTTP to URLs a client gave: webhook targets (models.delivery.webhooks) and audio to
fetch (models.delivery.fetch).

A URL is checked before it is accepted and again at each connection: only public
addresses, or what the operator opened for that purpose (config.allow:
WHISPERQ_WEBHOOK_ALLOW, WHISPERQ_FETCH_ALLOW), by its name or by a DNS answer that changes
after the check. The connection goes to the checked address (the name is never looked up
again), under one deadline for the whole exchange. Nothing a remote server writes is
passed on to the client: errors name the standard status phrase only.
"""

from __future__ import annotations

import contextlib
import http
import http.client
import ipaddress
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit, urlunsplit

from models.errors import InvalidRequest

if TYPE_CHECKING:
    from collections.abc import Iterable

    from config import Settings
    from config.allow import AllowRule

MAX_URL_LENGTH = 2048
_PURPOSE = {"callback_url": "webhooks go to", "audio_url": "audio is fetched from"}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_ASCII = "".join(map(chr, range(33, 127)))

__all__ = [
    "Deadline",
    "Target",
    "check_addresses",
    "check_callback_url",
    "check_url",
    "describe_error",
    "open_pinned",
    "parse_url",
    "resolve_allowed",
    "resolve_host",
    "status_line",
]


# --- URLs and addresses -------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A checked URL, split the way a pinned connection needs it."""

    url: str  # normalised
    scheme: str
    host: str  # ASCII (IDNA), no brackets: for DNS, SNI and the certificate
    port: int
    path: str  # path and query
    host_header: str


def parse_url(url: str, field: str = "callback_url") -> Target:
    """Split and normalise an http(s) URL, or raise InvalidRequest saying what to fix."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequest(f"{field} is empty; give an http:// or https:// URL")
    url = url.strip()
    if len(url) > MAX_URL_LENGTH:
        raise InvalidRequest(f"{field} is {len(url)} characters long; use a URL of at most {MAX_URL_LENGTH}")
    if any(ord(ch) < 33 or ord(ch) == 127 for ch in url):
        raise InvalidRequest(f"{field} contains spaces or control characters; percent-encode them")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        also = " (or s3://BUCKET/KEY where this key may read that bucket)" if field == "audio_url" else ""
        raise InvalidRequest(f"{field} has scheme {scheme or '(none)'!r}; use an http:// or https:// URL{also}")
    if "@" in parts.netloc:
        raise InvalidRequest(
            f"{field} contains credentials (user:password@); remove them and authenticate "
            "another way (webhooks are signed; a token in the path or query works too)"
        )
    try:
        port = parts.port if parts.port is not None else (443 if scheme == "https" else 80)
        host = (parts.hostname or "").encode("idna").decode("ascii").lower()
        if port == 0:
            raise ValueError
    except (ValueError, UnicodeError):
        raise InvalidRequest(f"{field} has a malformed host or port ({parts.netloc!r}); check the URL") from None
    if not host:
        raise InvalidRequest(f"{field} has no host; give a full URL such as https://example.com/hook")
    literal = f"[{host}]" if ":" in host else host
    netloc = literal if port == (443 if scheme == "https" else 80) else f"{literal}:{port}"
    path, query = (quote(parts.path or "/", safe=_ASCII), quote(parts.query, safe=_ASCII))  # non-ASCII only
    return Target(
        urlunsplit((scheme, netloc, path, query, "")), scheme, host, port, path + (f"?{query}" if query else ""), netloc
    )


def _refusal(address: str, rules: Iterable[AllowRule] = (), host: str = "", port: int = 0) -> str | None:
    """Why an address is off limits (private, loopback, ...), or None when it may be used:
    it is public, or an allow-list rule (config.allow) covers this host, port and address."""
    ip = ipaddress.ip_address(address)
    if ip.version == 6 and ip.ipv4_mapped:  # ::ffff:a.b.c.d connects to a.b.c.d
        ip = ip.ipv4_mapped
    elif ip.version == 6 and ip in _NAT64:
        ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    embedded = [ip.sixtofour, ip.teredo and ip.teredo[1]] if ip.version == 6 else []
    candidates = [ip] + [e for e in embedded if e]
    if any(rule.covers(host, port, candidates) for rule in rules):
        return None
    for c in candidates:
        for kind, bad in (
            ("unspecified", c.is_unspecified),
            ("loopback", c.is_loopback),
            ("link-local (cloud metadata)", c.is_link_local),
            ("multicast", c.is_multicast),
            ("private", c.is_private),
            ("reserved", c.is_reserved),
            # fec0::/10, deprecated but still routed inside some networks; Python counts it global
            ("site-local", getattr(c, "is_site_local", False)),
            ("non-public", not c.is_global),
        ):
            if bad:
                return kind
    return None


def resolve_host(target: Target) -> list[str]:
    """Every address the host resolves to, unchecked (raises socket.gaierror)."""
    infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))  # an IP address's text


def allow_list(settings: Settings, field: str) -> tuple[tuple[AllowRule, ...], str]:
    """The allow-list for a purpose: audio fetches and webhooks each have their own."""
    return (
        (settings.fetch_allow, "WHISPERQ_FETCH_ALLOW")
        if field == "audio_url"
        else (settings.webhook_allow, "WHISPERQ_WEBHOOK_ALLOW")
    )


def check_addresses(
    target: Target, addresses: list[str], settings: Settings, field: str, redirected: bool = False
) -> list[str]:
    """The addresses, if every one is public or allowed; else InvalidRequest naming the
    first that is not (but not a host a redirect named: that is the remote server's word)."""
    rules, variable = allow_list(settings, field)
    for address in addresses:
        kind = _refusal(address, rules, target.host, target.port)
        if kind:
            what = (
                f"redirects to a host that resolves to a {kind} address"
                if redirected
                else f"host {target.host} resolves to a {kind} address ({address})"
            )
            raise InvalidRequest(
                f"{field} {what}; {_PURPOSE.get(field, 'requests go to')} public addresses only unless "
                f"{variable} includes it (as host:port or network:port)"
            )
    return addresses


def check_url(url: str, settings: Settings, field: str = "callback_url") -> str:
    """The normalised URL, once its form and every address its host resolves to are acceptable."""
    resolve_allowed(url, settings, field)
    return parse_url(url, field).url


def check_callback_url(url: str, settings: Settings) -> str:
    return check_url(url, settings, "callback_url")


def resolve_allowed(url: str, settings: Settings, field: str = "callback_url") -> list[str]:
    """The host's addresses, all checked: connect to these, never to the name (DNS rebinding)."""
    target = parse_url(url, field)
    try:
        addresses = resolve_host(target)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidRequest(
            f"{field} host {target.host} does not resolve ({getattr(exc, 'strerror', exc)}); "
            "check the spelling, and that the name is in public DNS"
        ) from None
    return check_addresses(target, addresses, settings, field)


# --- pinned connections -------------------------------------------------------------


class Deadline:
    """A total time limit: a socket time-out bounds each read, not a server that drips."""

    def __init__(self, seconds: float):
        self.seconds, self.end, self.expired = seconds, time.monotonic() + seconds, False
        self._timer: threading.Timer | None = None

    def remaining(self) -> float:
        return max(0.001, self.end - time.monotonic())

    def watch(self, conn: http.client.HTTPConnection) -> None:
        """At the deadline, shut the connection's socket: any read in progress ends."""

        def fire() -> None:
            self.expired = True
            if conn.sock is not None:
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)  # the raw fd, also under TLS

        self.cancel()
        self._timer = threading.Timer(max(0.0, self.end - time.monotonic()), fire)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


class PinnedConnection(http.client.HTTPConnection):
    """HTTP or HTTPS to one checked address; the URL's host name goes in Host, SNI and the
    certificate check, so the name is never looked up again."""

    def __init__(self, target: Target, address: str, deadline: Deadline):
        super().__init__(address, target.port, timeout=deadline.remaining())
        self.target, self.deadline = target, deadline

    def connect(self) -> None:
        self.deadline.watch(self)
        self.sock = socket.create_connection((self.host, self.port), self.deadline.remaining())
        if self.target.scheme == "https":
            self.sock = ssl.create_default_context().wrap_socket(self.sock, server_hostname=self.target.host)


def open_pinned(target: Target, addresses: list[str], deadline: Deadline) -> PinnedConnection:
    """A connection to the first of the checked addresses that answers."""
    error: OSError = ConnectionError(f"{target.host} has no address")
    for address in addresses:
        conn = PinnedConnection(target, address, deadline)
        try:
            conn.connect()
            return conn
        except OSError as exc:
            conn.close()
            error = exc
            if deadline.expired:
                break
    raise error


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate not accepted: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or exc}"
    if isinstance(exc, http.client.IncompleteRead):
        return f"connection closed with {exc.expected} bytes still to come"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "connection closed without a response"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    return f"{type(exc).__name__}: {exc}"[:200]


def status_line(code: int) -> str:
    """'404 Not Found': the standard phrase, never the remote server's own text."""
    try:
        return f"{code} {http.HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)
