"""The service's errors as gRPC statuses: the HTTP API's own message, the code chosen by the
error's HTTP status (models.errors), and in the status details a google.rpc.ErrorInfo (reason:
the API's error code, such as QUEUE_FULL) and, for a refusal to come back later, a
google.rpc.RetryInfo; `retry-after` (seconds) and `whisperq-error-code` are in the trailing
metadata too, for clients that read no details.

| HTTP | gRPC |
|---|---|
| 400, 413, 415, 422 | INVALID_ARGUMENT (a bad option, unsupported or silent audio, over a size or length limit) |
| 401 | UNAUTHENTICATED |
| 403 | PERMISSION_DENIED |
| 404 | NOT_FOUND (an unknown job and another key's alike) |
| 409 | FAILED_PRECONDITION (ALREADY_EXISTS for an idempotency key another client used) |
| 410 | FAILED_PRECONDITION (the transcript was deleted by retention) |
| 429 | RESOURCE_EXHAUSTED with RetryInfo (queue full, rate, monthly quota) |
| 503 | UNAVAILABLE with RetryInfo (broker or database away, disk floor, model not served) |
| others | INTERNAL, logged |
"""

from __future__ import annotations

import collections
import json
import logging
from typing import Any

import grpc

from models.errors import DATABASE_AWAY, DatabaseUnavailable, IdempotencyConflict, WhisperqError
from models.security.crypto import DecryptionError

log = logging.getLogger(__name__)

DOMAIN = "whisperq"
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    410: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
UNAVAILABLE_RETRY = 5  # seconds, as the web's Retry-After for a 503 that names none


class UploadTooLarge(WhisperqError):
    """An upload over WHISPERQ_MAX_UPLOAD_MB (HTTP's 413)."""

    code = "too_large"
    http_status = 413


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):
    pass


def status_of(exc: BaseException) -> grpc.Status:
    """The status a call that raised `exc` ends with; an unexpected error is logged."""
    if isinstance(exc, WhisperqError):
        code = CODES.get(exc.http_status, grpc.StatusCode.INTERNAL)
        if isinstance(exc, IdempotencyConflict):
            code = grpc.StatusCode.ALREADY_EXISTS
        if code is grpc.StatusCode.INTERNAL:
            log.error("gRPC call failed: %s (%s)", exc, exc.code)
        retry = getattr(exc, "retry_after", None)
        if retry is None and exc.http_status == 503:
            retry = UNAVAILABLE_RETRY
        return build(code, str(exc), exc.code, None if retry is None else int(retry), getattr(exc, "details", None))
    if isinstance(exc, DATABASE_AWAY):
        log.warning("gRPC call failed: the database is unreachable (%s)", str(exc).splitlines()[0])
        return status_of(DatabaseUnavailable())
    if isinstance(exc, DecryptionError):
        log.error("gRPC call: stored data could not be decrypted: %s", exc)
        return build(
            grpc.StatusCode.INTERNAL,
            "stored data could not be decrypted with the keys this server has; an "
            "operator must check WHISPERQ_ENCRYPTION_KEYS (the log says which key is missing)",
            "decryption_failed",
        )
    log.error("unhandled error in a gRPC call", exc_info=exc)
    return build(grpc.StatusCode.INTERNAL, "the server hit an unexpected error; it has been logged", "internal_error")


def build(
    code: grpc.StatusCode,
    message: str,
    reason: str,
    retry_after: int | None = None,
    details: dict[str, Any] | None = None,
) -> grpc.Status:
    """A status with ErrorInfo (and RetryInfo where there is a time to come back) in its details."""
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    info = error_details_pb2.ErrorInfo(
        reason=reason.upper(),
        domain=DOMAIN,
        metadata={k: v if isinstance(v, str) else json.dumps(v) for k, v in (details or {}).items()},
    )
    packed = [info]
    trailing: list[tuple[str, str | bytes]] = [("whisperq-error-code", reason)]
    if retry_after is not None:
        packed.append(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=max(0, retry_after))))
        trailing.append(("retry-after", str(max(0, retry_after))))
    anys = []
    for detail in packed:
        one = any_pb2.Any()
        one.Pack(detail)
        anys.append(one)
    status = status_pb2.Status(code=code.value[0], message=message, details=anys)
    trailing.insert(0, ("grpc-status-details-bin", status.SerializeToString()))
    return _Status(code, message, tuple(trailing))
