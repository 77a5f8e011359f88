"""API keys: who is asking, which tier they are on, and whose jobs they may see.

A key is shown once, when it is created (`whisperq keys create`), as ``wq_`` followed by
43 random URL-safe characters. Only its SHA-256 is stored: a key has 256 bits of
entropy, so a fast hash is as strong as a slow one and costs nothing per request (as
GitHub and Stripe store their tokens). The first 10 characters are kept in the clear
so that people can tell their keys apart in `whisperq keys list`.

The tier sets the highest priority a key may ask for and its rate limit:

    premium   up to high     WHISPERQ_RATE_LIMIT_PREMIUM  (600/minute)
    standard  up to normal   WHISPERQ_RATE_LIMIT_STANDARD (120/minute)
    batch     low only       WHISPERQ_RATE_LIMIT_BATCH    (60/minute)

An admin key sees and acts on every job and reaches the admin API (dead letters).

Each key has its own webhook signing secret (``whsec_`` + base64 of 32 random bytes), shown
once when the key is made and again only when it is rotated (`whisperq keys
rotate-webhook-secret`, or ``POST /v1/webhook-secret`` with the key): one tenant's receiver
cannot forge or verify another's webhooks. It is stored encrypted, bound to its key's row.
After a rotation the old secret signs beside the new one for WEBHOOK_SECRET_OVERLAP, so a
receiver can switch without losing a delivery.

A key with `collect` on (`whisperq keys create --collect`, `whisperq keys collect KEY on`)
makes every job it submits training data, as the job option `collect=true` makes one job
(`whisperq dataset export`).

A key's `s3_sources` (`whisperq keys create --s3-source`, `whisperq keys s3-sources`) are the
`BUCKET/PREFIX` entries its `audio_url=s3://…` may name, read with the deployment's credentials
(models.access.s3_sources); none by default.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import JSON, Boolean, String, Text, select
from sqlalchemy.orm import Mapped, mapped_column

from config import PRIORITIES
from config.s3_sources import parse_sources
from models.db import Base, UTCDateTime, utcnow
from models.errors import Forbidden, InvalidRequest, Unauthorized, WhisperqError
from models.security.crypto import SealedAttribute

if TYPE_CHECKING:
    from models.runtime import Runtime

PREFIX = "wq_"
SHOWN = 10  # characters of a key kept in the clear: "wq_" and 7 more
TIERS = {"premium": "high", "standard": "normal", "batch": "low"}
_LAST_USED_EVERY = timedelta(minutes=1)
WEBHOOK_SECRET_OVERLAP = timedelta(hours=24)


class KeyNotFound(WhisperqError):
    code = "not_found"
    http_status = 404


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    tier: Mapped[str] = mapped_column(String(16))
    admin: Mapped[bool] = mapped_column(Boolean, default=False)
    shown: Mapped[str] = mapped_column(String(16))
    digest: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The key's webhook signing secret, and the one it replaced while that still signs too.
    webhook_secret_token: Mapped[str | None] = mapped_column("webhook_secret", Text)
    previous_webhook_secret_token: Mapped[str | None] = mapped_column("previous_webhook_secret", Text)
    previous_webhook_secret_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    webhook_secret_rotated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Training-data logging for every job of this key (models.maintenance.dataset).
    collect: Mapped[bool | None] = mapped_column(Boolean, default=False)
    # The BUCKET/PREFIX entries an audio_url=s3://… of this key may name (models.access.s3_sources).
    s3_sources: Mapped[list[str] | None] = mapped_column(JSON)
    # Words its jobs listen for when a job names none (`whisperq keys hotwords`).
    hotwords: Mapped[str | None] = mapped_column(Text)

    webhook_secret = SealedAttribute("webhook_secret_token", "api_keys.webhook_secret")
    previous_webhook_secret = SealedAttribute("previous_webhook_secret_token", "api_keys.previous_webhook_secret")

    def signing_secrets(self, now: datetime | None = None) -> list[str]:
        """The secrets a webhook for this key's jobs is signed with: the current one, and the
        previous one for a while after a rotation. Empty for a key made before keys had one."""
        now = now or utcnow()
        out = [self.webhook_secret] if self.webhook_secret_token else []
        if self.previous_webhook_secret_token and (self.previous_webhook_secret_until or now) > now:
            out.append(self.previous_webhook_secret)
        return out

    def to_dict(self) -> dict[str, Any]:
        def iso(value: datetime | None) -> str | None:
            return value.isoformat().replace("+00:00", "Z") if value else None

        return {
            "id": self.id,
            "name": self.name,
            "tier": self.tier,
            "admin": bool(self.admin),
            "key": self.shown + "…",
            "created_at": iso(self.created_at),
            "last_used_at": iso(self.last_used_at),
            "revoked_at": iso(self.revoked_at),
            "webhook_secret_rotated_at": iso(self.webhook_secret_rotated_at),
            "collect": bool(self.collect),
            "s3_sources": list(self.s3_sources or []),
        }


@dataclass(frozen=True)
class Principal:
    """Who a request acts for. `owner` is the key id its jobs are recorded under (None
    for anonymous use); an admin acts on every job."""

    owner: str | None
    tier: str | None
    admin: bool = False
    name: str = "anonymous"
    # Anonymous use: the highest priority it may ask for (WHISPERQ_ANONYMOUS_MAX_PRIORITY).
    cap: str | None = None

    @property
    def anonymous(self) -> bool:
        return self.owner is None and not self.admin

    @property
    def max_priority(self) -> str:
        return TIERS.get(self.tier or "", self.cap or "high")

    def default_priority(self) -> str:
        """`normal`, or the tier's highest if that is lower."""
        return max("normal", self.max_priority, key=PRIORITIES.index)

    def check_priority(self, priority: str) -> None:
        if PRIORITIES.index(priority) < PRIORITIES.index(self.max_priority):
            allowed = PRIORITIES[PRIORITIES.index(self.max_priority) :]
            if self.anonymous:
                raise Forbidden(
                    f"anonymous use may ask for priority {' or '.join(allowed)}, not {priority}; leave priority out, "
                    "or send an API key of a tier that allows it (an operator sets WHISPERQ_ANONYMOUS_MAX_PRIORITY)"
                )
            raise Forbidden(
                f"this API key's tier ({self.tier}) may ask for priority {' or '.join(allowed)}, not {priority}; "
                f"leave priority out or ask an operator for a key on a higher tier"
            )


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_webhook_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def create_key(
    rt: Runtime,
    name: str,
    tier: str,
    admin: bool = False,
    collect: bool = False,
    s3_sources: tuple[str, ...] | list[str] = (),
) -> tuple[ApiKey, str]:
    """A new key; returns its record and the key itself, which is never stored. The
    record's `webhook_secret` is readable until it leaves this call: show it then.
    `collect`: every job of the key is training data (`whisperq dataset export`).
    `s3_sources`: the BUCKET/PREFIX entries its audio_url=s3://… may name."""
    name = (name or "").strip()
    if not name or len(name) > 100 or not name.isprintable():
        raise InvalidRequest("the key's name must be 1 to 100 printable characters (who or what uses it)")
    if tier not in TIERS:
        raise InvalidRequest(f"tier {tier!r} is not one of: {', '.join(TIERS)}")
    sources = checked_sources(s3_sources)
    token = PREFIX + secrets.token_urlsafe(32)
    record = ApiKey(
        id=str(uuid.uuid4()),
        name=name,
        tier=tier,
        admin=admin,
        shown=token[:SHOWN],
        digest=digest(token),
        created_at=utcnow(),
        collect=bool(collect),
        s3_sources=list(sources) or None,
    )
    record.webhook_secret = new_webhook_secret()
    record.webhook_secret_rotated_at = record.created_at
    with rt.db.session() as session:
        session.add(record)
        session.flush()
        session.expunge(record)
    return record, token


