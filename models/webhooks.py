"""Completion webhooks, signed the Standard Webhooks way (https://www.standardwebhooks.com).

A receiver checks the signature with the shared secret, so it can trust the body without
calling back. The sender only talks to public addresses (or networks the operator allows)
and checks the address again at delivery, so a callback URL cannot reach the service's own
network, by its name or by a DNS answer that changes after the check. The same URL and
address checks guard fetching audio by URL (models/fetch.py).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import http
import http.client
import ipaddress
import json
import random
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Mapping
from urllib.parse import quote, urlsplit, urlunsplit

from .errors import InvalidRequest

MAX_URL_LENGTH = 2048
MAX_RESPONSE_BYTES = 64 * 1024
BACKOFF_CAP_SECONDS = 3600.0
USER_AGENT = "whisperq-webhooks/1"
EVENTS = {"COMPLETED": "job.completed", "FAILED": "job.failed", "CANCELLED": "job.cancelled", "EXPIRED": "job.expired"}
_PURPOSE = {"callback_url": "webhooks go to", "audio_url": "audio is fetched from"}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_ASCII = "".join(map(chr, range(33, 127)))

__all__ = [
    "Attempt", "backoff", "check_callback_url", "check_url", "deliver", "payload_for",
    "resolve_allowed", "sign", "verify", "within_window",
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
        raise InvalidRequest(f"{field} has scheme {scheme or '(none)'!r}; use an http:// or https:// URL")
    if "@" in parts.netloc:
        raise InvalidRequest(f"{field} contains credentials (user:password@); remove them and authenticate "
                             "another way (webhooks are signed; a token in the path or query works too)")
    try:
        port = parts.port if parts.port is not None else (443 if scheme == "https" else 80)
        host = (parts.hostname or "").encode("idna").decode("ascii").lower()
        if port == 0:
            raise ValueError
    except (ValueError, UnicodeError):
        raise InvalidRequest(f"{field} has a malformed host or port ({parts.netloc!r}); check the URL")
    if not host:
        raise InvalidRequest(f"{field} has no host; give a full URL such as https://example.com/hook")
    literal = f"[{host}]" if ":" in host else host
    netloc = literal if port == (443 if scheme == "https" else 80) else f"{literal}:{port}"
    path, query = (quote(parts.path or "/", safe=_ASCII), quote(parts.query, safe=_ASCII))  # non-ASCII only
    return Target(urlunsplit((scheme, netloc, path, query, "")), scheme, host, port,
                  path + (f"?{query}" if query else ""), netloc)


def _refusal(address: str, rules=(), host: str = "", port: int = 0) -> str | None:
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
        for kind, bad in (("unspecified", c.is_unspecified), ("loopback", c.is_loopback),
                          ("link-local (cloud metadata)", c.is_link_local), ("multicast", c.is_multicast),
                          ("private", c.is_private), ("reserved", c.is_reserved),
                          # fec0::/10, deprecated but still routed inside some networks; Python counts it global
                          ("site-local", getattr(c, "is_site_local", False)), ("non-public", not c.is_global)):
            if bad:
                return kind
    return None


def resolve_host(target: Target) -> list[str]:
    """Every address the host resolves to, unchecked (raises socket.gaierror)."""
    infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


def allow_list(settings, field: str):
    """The allow-list for a purpose: audio fetches and webhooks each have their own."""
    return (settings.fetch_allow, "WHISPERQ_FETCH_ALLOW") if field == "audio_url" else \
        (settings.webhook_allow, "WHISPERQ_WEBHOOK_ALLOW")


def check_addresses(target: Target, addresses: list[str], settings, field: str, redirected: bool = False) -> list[str]:
    """The addresses, if every one is public or allowed; else InvalidRequest naming the
    first that is not (but not a host a redirect named: that is the remote server's word)."""
    rules, variable = allow_list(settings, field)
    for address in addresses:
        kind = _refusal(address, rules, target.host, target.port)
        if kind:
            what = f"redirects to a host that resolves to a {kind} address" if redirected else \
                f"host {target.host} resolves to a {kind} address ({address})"
            raise InvalidRequest(
                f"{field} {what}; {_PURPOSE.get(field, 'requests go to')} public addresses only unless "
                f"{variable} includes it (as host:port or network:port)"
            )
    return addresses


def check_url(url: str, settings, field: str = "callback_url") -> str:
    """The normalised URL, once its form and every address its host resolves to are acceptable."""
    resolve_allowed(url, settings, field)
    return parse_url(url, field).url


def check_callback_url(url: str, settings) -> str:
    return check_url(url, settings, "callback_url")


def resolve_allowed(url: str, settings, field: str = "callback_url") -> list[str]:
    """The host's addresses, all checked: connect to these, never to the name (DNS rebinding)."""
    target = parse_url(url, field)
    try:
        addresses = resolve_host(target)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidRequest(f"{field} host {target.host} does not resolve ({getattr(exc, 'strerror', exc)}); "
                             "check the spelling, and that the name is in public DNS") from None
    return check_addresses(target, addresses, settings, field)


# --- pinned connections -------------------------------------------------------------


class Deadline:
    """A total time limit: a socket time-out bounds each read, not a server that drips."""

    def __init__(self, seconds: float):
        self.seconds, self.end, self.expired, self._timer = seconds, time.monotonic() + seconds, False, None

    def remaining(self) -> float:
        return max(0.001, self.end - time.monotonic())

    def watch(self, conn: http.client.HTTPConnection) -> None:
        """At the deadline, shut the connection's socket: any read in progress ends."""
        def fire():
            self.expired = True
            if conn.sock is not None:
                try:
                    socket.socket.shutdown(conn.sock, socket.SHUT_RDWR)  # the raw fd, also under TLS
                except OSError:
                    pass

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


# --- signing --------------------------------------------------------------------------


def _key(secret: str) -> bytes:
    return base64.b64decode(secret[len("whsec_"):]) if secret.startswith("whsec_") else secret.encode()


def sign(secret: str | list[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The webhook-signature header value: v1,base64(HMAC-SHA256(key, id.timestamp.body)),
    one per secret, separated by spaces (a receiver accepts any that matches)."""
    content = f"{msg_id}.{int(timestamp)}.".encode() + body
    return " ".join("v1," + base64.b64encode(hmac.new(_key(one), content, hashlib.sha256).digest()).decode()
                    for one in ([secret] if isinstance(secret, str) else secret))


def verify(secret: str, headers: Mapping[str, str], body: bytes, tolerance: int = 300) -> None:
    """Raise ValueError unless the body carries a valid signature made within `tolerance` s.

    Self-contained (standard library only) so a receiver can copy it as it is."""
    h = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id, timestamp, signatures = h["webhook-id"], int(h["webhook-timestamp"]), h["webhook-signature"]
    except (KeyError, ValueError):
        raise ValueError("missing or malformed webhook-id, webhook-timestamp or webhook-signature header")
    if abs(time.time() - timestamp) > tolerance:
        raise ValueError("webhook-timestamp is too far from now: a replayed message, or a wrong clock")
    key = base64.b64decode(secret[len("whsec_"):]) if secret.startswith("whsec_") else secret.encode()
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    expected = base64.b64encode(digest)
    for signature in signatures.split():
        version, _, value = signature.partition(",")
        if version == "v1" and hmac.compare_digest(value.encode(), expected):
            return
    raise ValueError("no webhook-signature matches: a wrong secret, or the body was changed")


# --- delivery ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: int
    retryable: bool
    delivered: bool


def deliver(url: str, payload: dict, *, msg_id: str, settings, secrets: list[str] | None = None) -> Attempt:
    """One POST, signed with each of `secrets` (the job owner's key's; by default the
    deployment's). Redirects are not followed: a receiver that moved must be given its new
    URL. Nothing the receiver sends back (body, reason phrase, Location) is recorded: the
    attempt, which the job's owner reads, says only the status code and what to do."""
    at, started = datetime.now(timezone.utc), time.monotonic()

    def result(status=None, error=None, retryable=False) -> Attempt:
        delivered = status is not None and 200 <= status < 300
        return Attempt(at, status, error[:200] if error else None, int((time.monotonic() - started) * 1000),
                       retryable and not delivered, delivered)

    try:
        target = parse_url(url, "callback_url")
        addresses = check_addresses(target, resolve_host(target), settings, "callback_url")
    except InvalidRequest as exc:
        return result(error=f"refused: {exc}")
    except (socket.gaierror, UnicodeError) as exc:  # DNS may come back: retry
        return result(error=f"{target.host} does not resolve: {getattr(exc, 'strerror', exc)}", retryable=True)
    body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    timestamp = int(time.time())
    headers = {
        "Host": target.host_header, "Content-Type": "application/json", "User-Agent": USER_AGENT,
        "Connection": "close", "webhook-id": msg_id, "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secrets or settings.webhook_signing_secret(), msg_id, timestamp, body),
    }
    deadline = Deadline(settings.webhook_timeout_seconds)
    conn = None
    try:
        conn = open_pinned(target, addresses, deadline)
        conn.request("POST", target.path, body=body, headers=headers)
        response = conn.getresponse()
        try:
            response.read(MAX_RESPONSE_BYTES)  # read (a little) so the receiver is not cut off mid-send
        except (OSError, http.client.HTTPException):
            pass
    except (OSError, http.client.HTTPException) as exc:
        if deadline.expired or isinstance(exc, TimeoutError):
            return result(error=f"timed out after {settings.webhook_timeout_seconds:g} s", retryable=True)
        return result(error=describe_error(exc), retryable=True)
    finally:
        deadline.cancel()
        if conn is not None:
            conn.close()
    status = response.status
    if 200 <= status < 300:
        return result(status)
    error = f"HTTP {status_line(status)}"
    if 300 <= status < 400:
        return result(status, f"{error}: redirects are not followed; set callback_url to the final URL")
    return result(status, error, retryable=status == 429 or status >= 500)


def status_line(code: int) -> str:
    """'404 Not Found': the standard phrase, never the remote server's own text."""
    try:
        return f"{code} {http.HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


def backoff(attempt_number: int, settings) -> float:
    """Seconds before the next attempt: full jitter, uniform in [0, min(1 h, base * 2^(n-1))]."""
    ceiling = settings.webhook_retry_base_seconds * 2 ** min(max(0, attempt_number - 1), 40)
    return random.uniform(0, min(BACKOFF_CAP_SECONDS, ceiling))


def within_window(first_attempt_at: datetime, now: datetime, settings) -> bool:
    """Whether retries may go on: a receiver down longer than the window is given up on."""
    return (now - first_attempt_at).total_seconds() <= settings.webhook_retry_window_seconds


def payload_for(job_dict: dict, transcript_url: str, settings) -> dict:
    """The event body, in the Standard Webhooks shape {type, timestamp, data}.

    A large transcript is left out (result_omitted) and fetched from transcript_url instead,
    so that a receiver's body limit does not turn every delivery into a failure."""
    status = str(getattr(job_dict.get("status"), "value", job_dict.get("status"))).upper()
    if status not in EVENTS:
        raise ValueError(f"job status {status!r} has no webhook event; only {', '.join(EVENTS)} do")
    data = {
        "job_id": job_dict["job_id"],
        "owner": job_dict.get("owner"),  # the API key (id) that submitted it; null for anonymous use
        "status": status,
        "created_at": job_dict.get("created_at"),
        "finished_at": job_dict.get("finished_at"),
        "error": job_dict.get("error"),
        "transcript_url": transcript_url,
    }
    result = job_dict.get("result")
    if result is not None:
        size = len(json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode())
        if size <= settings.webhook_max_inline_bytes:
            data["result"] = result
        else:
            data["result_omitted"] = True
    timestamp = job_dict.get("finished_at") or datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
    return {"type": EVENTS[status], "timestamp": timestamp, "data": data}
