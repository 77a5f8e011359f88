"""Completion webhooks, signed the Standard Webhooks way (https://www.standardwebhooks.com).

A receiver checks the signature with the shared secret (its API key's own, see
models.access.apikeys), so it can trust the body without calling back. The sender only talks to
public addresses (or hosts the operator allows) and checks the address again at delivery
(models.delivery.outbound), so a callback URL cannot reach the service's own network.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from models.delivery.outbound import (
    Deadline,
    check_addresses,
    describe_error,
    open_pinned,
    parse_url,
    resolve_host,
    status_line,
)
from models.errors import InvalidRequest
from models.retry import Verdict, classify_status

if TYPE_CHECKING:
    from config import Settings

MAX_RESPONSE_BYTES = 64 * 1024
USER_AGENT = "whisperq-webhooks/1"
EVENTS = {"COMPLETED": "job.completed", "FAILED": "job.failed", "CANCELLED": "job.cancelled", "EXPIRED": "job.expired"}

__all__ = ["Attempt", "batch_payload_for", "deliver", "payload_for", "sign", "verify"]


# --- signing --------------------------------------------------------------------------


def _key(secret: str) -> bytes:
    return base64.b64decode(secret[len("whsec_") :]) if secret.startswith("whsec_") else secret.encode()


def sign(secret: str | list[str], msg_id: str, timestamp: int, body: bytes) -> str:
    """The webhook-signature header value: v1,base64(HMAC-SHA256(key, id.timestamp.body)),
    one per secret, separated by spaces (a receiver accepts any that matches)."""
    content = f"{msg_id}.{int(timestamp)}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(_key(one), content, hashlib.sha256).digest()).decode()
        for one in ([secret] if isinstance(secret, str) else secret)
    )


def verify(secret: str, headers: Mapping[str, str], body: bytes, tolerance: int = 300) -> None:
    """Raise ValueError unless the body carries a valid signature made within `tolerance` s.

    Self-contained (standard library only) so a receiver can copy it as it is."""
    h = {k.lower(): v for k, v in headers.items()}
    try:
        msg_id, timestamp, signatures = h["webhook-id"], int(h["webhook-timestamp"]), h["webhook-signature"]
    except (KeyError, ValueError):
        raise ValueError("missing or malformed webhook-id, webhook-timestamp or webhook-signature header") from None
    if abs(time.time() - timestamp) > tolerance:
        raise ValueError("webhook-timestamp is too far from now: a replayed message, or a wrong clock")
    key = base64.b64decode(secret[len("whsec_") :]) if secret.startswith("whsec_") else secret.encode()
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


def deliver(
    url: str, payload: dict[str, Any], *, msg_id: str, settings: Settings, secrets: list[str] | None = None
) -> Attempt:
    """One POST, signed with each of `secrets` (the job owner's key's; by default the
    deployment's). Redirects are not followed: a receiver that moved must be given its new
    URL. Nothing the receiver sends back (body, reason phrase, Location) is recorded: the
    attempt, which the job's owner reads, says only the status code and what to do."""
    at, started = datetime.now(UTC), time.monotonic()

    def result(status: int | None = None, error: str | None = None, retryable: bool = False) -> Attempt:
        delivered = status is not None and 200 <= status < 300
        return Attempt(
            at,
            status,
            error[:200] if error else None,
            int((time.monotonic() - started) * 1000),
            retryable and not delivered,
            delivered,
        )

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
        "Host": target.host_header,
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Connection": "close",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secrets or settings.webhook_signing_secret(), msg_id, timestamp, body),
    }
    deadline = Deadline(settings.webhook_timeout_seconds)
    conn = None
    try:
        conn = open_pinned(target, addresses, deadline)
        conn.request("POST", target.path, body=body, headers=headers)
        response = conn.getresponse()
        with contextlib.suppress(OSError, http.client.HTTPException):
            response.read(MAX_RESPONSE_BYTES)  # read (a little) so the receiver is not cut off mid-send
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
    return result(status, error, retryable=classify_status(status) is Verdict.TRANSIENT)


def payload_for(job_dict: dict[str, Any], transcript_url: str, settings: Settings) -> dict[str, Any]:
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
    timestamp = job_dict.get("finished_at") or datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return {"type": EVENTS[status], "timestamp": timestamp, "data": data}


def batch_payload_for(
    batch_id: str, owner: str | None, created_at: str | None, finished_at: str | None, jobs: list[dict[str, Any]]
) -> dict[str, Any]:
    """`batch.completed`, once every job of the batch has finished: the batch's counts and each
    job's id, status and transcript URL (transcripts are fetched one by one, never inlined)."""
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    data = {
        "batch_id": batch_id,
        "owner": owner,
        "status": "COMPLETED",
        "total": len(jobs),
        "counts": counts,
        "created_at": created_at,
        "finished_at": finished_at,
        "jobs": jobs,
    }
    timestamp = finished_at or datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return {"type": "batch.completed", "timestamp": timestamp, "data": data}
