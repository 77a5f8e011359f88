"""Security headers on every response, set in one place.

Pages get a Content-Security-Policy that allows only this site's own scripts, styles and
images: the templates carry no inline script, style attribute or event handler (the
scripts read their data from data- attributes), so nothing else is needed. Other
responses (JSON, transcripts, metrics) get a policy that allows nothing at all.
Responses under /v1/ and the job pages hold transcripts: no cache may keep them.
Strict-Transport-Security goes only on requests that came over https (request.is_secure).
The app itself trusts no X-Forwarded-Proto; gunicorn (the Procfile's web process) turns
that header into https only from the proxies it trusts, FORWARDED_ALLOW_IPS (default:
this host only), so a TLS-terminating proxy on this host, or one named there, gets it.
"""

from __future__ import annotations

from flask import Flask, Response, request

PAGE_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "object-src 'none'",
    )
)
# Anything that is not a page runs nothing and may not be framed.
OTHER_POLICY = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # job URLs are not for other sites' logs
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    # No page asks for these; recording in the browser would need `microphone=(self)`.
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=(), usb=()",
}
HSTS = "max-age=31536000; includeSubDomains"
PRIVATE_PREFIXES = ("/v1/", "/jobs/")


def add_security_headers(response: Response) -> Response:
    headers = response.headers
    for name, value in HEADERS.items():
        headers.setdefault(name, value)
    headers.setdefault("Content-Security-Policy", PAGE_POLICY if response.mimetype == "text/html" else OTHER_POLICY)
    if request.is_secure:
        headers.setdefault("Strict-Transport-Security", HSTS)
    if request.path.startswith(PRIVATE_PREFIXES):
        headers["Cache-Control"] = "no-store"
    return response


def init_app(app: Flask) -> None:
    app.after_request(add_security_headers)
