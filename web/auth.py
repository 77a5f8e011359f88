"""Who is asking: API keys for services, a signed session cookie for the web page.

- `Authorization: Bearer wq_...` is an API key (models.access.apikeys); WHISPERQ_ADMIN_TOKEN as
  a bearer acts as an admin. An unknown or revoked key is refused with 401, even where
  anonymous use is allowed: a client that sends a key means to use it. (There, a bearer
  that is no whisperq key at all, such as the "unused" OpenAI's SDKs must send, is
  ignored.)
- The web page signs in with a key once (/login); the session cookie (HttpOnly,
  SameSite=Lax, signed with WHISPERQ_SECRET_KEY) then carries the key's id, and every
  request that changes something must bring the session's CSRF token, in the form field
  `csrf_token` or the `X-CSRF-Token` header.
- With WHISPERQ_ALLOW_ANONYMOUS (on with `make run`, off otherwise) a request with no
  key acts anonymously: it sees the anonymous jobs only, and the upload page needs no
  sign-in. A browser is a confused deputy there, so anonymous requests must name a Host
  this server serves (a DNS rebinding names another), an anonymous change must not come
  from another site (Sec-Fetch-Site, else Origin), and anonymous jobs get at most
  WHISPERQ_ANONYMOUS_MAX_PRIORITY.
"""

from __future__ import annotations

import hmac
import secrets
from datetime import timedelta
from urllib.parse import urlsplit

from flask import Flask, current_app, g, redirect, request, session, url_for

from models.access.apikeys import BadKey, Principal
from models.errors import Forbidden, Unauthorized
from models.pipeline.door import identify

from .keycache import keys

# Blueprints whose requests act for someone; the rest (health, metrics, static files,
# the API description) answer everyone or check their own token.
_ACTING = ("api", "batches", "openai", "pages", "admin")
_OPEN_PAGES = ("pages.login", "pages.logout")
_UNSAFE = ("POST", "PUT", "PATCH", "DELETE")
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"


class NotSignedIn(Unauthorized):
    """No key, on an install that does not allow anonymous use."""


def init_app(app: Flask) -> None:
    settings = app.extensions["whisperq"].settings
    app.secret_key = settings.session_secret()
    app.config.update(
        SESSION_COOKIE_NAME="whisperq_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=(settings.public_url or "").startswith("https://"),
        PERMANENT_SESSION_LIFETIME=timedelta(hours=12),
    )
    app.before_request(_identify)
    app.context_processor(lambda: {"csrf_token": csrf_token, "principal": g.get("principal")})


def _identify():
    if request.blueprint not in _ACTING:
        return None
    check_host()
    if request.endpoint in _OPEN_PAGES:
        return None
    try:
        g.principal = principal()
    except NotSignedIn:
        if request.blueprint == "pages":
            return redirect(url_for("pages.login", next=request.full_path.rstrip("?")))
        raise
    if request.method in _UNSAFE and g.principal.anonymous:
        check_same_site()
    # The upload page checks its token itself, after the cheap checks and before the body.
    if request.method in _UNSAFE and g.get("by_cookie") and request.endpoint != "pages.upload":
        check_csrf(header_only=request.blueprint != "pages")
    return None


def check_host() -> None:
    """The Host must be one this server serves (Settings.served_hosts): a page on another
    site that points its own name at 127.0.0.1 must not reach the API through the browser."""
    served = current_app.extensions["whisperq"].settings.served_hosts()
    if served is None:
        return
    host = request.host.lower()
    if host.startswith("["):
        name = host[1:].split("]", 1)[0]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name not in served:
        raise Forbidden(
            f"this server does not serve the host {name!r}; use one of {', '.join(sorted(set(served)))} "
            "(an operator adds names with WHISPERQ_ALLOWED_HOSTS)"
        )


def check_same_site() -> None:
    """An anonymous change must come from this site or from no site at all (a script, a
    service): a page elsewhere must not submit, cancel or delete on a visitor's behalf."""
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site is not None:
        if fetch_site.lower() not in ("same-origin", "none"):
            raise Forbidden("a page on another site may not change jobs here; open this server's own page")
        return
    origin = request.headers.get("Origin")
    if origin is not None and origin != "null":
        parts = urlsplit(origin)
        if (parts.netloc or "").lower() != request.host.lower():
            raise Forbidden("a page on another site may not change jobs here; open this server's own page")
    elif origin == "null":
        raise Forbidden("a page with no origin may not change jobs here; open this server's own page")


def bearer_token() -> str | None:
    """The request's bearer token; None without an Authorization header, BadKey (401)
    for one that is not `Bearer <token>`."""
    auth = request.headers.get("Authorization")
    if auth is None:
        return None
    scheme, _, token = auth.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise BadKey("send the API key as 'Authorization: Bearer <key>'")
    return token


HOW = "send it as 'Authorization: Bearer <key>'"


def principal() -> Principal:
    """The one door's `identify` on the request's bearer token, else its signed-in session (a
    browser whose key was revoked is signed out), else anonymous use where it is allowed."""
    rt = current_app.extensions["whisperq"]
    token = bearer_token()
    if token is not None:  # a verified key is remembered for a second (web.keycache)
        return identify(rt, token=token, how=HOW, lookup=keys.by_token)
    key_id = session.get("key_id")
    if key_id:
        found = keys.by_key_id(rt, key_id)
        if found is not None:
            g.by_cookie = True
            return found
        session.clear()  # its key was revoked: sign the browser out
    try:
        who = identify(rt, how=HOW)
    except Unauthorized as exc:
        raise NotSignedIn(str(exc)) from None
    g.by_cookie = request.blueprint == "pages"
    return who


def current() -> Principal:
    return g.principal


def csrf_token() -> str:
    token = session.get("csrf")
    if not token:
        token = session["csrf"] = secrets.token_urlsafe(32)
    return token


def check_csrf(header_only: bool = False) -> None:
    """The session's token must come back with any change made through the cookie: a
    page on another site can make the browser send the cookie, but cannot read the token."""
    expected = session.get("csrf")
    sent = request.headers.get(CSRF_HEADER)
    if sent is None and not header_only:
        sent = request.form.get(CSRF_FIELD)
    if not expected or not sent or not hmac.compare_digest(sent.encode(), expected.encode()):
        raise Forbidden("the form's security token is missing or out of date; reload the page and try again")


def sign_in(found: Principal) -> None:
    session.clear()  # a new session: nothing from before signing in carries over
    session["key_id"] = found.owner
    session["csrf"] = secrets.token_urlsafe(32)
    session.permanent = True


def sign_out() -> None:
    session.clear()


def safe_next(target: str | None) -> str:
    """Where to go after signing in: a path on this site only, never another host."""
    if not target:
        return url_for("pages.index")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return url_for("pages.index")
    return target


def scope():
    """Whose jobs this request may see: all of them for an admin, else its owner's."""
    from models.jobs.operations import ANY

    found = g.principal
    return ANY if found.admin else found.owner
