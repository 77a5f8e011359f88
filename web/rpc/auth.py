"""Who a gRPC call acts for, decided as web.auth decides for HTTP: an API key in the metadata
`authorization: Bearer wq_...` (verified by models.access.apikeys.authenticate, remembered for a
second by web.keycache), WHISPERQ_ADMIN_TOKEN as a bearer for an admin, and no key at all only
where WHISPERQ_ALLOW_ANONYMOUS is on (there, a bearer that is no whisperq key is ignored, as
HTTP ignores it). An unknown or revoked key is refused, even where anonymous use is allowed."""

from __future__ import annotations

from collections.abc import Iterable

from models.access.apikeys import PREFIX, BadKey, Principal
from models.errors import Unauthorized
from models.jobs.operations import ANY
from models.runtime import Runtime

from ..auth import anonymous, matches
from ..keycache import keys


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
    token = bearer_token(metadata)
    if token is not None:
        if matches(token, rt.settings.admin_token):
            return Principal(owner=None, tier="premium", admin=True, name="admin token")
        if rt.settings.allow_anonymous and not token.startswith(PREFIX):
            return anonymous(rt.settings)
        return keys.by_token(rt, token)
    if rt.settings.allow_anonymous:
        return anonymous(rt.settings)
    raise Unauthorized(
        "this server needs an API key: send it as the metadata 'authorization: Bearer <key>' (an "
        "operator creates one with `whisperq keys create`)"
    )


def scope(who: Principal) -> object:
    """Whose jobs the caller may see: all of them for an admin, else its owner's."""
    return ANY if who.admin else who.owner
