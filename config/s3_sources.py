"""Where an `audio_url=s3://BUCKET/KEY` may be read from: `BUCKET/PREFIX` entries, a key's own
(`whisperq keys s3-sources`, models.access.s3_sources) or, for submissions without a key,
WHISPERQ_ANONYMOUS_S3_SOURCES. An entry names a bucket and, optionally, a folder in it: it
covers the keys under that folder, matched on whole path segments (`bucket/a` covers
`a/x.mp3`, never `ab/x.mp3`). The entry is written as the object keys are, not percent-encoded.
"""

from __future__ import annotations

from .env import ConfigError, Env

SOURCE_FORM = "BUCKET or BUCKET/PREFIX (such as recordings/calls/2026)"

__all__ = ["SOURCE_FORM", "anonymous_sources", "parse_source", "parse_sources"]


def parse_source(entry: str) -> str:
    """One entry, normalised (`bucket` or `bucket/a/b`, no slash at either end); ValueError
    saying what is wrong and what to write instead."""
    from .settings import s3_location  # the bucket's naming rules, as WHISPERQ_STORAGE's

    if not isinstance(entry, str):
        raise ValueError(f"an S3 source is text: {SOURCE_FORM}")
    text = entry.strip()
    if text.lower().startswith("s3://"):
        text = text[5:]
    bucket, _, prefix = text.partition("/")
    if not bucket:
        raise ValueError(f"{entry!r} names no bucket; write {SOURCE_FORM}")
    try:
        s3_location(f"s3://{bucket}")
    except ValueError as exc:
        raise ValueError(f"{entry!r} {exc}") from None
    prefix = prefix.strip("/")
    parts = prefix.split("/") if prefix else []
    for part in parts:
        if part in ("", ".", "..") or not part.isprintable() or "," in part or part != part.strip():
            raise ValueError(
                f"{entry!r} has the prefix {prefix!r}; a prefix is folder names separated by single slashes, "
                "without . or .. parts, commas, control characters or spaces at a folder name's ends"
            )
    return f"{bucket}/{prefix}" if prefix else bucket


def parse_sources(entries: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Entries normalised, in their order, each once."""
    return tuple(dict.fromkeys(parse_source(e) for e in entries))


def anonymous_sources(env: Env, _values: object) -> tuple[str, ...]:
    """WHISPERQ_ANONYMOUS_S3_SOURCES: entries, comma separated; none by default."""
    name = "WHISPERQ_ANONYMOUS_S3_SOURCES"
    value = env.raw(name)
    if value is None or value.lower() == "none":
        return ()
    try:
        return parse_sources([e for e in value.split(",") if e.strip()])
    except ValueError as exc:
        raise ConfigError(
            f"{name}={value!r}: {exc}; set it to entries of the form {SOURCE_FORM}, comma separated"
        ) from None