def list_keys(rt: Runtime, include_revoked: bool = False) -> list[ApiKey]:
    query = select(ApiKey).order_by(ApiKey.created_at)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    with rt.db.session() as session:
        keys = list(session.scalars(query).all())
        for key in keys:
            session.expunge(key)
    return keys


def find_key(rt: Runtime, ident: str) -> ApiKey:
    """A key by its id, or by the start of the key as `keys list` shows it."""
    ident = ident.strip().rstrip("…")
    with rt.db.session() as session:
        key = session.get(ApiKey, ident)
        if key is None and ident.startswith(PREFIX) and len(ident) >= 6:
            matches = list(session.scalars(select(ApiKey).where(ApiKey.shown.startswith(ident[:SHOWN]))).all())
            matches = [m for m in matches if ident.startswith(m.shown) or m.shown.startswith(ident)]
            if len(matches) > 1:
                raise InvalidRequest(f"{ident!r} matches {len(matches)} keys; give the key's id")
            key = matches[0] if matches else None
        if key is None:
            raise KeyNotFound(f"no API key with id or prefix {ident!r}; see `whisperq keys list`")
        session.expunge(key)
        return key


def revoke_key(rt: Runtime, ident: str) -> ApiKey:
    """Revoke a key for good: the next request with it gets 401. Its jobs stay."""
    found = find_key(rt, ident)
    with rt.db.session() as session:
        key = cast(ApiKey, session.get(ApiKey, found.id))  # find_key found it; keys are never deleted
        if key.revoked_at is None:
            key.revoked_at = utcnow()
        session.flush()
        session.expunge(key)
        return key


def rotate_webhook_secret(rt: Runtime, ident: str, overlap: timedelta = WEBHOOK_SECRET_OVERLAP) -> tuple[ApiKey, str]:
    """A new webhook secret for a key (by id or the start of the key); returns it, to be
    shown once. The old one keeps signing beside it for `overlap` (0: it stops at once)."""
    found = find_key(rt, ident)
    secret = new_webhook_secret()
    with rt.db.session() as session:
        key = cast(ApiKey, session.get(ApiKey, found.id, with_for_update=True))  # found by find_key
        if key.revoked_at is not None:
            raise InvalidRequest(f"the key {key.name} is revoked; its jobs send no more webhooks worth signing")
        now = utcnow()
        if key.webhook_secret_token and overlap > timedelta(0):
            key.previous_webhook_secret = key.webhook_secret
            key.previous_webhook_secret_until = now + overlap
        else:
            key.previous_webhook_secret = key.previous_webhook_secret_until = None
        key.webhook_secret = secret
        key.webhook_secret_rotated_at = now
        session.flush()
        session.expunge(key)
    return key, secret


