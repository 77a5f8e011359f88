"""Reading an `audio_url=s3://BUCKET/KEY` with the deployment's own AWS credentials (the client
S3 storage makes: AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, the credentials chain), within the same
limits as an http(s) fetch: at most WHISPERQ_MAX_UPLOAD_MB, within WHISPERQ_FETCH_TIMEOUT,
streamed into storage's sealing writer a block at a time (the object is never held in memory
whole).

Who may name which object is models.access.s3_sources' rule; it is checked at the door and again
here, before the object is read. The door also asks S3 for the object's size (`probe`), so a
missing object, one the deployment's credentials may not read or one over the limit is refused
at submission; what S3 cannot answer then (unreachable, 5xx) is left to the fetch, which retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from config import ConfigError
from models.access.s3_sources import S3Source, check_source, parse_s3_url
from models.errors import Forbidden, InvalidRequest, PermanentJobError, TooLarge, TransientJobError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from config import Settings
    from models.delivery.fetch import Sink
    from models.runtime import Runtime

log = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024

__all__ = ["fetch_s3_audio", "probe"]


def _client(rt: Runtime) -> S3Client:
    try:
        return rt.s3_client()
    except ConfigError as exc:
        raise InvalidRequest(
            f"this deployment cannot read s3:// URLs ({exc}); send a pre-signed https URL instead"
        ) from None


def _refusal(exc: Exception, source: S3Source) -> tuple[bool, str]:
    """(transient?, what to tell the client) for an S3 error about `source`; nothing S3 wrote
    but its status and error code."""
    response: Any = getattr(exc, "response", None)
    if not isinstance(response, dict):  # botocore's own: no connection, a read that timed out, no credentials
        name = type(exc).__name__
        if name in ("NoCredentialsError", "PartialCredentialsError"):
            return True, (
                f"audio_url {source} could not be read: this deployment has no AWS credentials (an operator "
                "sets them: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile or a role)"
            )
        return True, f"audio_url {source} could not be read from S3 ({name}); it will be tried again"
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    code = str(response.get("Error", {}).get("Code") or status)
    said = f"{status} {code}" if code != str(status) else str(status)  # HEAD answers carry no error code
    if status == 404 or code in ("NoSuchKey", "NoSuchBucket", "NotFound"):
        what = "bucket" if code == "NoSuchBucket" else "object"
        return (
            False,
            f"audio_url {source}: there is no such {what} (S3 answered {said}); check the bucket and key",
        )
    if status == 403:
        return False, (
            f"audio_url {source}: S3 refused this deployment's credentials ({said}); an operator lets them "
            "read it (s3:GetObject, and s3:ListBucket for S3 to tell a missing key apart), or send a pre-signed "
            "https URL"
        )
    if status == 429 or status >= 500 or code in ("SlowDown", "RequestTimeout", "Throttling"):
        return True, f"audio_url {source}: S3 answered {said}; it will be tried again"
    return False, f"audio_url {source}: S3 answered {said}; check the URL"


def _too_large(source: S3Source, size: int | None, limit: int) -> str:
    sized = f" is {size / (1024 * 1024):.1f} MB," if size is not None else ""
    return (
        f"audio_url {source}{sized} larger than the upload limit of {limit // (1024 * 1024)} MB "
        "(WHISPERQ_MAX_UPLOAD_MB); send a shorter or more compressed file"
    )


def _errors() -> tuple[type[Exception], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (ClientError, BotoCoreError)


def probe(rt: Runtime, source: S3Source) -> None:
    """At the door: refuse a missing object, one the deployment may not read (400) or one over
    WHISPERQ_MAX_UPLOAD_MB (413). Where S3 cannot answer now, the fetch will say."""
    client = _client(rt)
    limit = rt.settings.max_upload_bytes
    try:
        head = client.head_object(Bucket=source.bucket, Key=source.key)
    except _errors() as exc:
        transient, message = _refusal(exc, source)
        if transient:
            log.warning("audio_url %s: S3 did not answer the size check (%s); the fetch will try", source, message)
            return
        raise InvalidRequest(message) from None
    size = int(head.get("ContentLength") or 0)
    if size > limit:
        raise TooLarge(_too_large(source, size, limit))
    if size == 0:
        raise InvalidRequest(f"audio_url {source} is an empty object; name the recording itself")


def fetch_s3_audio(
    rt: Runtime, url: str, dest: Path, owner: str | None, create: Callable[[Path], Sink] | None = None
) -> int:
    """Read the object `url` names into `dest` (through `create(dest)`: storage's sealing writer),
    if the key `owner` (None: no key) may still name it; the number of bytes written.
    PermanentJobError for what retrying cannot fix (refused, missing, too large), TransientJobError
    for what may pass (S3 unreachable, 5xx, throttled, a read cut short, too slow). On any error
    nothing is left at `dest`."""
    try:  # again: the key's entries may have changed since the door, and a re-run comes this way too
        source = check_source(rt, parse_s3_url(url), owner)
        client = _client(rt)
    except (InvalidRequest, Forbidden) as exc:
        raise PermanentJobError(str(exc)) from None
    settings: Settings = rt.settings
    limit, end = settings.max_upload_bytes, time.monotonic() + settings.fetch_timeout_seconds
    errors = _errors()
    try:
        reply = client.get_object(Bucket=source.bucket, Key=source.key)
    except errors as exc:
        transient, message = _refusal(exc, source)
        raise (TransientJobError if transient else PermanentJobError)(message) from None
    body = reply["Body"]
    created = False
    try:
        size = reply.get("ContentLength")
        if size is not None and size > limit:
            raise PermanentJobError(_too_large(source, size, limit))
        written = 0
        created = True
        with create(dest) if create is not None else open(dest, "wb") as out:
            while chunk := body.read(min(CHUNK_BYTES, limit + 1 - written)):
                written += len(chunk)
                if written > limit:
                    raise PermanentJobError(_too_large(source, None, limit))
                out.write(chunk)
                if time.monotonic() > end:
                    raise TransientJobError(
                        f"audio_url {source} did not download within {settings.fetch_timeout_seconds:g} s "
                        "(WHISPERQ_FETCH_TIMEOUT); it will be tried again"
                    )
        if size is not None and written != size:
            raise TransientJobError(f"audio_url {source}: the read was cut short; it will be tried again")
        log.info("audio_url %s: %d bytes read", source, written)
        return written
    except errors as exc:  # a read that broke off or timed out
        transient, message = _refusal(exc, source)
        if created:
            dest.unlink(missing_ok=True)
        raise (TransientJobError if transient else PermanentJobError)(message) from None
    except OSError as exc:
        if created:
            dest.unlink(missing_ok=True)
        raise TransientJobError(f"audio_url {source} could not be read: {exc.strerror or exc}") from None
    except BaseException:
        if created:
            dest.unlink(missing_ok=True)
        raise
    finally:
        body.close()
