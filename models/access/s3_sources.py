"""Which S3 objects an `audio_url=s3://BUCKET/KEY` may name: those under one of the submitting
key's S3 sources (`BUCKET/PREFIX` entries, stored with the key: `whisperq keys s3-sources`), or,
without a key, under one of WHISPERQ_ANONYMOUS_S3_SOURCES (none by default); never the
service's own audio (WHISPERQ_STORAGE's bucket and prefix), whatever an entry covers. The object
is read with the deployment's AWS credentials (models.delivery.s3_fetch), so this rule is what
keeps one tenant out of the buckets those credentials reach.

The URL: `s3://BUCKET/KEY`, the key percent-decoded exactly once (`%20` a space, `%2F` a slash,
`%25` a percent sign): the key checked is the very key read. Refused: a bucket name S3 would not
take, no key, a key that ends in `/` (a folder), empty, `.` or `..` segments (decoded or not),
control characters, and a raw `?` or `#` (percent-encode them). An entry covers the keys below
its prefix on whole path segments: `bucket/a` covers `a/x.mp3` and `a/b/x.mp3`, never `ab/x.mp3`
nor the object `a` itself; `bucket` alone covers the whole bucket.

The door checks this at submission (models.pipeline.door), and the preparation pool again when it
fetches (a key's entries may have changed since, and a re-run fetches the original's URL anew).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from config.settings import s3_location
from models.access.apikeys import s3_sources_of
from models.errors import Forbidden, InvalidRequest

if TYPE_CHECKING:
    from config import Settings
    from models.runtime import Runtime

MAX_URL_LENGTH = 2048
MAX_KEY_BYTES = 1024  # S3's longest key
_KEY_SAFE = "/!$&'()*+,;=:@-._~"  # left as they are in the URL this service writes back

__all__ = ["S3Source", "SourceRefused", "check_source", "covers", "is_s3_url", "parse_s3_url", "service_source"]


@dataclass(frozen=True)
class S3Source:
    """An object an audio_url names: its bucket and its key, decoded."""

    bucket: str
    key: str

    @property
    def url(self) -> str:
        """The URL as this service records it (the key percent-encoded where it must be)."""
        return f"s3://{self.bucket}/{quote(self.key, safe=_KEY_SAFE)}"

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.key.split("/"))

    def __str__(self) -> str:
        return self.url


class SourceRefused(Forbidden):
    """An S3 object the caller may not have read: 403, with the entries it may use."""

    def __init__(self, message: str, allowed: tuple[str, ...]):
        super().__init__(message)
        self.details: dict[str, Any] = {"allowed_s3_sources": list(allowed)}  # beside code and message


def is_s3_url(url: object) -> bool:
    """Whether an audio_url names an S3 object (and is handled here, not by the address guard)."""
    return isinstance(url, str) and url.strip()[:5].lower() == "s3://"


def _bad(why: str) -> InvalidRequest:
    return InvalidRequest(f"audio_url {why}; give s3://BUCKET/KEY, the key percent-encoded where needed")


def parse_s3_url(url: str) -> S3Source:
    """The object an `s3://BUCKET/KEY` URL names, or InvalidRequest saying what to fix."""
    text = url.strip()
    if len(text) > MAX_URL_LENGTH:
        raise _bad(f"is {len(text)} characters long; at most {MAX_URL_LENGTH}")
    if any(ord(ch) < 33 or ord(ch) == 127 for ch in text):
        raise _bad("contains spaces or control characters (percent-encode a space as %20)")
    if "?" in text or "#" in text:
        raise _bad("has a query or fragment (? or #); an s3:// URL names an object only (percent-encode ? as %3F)")
    bucket, slash, raw = text[5:].partition("/")
    if "@" in bucket or ":" in bucket:
        raise _bad(
            "carries credentials or a port; objects are read with the service's own AWS credentials and endpoint"
        )
    try:
        s3_location(f"s3://{bucket}")  # the bucket's naming rules, as WHISPERQ_STORAGE's
    except ValueError as exc:
        raise _bad(str(exc)) from None
    if not slash or not raw:
        raise _bad(f"names the bucket {bucket!r} but no object in it")
    try:
        key = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise _bad("has a percent-encoding that is not UTF-8") from None
    if len(key.encode()) > MAX_KEY_BYTES:
        raise _bad(f"has a key of {len(key.encode())} bytes; S3 keys have at most {MAX_KEY_BYTES}")
    if not key.isprintable():
        raise _bad("has control characters in its key")
    for parts in (raw.split("/"), key.split("/")):
        if key.endswith("/") or any(p in ("", ".", "..") for p in parts):
            raise _bad(
                "has an empty, '.' or '..' segment in its key, or ends in '/' (a folder); name the object itself"
            )
    return S3Source(bucket, key)


def _under(entry: str, source: S3Source, *, itself: bool = False) -> bool:
    """Whether `source` lies below the entry `BUCKET[/PREFIX]` (or is its prefix's object, with `itself`)."""
    bucket, _, prefix = entry.partition("/")
    if bucket != source.bucket:
        return False
    if not prefix:
        return True
    want = tuple(prefix.split("/"))
    have = source.parts
    return have[: len(want)] == want and (len(have) > len(want) or itself)


def covers(entry: str, source: S3Source) -> bool:
    """Whether a normalised entry (config.s3_sources) covers the object, on whole path segments."""
    return _under(entry, source)


def service_source(settings: Settings) -> str | None:
    """WHISPERQ_STORAGE's bucket and prefix as an entry, where audio lives in S3."""
    if not settings.storage.startswith("s3://"):
        return None
    bucket, prefix = s3_location(settings.storage)
    return f"{bucket}/{prefix}" if prefix else bucket


def allowed_for(rt: Runtime, owner: str | None) -> tuple[str, ...]:
    """The entries a key (a key id; None: a submission without a key) may name."""
    return rt.settings.anonymous_s3_sources if owner is None else s3_sources_of(rt, owner)


def check_source(rt: Runtime, source: S3Source, owner: str | None) -> S3Source:
    """`source`, if the key `owner` (None: no key) may have it read; else SourceRefused (403)
    naming the entries it may use."""
    allowed = allowed_for(rt, owner)
    own = service_source(rt.settings)
    if own is not None and _under(own, source, itself=True):
        raise SourceRefused(
            f"audio_url {source} lies in this service's own storage (WHISPERQ_STORAGE), which no audio_url may "
            "read; name a recording elsewhere" + (f" (this key may use: {', '.join(allowed)})" if allowed else ""),
            allowed,
        )
    if any(covers(entry, source) for entry in allowed):
        return source
    who = "this API key" if owner is not None else "a submission without an API key"
    if allowed:
        listed = ", ".join(f"s3://{entry}/…" for entry in allowed)
        raise SourceRefused(
            f"{who} may not have audio_url {source} read: its S3 sources are {listed}; name an object under one "
            "of them, or ask an operator to add this bucket and prefix"
            + (" (`whisperq keys s3-sources`)" if owner is not None else " (WHISPERQ_ANONYMOUS_S3_SOURCES)"),
            allowed,
        )
    fix = (
        "ask an operator to give it the bucket and prefix with `whisperq keys s3-sources KEY BUCKET/PREFIX`"
        if owner is not None
        else "send an API key whose S3 sources cover it (an operator may open prefixes to submissions without "
        "a key with WHISPERQ_ANONYMOUS_S3_SOURCES)"
    )
    raise SourceRefused(
        f"{who} may not have any S3 object read (audio_url {source}): {fix}, or send a pre-signed https URL", allowed
    )