def set_collect(rt: Runtime, ident: str, on: bool) -> ApiKey:
    """Turn training-data logging on or off for a key's jobs from now on (by id or the start
    of the key); jobs made before keep what they were made with."""
    found = find_key(rt, ident)
    with rt.db.session() as session:
        key = cast(ApiKey, session.get(ApiKey, found.id))  # found by find_key
        key.collect = bool(on)
        session.flush()
        session.expunge(key)
        return key


def checked_sources(entries: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """S3 source entries normalised (config.s3_sources), or InvalidRequest saying what to write."""
    try:
        return parse_sources(list(entries))
    except ValueError as exc:
        raise InvalidRequest(f"S3 source {exc}") from None


def set_s3_sources(rt: Runtime, ident: str, entries: tuple[str, ...] | list[str]) -> ApiKey:
    """Replace the BUCKET/PREFIX entries a key's (by id or the start of the key) audio_url=s3://…
    may name (none: it may name no S3 object). Jobs already queued are checked again against the
    new entries when they are fetched."""
    sources = checked_sources(entries)
    found = find_key(rt, ident)
    with rt.db.session() as session:
        key = cast(ApiKey, session.get(ApiKey, found.id))  # found by find_key
        key.s3_sources = list(sources) or None
        session.flush()
        session.expunge(key)
        return key


def s3_sources_of(rt: Runtime, owner: str) -> tuple[str, ...]:
    """The S3 source entries of the key `owner` (a key id); none for an unknown or revoked key."""
    with rt.db.session() as session:
        key = session.get(ApiKey, owner)
        if key is None or key.revoked_at is not None:
            return ()
        return tuple(key.s3_sources or ())


def key_collects(rt: Runtime, owner: str | None) -> bool:
    """Whether the key `owner` (a key id; None for anonymous use) has training-data logging on."""
    if owner is None:
        return False
    with rt.db.session() as session:
        return bool(session.scalar(select(ApiKey.collect).where(ApiKey.id == owner)))


def key_hotwords(rt: Runtime, owner: str | None) -> str | None:
    """The words a key's jobs listen for by default (None: none, or anonymous use)."""
    if owner is None:
        return None
    with rt.db.session() as session:
        return session.scalar(select(ApiKey.hotwords).where(ApiKey.id == owner))


def set_hotwords(rt: Runtime, key: str, hotwords: str | None) -> ApiKey:
    """A key's (by id or the start of the key) default hotwords, checked as a job's are; None
    clears them."""
    found = find_key(rt, key)
    with rt.db.session() as session:
        record = session.get(ApiKey, found.id)
        if record is None:
            raise InvalidRequest(f"no key {key!r}")
        record.hotwords = hotwords
        session.flush()
        session.expunge(record)
        return record


def webhook_secrets_for(rt: Runtime, owner: str | None) -> list[str]:
    """What a webhook for a job of `owner` is signed with; empty means the deployment's own
    secret (anonymous jobs, transcribe.delay() jobs, keys made before keys had secrets)."""
    if owner is None:
        return []
    with rt.db.session() as session:
        key = session.get(ApiKey, owner)
        return key.signing_secrets() if key is not None else []


class BadKey(Unauthorized):
    pass


def authenticate(rt: Runtime, token: str) -> Principal:
    """The principal for a bearer key; BadKey (401) for an unknown or revoked one."""
    if not token.startswith(PREFIX):
        raise BadKey("that is not a whisperq API key (they start with wq_); create one with `whisperq keys create`")
    with rt.db.session() as session:
        key = session.scalars(select(ApiKey).where(ApiKey.digest == digest(token))).one_or_none()
        if key is None:
            raise BadKey("unknown API key; check it was copied whole, or ask an operator for a new one")
        if key.revoked_at is not None:
            raise BadKey(f"this API key ({key.name}) was revoked; ask an operator for a new one")
        now = utcnow()
        if key.last_used_at is None or key.last_used_at < now - _LAST_USED_EVERY:
            key.last_used_at = now  # at most once a minute: no write per request
        return Principal(owner=key.id, tier=key.tier, admin=bool(key.admin), name=key.name)


def principal_for_key_id(rt: Runtime, key_id: str) -> Principal | None:
    """The principal of a signed-in browser session; None once its key is revoked."""
    with rt.db.session() as session:
        key = session.get(ApiKey, key_id)
        if key is None or key.revoked_at is not None:
            return None
        return Principal(owner=key.id, tier=key.tier, admin=bool(key.admin), name=key.name)
