"""Submit by URL: fetch the audio from the client's server, within the upload limits.

The URL is the client's, so it gets the same checks as a callback URL: public addresses only
(unless WHISPERQ_FETCH_ALLOW opens a host and port), checked again on every redirect, and
the connection goes to the checked address, never to a second DNS answer. What the remote
server writes (its body, reason phrase, a redirect's target) never reaches the client.
"""

from __future__ import annotations

import http.client
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urljoin, urlsplit

from models.delivery.outbound import (
    Deadline,
    Target,
    check_addresses,
    describe_error,
    open_pinned,
    parse_url,
    resolve_host,
    status_line,
)
from models.errors import InvalidRequest, PermanentJobError, TransientJobError

if TYPE_CHECKING:
    from config import Settings

log = logging.getLogger(__name__)

MAX_REDIRECTS = 3
CHUNK_BYTES = 64 * 1024
USER_AGENT = "whisperq-fetch/1"
_REDIRECTS = (301, 302, 303, 307, 308)

__all__ = ["MAX_REDIRECTS", "fetch_audio"]


class Sink(Protocol):
    """What `create` opens to write to: a file, or storage's encrypting writer."""

    def write(self, data: bytes, /) -> int: ...

    def __enter__(self) -> Sink: ...

    def __exit__(self, *exc: Any) -> None: ...


def fetch_audio(url: str, dest: Path, settings: Settings, create: Callable[[Path], Sink] | None = None) -> int:
    """Download `url` to `dest`; the number of bytes written. `create(dest)` opens the file to
    write (storage passes an encrypting writer); a plain file by default.

    PermanentJobError for what retrying cannot fix (a 4xx, too large, a refused address, a bad
    URL), TransientJobError for what may pass (a 5xx, 429, a time-out, a dropped connection).
    On any error nothing is left at `dest`."""
    dest = Path(dest)
    deadline = Deadline(settings.fetch_timeout_seconds)
    created = False
    try:
        for hop in range(MAX_REDIRECTS + 1):
            target = _target(url, redirected=hop > 0)
            conn = None
            try:
                conn = open_pinned(target, _addresses(target, settings, redirected=hop > 0), deadline)
                conn.request(
                    "GET",
                    target.path,
                    headers={
                        "Host": target.host_header,
                        "User-Agent": USER_AGENT,
                        "Accept": "*/*",
                        "Connection": "close",
                    },
                )
                response = conn.getresponse()
                if response.status in _REDIRECTS:
                    location = response.getheader("Location")
                    if not location:
                        raise PermanentJobError(
                            f"audio_url answered HTTP {response.status} without a Location; "
                            "give the audio file's final URL"
                        )
                    # Hosts only: a URL's path names the client's file (and may carry a signature).
                    log.info(
                        "audio_url on %s redirects to %s", target.host, urlsplit(urljoin(target.url, location)).hostname
                    )
                    url = urljoin(target.url, location)
                    continue
                _check_status(response, settings.max_upload_bytes)
                created = True
                written = _stream(response, dest, settings.max_upload_bytes, create)
                if deadline.expired:  # the deadline shut the socket: what looked like the end was not
                    raise TimeoutError
                return written
            except (OSError, http.client.HTTPException) as exc:
                if deadline.expired or isinstance(exc, TimeoutError):
                    raise TransientJobError(
                        f"audio_url did not download within {settings.fetch_timeout_seconds:g} s "
                        "(WHISPERQ_FETCH_TIMEOUT); it will be tried again"
                    ) from None
                raise TransientJobError(f"audio_url could not be fetched: {describe_error(exc)}") from None
            finally:
                if conn is not None:
                    conn.close()
        raise PermanentJobError(
            f"audio_url redirected more than {MAX_REDIRECTS} times; give the audio file's final URL"
        )
    except BaseException:
        if created:
            dest.unlink(missing_ok=True)
        raise
    finally:
        deadline.cancel()


def _target(url: str, redirected: bool = False) -> Target:
    try:
        return parse_url(url, "audio_url")
    except InvalidRequest as exc:
        if redirected:
            raise PermanentJobError(
                "audio_url redirects to a URL that cannot be fetched (only http:// and https:// "
                "to public hosts); give the audio file's final URL"
            ) from None
        raise PermanentJobError(str(exc)) from None


def _addresses(target: Target, settings: Settings, redirected: bool = False) -> list[str]:
    host = "redirects to a host that" if redirected else f"host {target.host}"
    try:
        addresses = resolve_host(target)
    except (socket.gaierror, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        if getattr(exc, "errno", None) == socket.EAI_NONAME:
            raise PermanentJobError(f"audio_url {host} does not exist ({reason}); check the URL") from None
        raise TransientJobError(f"audio_url {host} could not be resolved ({reason})") from None
    try:
        return check_addresses(target, addresses, settings, "audio_url", redirected=redirected)
    except InvalidRequest as exc:
        raise PermanentJobError(str(exc)) from None


def _check_status(response: http.client.HTTPResponse, limit: int) -> None:
    status = f"HTTP {status_line(response.status)}"  # the standard phrase: nothing the server wrote
    if response.status == 429 or response.status >= 500:
        raise TransientJobError(f"audio_url answered {status}; it will be tried again")
    if not 200 <= response.status < 300:
        raise PermanentJobError(
            f"audio_url answered {status}; check that the URL is right and can be read "
            "without logging in (a pre-signed URL works)"
        )
    if response.length is not None and response.length > limit:
        raise _too_large(limit)


def _too_large(limit: int) -> PermanentJobError:
    return PermanentJobError(
        f"audio_url is larger than the upload limit of {limit // (1024 * 1024)} MB "
        "(WHISPERQ_MAX_UPLOAD_MB); send a shorter or more compressed file"
    )


def _stream(
    response: http.client.HTTPResponse, dest: Path, limit: int, create: Callable[[Path], Sink] | None = None
) -> int:
    """Copy the body to dest, stopping as soon as it passes the limit."""
    written = 0
    with create(dest) if create is not None else open(dest, "wb") as out:
        while True:
            chunk = response.read(min(CHUNK_BYTES, limit + 1 - written))
            if not chunk:
                if response.length:  # http.client returns short rather than raise
                    raise http.client.IncompleteRead(b"", response.length)
                return written
            written += len(chunk)
            if written > limit:
                raise _too_large(limit)
            out.write(chunk)
