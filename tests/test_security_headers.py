"""Security headers (web/security.py) on pages, the API, errors and static files, and
templates that the pages' Content-Security-Policy does not break."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import make_job

TEMPLATES = Path(__file__).resolve().parent.parent / "web" / "templates"
COMMON = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def directives(policy: str) -> dict[str, str]:
    return {part.split()[0]: " ".join(part.split()[1:]) for part in policy.split(";") if part.strip()}


def assert_common(resp) -> None:
    for name, value in COMMON.items():
        assert resp.headers.get(name) == value, (resp.request.path, name)
    permissions = resp.headers["Permissions-Policy"]
    assert "camera=()" in permissions and "geolocation=()" in permissions and "microphone=()" in permissions


def test_pages_get_a_strict_content_security_policy(client):
    resp = client.get("/")
    assert resp.status_code == 200 and resp.mimetype == "text/html"
    assert_common(resp)
    csp = directives(resp.headers["Content-Security-Policy"])
    assert csp == {
        "default-src": "'self'",
        "script-src": "'self'",
        "style-src": "'self'",
        "img-src": "'self' data:",
        "connect-src": "'self'",
        "frame-ancestors": "'none'",
        "base-uri": "'none'",
        "form-action": "'self'",
        "object-src": "'none'",
    }
    assert "Strict-Transport-Security" not in resp.headers  # plain http
    assert "no-store" not in resp.headers.get("Cache-Control", "")


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/v1/jobs"),
        ("get", "/v1/jobs/no-such-job"),
        ("delete", "/v1/jobs"),
        ("get", "/v1/models"),
        ("get", "/v1/nothing-here"),
        ("get", "/v1/admin/dead-letters"),
    ],
)
def test_api_responses_are_never_cached_and_allow_nothing(client, method, path):
    resp = getattr(client, method)(path)
    assert resp.mimetype == "application/json", resp.status_code
    assert resp.headers["Cache-Control"] == "no-store"
    assert_common(resp)
    csp = directives(resp.headers["Content-Security-Policy"])
    assert csp["default-src"] == "'none'" and csp["frame-ancestors"] == "'none'"


def test_a_405_names_the_allowed_methods(client):
    resp = client.delete("/v1/jobs")
    assert resp.status_code == 405
    assert set(resp.headers["Allow"].split(", ")) >= {"GET", "POST"}


def test_the_job_page_is_not_cached(client, app):

    job = make_job(
        app.extensions["whisperq"],
        None,
        filename="a.mp3",
        duration=1.0,
        language=None,
        priority="normal",
        audio_url="http://127.0.0.1:9/a.mp3",
    )
    resp = client.get(f"/jobs/{job.id}")
    assert resp.status_code == 200
    assert resp.headers["Cache-Control"] == "no-store"
    assert directives(resp.headers["Content-Security-Policy"])["script-src"] == "'self'"


def test_other_responses_get_the_headers_too(client):
    for path in ("/healthz", "/metrics", "/openapi.json", "/static/upload.js", "/static/style.css"):
        resp = client.get(path)
        assert resp.status_code == 200, path
        assert_common(resp)
        assert "Content-Security-Policy" in resp.headers
        resp.close()


def test_hsts_only_over_https(client):
    assert "Strict-Transport-Security" in client.get("/healthz", base_url="https://localhost").headers
    hsts = client.get("/", base_url="https://localhost").headers["Strict-Transport-Security"]
    assert "max-age=31536000" in hsts
    # No proxy is configured as trusted: a client cannot claim https with a header.
    assert "Strict-Transport-Security" not in client.get("/healthz", headers={"X-Forwarded-Proto": "https"}).headers


@pytest.mark.parametrize("template", sorted(p.name for p in TEMPLATES.glob("*.html")))
def test_templates_need_nothing_the_policy_blocks(template):
    text = (TEMPLATES / template).read_text()
    for tag in re.findall(r"<script\b[^>]*>", text, flags=re.I):
        assert "src=" in tag, f"inline script in {template}: {tag}"
    assert not re.search(r"<style\b", text, flags=re.I), f"inline <style> in {template}"
    assert not re.search(r"\sstyle\s*=", text, flags=re.I), f"style attribute in {template}"
    assert not re.search(r"\son[a-z]+\s*=", text, flags=re.I), f"event handler attribute in {template}"
    assert "javascript:" not in text.lower(), f"javascript: URL in {template}"


WATCH_CSP = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + e.sourceFile + ":" + e.lineNumber);
});
"""


@pytest.mark.integration
def test_the_pages_run_in_a_browser_without_a_policy_violation(live_server, app, tmp_path):
    from test_browser import start_chromium

    from models.jobs.operations import complete_job

    rt = app.extensions["whisperq"]
    job = make_job(
        rt, None, filename="a.mp3", duration=1.0, language=None, priority="normal", audio_url="http://127.0.0.1:9/a.mp3"
    )
    complete_job(
        rt,
        job.id,
        {
            "text": "Hello.",
            "language": "en",
            "duration": 1.0,
            "segments": [{"start": 0.0, "end": 1.0, "text": " Hello."}],
        },
    )
    browser = start_chromium(tmp_path / "profile")
    try:
        # Runs before any of the page's own scripts, and the policy does not apply to it.
        browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_CSP})
        for path in ("/", f"/jobs/{job.id}"):
            browser.get(live_server + path)
            loaded = browser.execute_script(
                "return performance.getEntriesByType('resource').map(function (e) { return e.name; });"
            )
            assert any(name.endswith(".js") for name in loaded) and any(name.endswith("style.css") for name in loaded)
            if path != "/":
                browser.find_element("id", "copy").click()  # job.js: a CSSOM style, which the policy allows
            assert browser.execute_script("return window.__csp;") == [], path
    finally:
        browser.quit()
