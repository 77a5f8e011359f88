"""Who a gRPC call acts for: the one door's `identify` (models.pipeline.door), as HTTP decides
it, on an API key in the metadata `authorization: Bearer wq_...` (remembered for a second by
web.keycache); WHISPERQ_ADMIN_TOKEN as a bearer is an admin, and no key at all is anonymous
use only where WHISPERQ_ALLOW_ANONYMOUS is on. An unknown or revoked key is refused, even where
anonymous use is allowed."""

from __future__ import annotations

from collections.abc import Iterable

from models.access.apikeys import BadKey, Principal
from models.jobs.operations import ANY
from models.pipeline.door import identify
from models.runtime import Runtime

from ..keycache import keys

HOW = "send it as the metadata 'authorization: Bearer <key>'"


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The call's bearer token; None without `authorization` metadata, BadKey for one that is
    not `Bearer <token>`."""
    auth = next((v for k, v in metadata or () if k.lower() == "authorization"), None)
    if auth is None:
        return None
    if isinstance(auth, bytes):
        auth = auth.decode("latin-1")
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise BadKey("send the API key as the metadata 'authorization: Bearer <key>'")
    return token


def principal(rt: Runtime, metadata: Iterable[tuple[str, str | bytes]] | None) -> Principal:
    return identify(rt, token=bearer_token(metadata), how=HOW, lookup=keys.by_token)


def scope(who: Principal) -> object:
    """Whose jobs the caller may see: all of them for an admin, else its owner's."""
    return ANY if who.admin else who.owner
