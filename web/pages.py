"""The upload page and the job page for people using a browser.

Both pages work without JavaScript (a form POST and a refreshing job page); with it,
web/static/upload.js and web/static/job.js submit through the JSON API and update the
job page in place. The templates hand those scripts their data in data- attributes.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from flask import Blueprint, current_app, g, redirect, render_template, request, url_for

from config import LANGUAGES, PRIORITIES
from models.errors import WhisperqError
from models.jobs.operations import get_job
from models.jobs.record import Stage
from models.pipeline import intake
from models.speech.formats import FORMATS

from . import auth
from .admission import admit_submission
from .uploads import upload_submission

bp = Blueprint("pages", __name__)

# What a person reads for each status; job.js gets the same table through the page.
STATUS_LABELS = {
    "PENDING": "Waiting in the queue",
    "PROCESSING": "Transcribing",
    "COMPLETED": "Done",
    "FAILED": "Failed",
    "CANCELLED": "Cancelled",
    "EXPIRED": "Expired",
}
# What a running job is doing (its `stage`), and the line under the status otherwise.
STAGE_LABELS = {
    Stage.PREPARE.value: "Decoding the audio",
    Stage.QUEUED.value: "Waiting for the speech model",
    Stage.INFER.value: "Recognising speech",
    Stage.ANALYSIS.value: "Finding speakers and what to hide",
}
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED")
# A word the model was less sure of than this is marked on the job page (job.js's LOW too).
LOW_CONFIDENCE = 0.5
FORMAT_LABELS = {"txt": "Text", "json": "JSON", "srt": "Subtitles (SRT)", "vtt": "Subtitles (WebVTT)"}
PRIORITY_HINTS = {"high": "ahead of the rest", "normal": "the usual", "low": "when the queue is quiet"}

# Whisper's language codes with the names people know them by.
_NAMES = dict(
    pair.split(" ", 1)
    for pair in (
        "af Afrikaans|am Amharic|ar Arabic|as Assamese|az Azerbaijani|ba Bashkir|be Belarusian|bg Bulgarian|"
        "bn Bengali|bo Tibetan|br Breton|bs Bosnian|ca Catalan|cs Czech|cy Welsh|da Danish|de German|el Greek|"
        "en English|es Spanish|et Estonian|eu Basque|fa Persian|fi Finnish|fo Faroese|fr French|gl Galician|"
        "gu Gujarati|ha Hausa|haw Hawaiian|he Hebrew|hi Hindi|hr Croatian|ht Haitian Creole|hu Hungarian|"
        "hy Armenian|id Indonesian|is Icelandic|it Italian|ja Japanese|jw Javanese|ka Georgian|kk Kazakh|km Khmer|"
        "kn Kannada|ko Korean|la Latin|lb Luxembourgish|ln Lingala|lo Lao|lt Lithuanian|lv Latvian|mg Malagasy|"
        "mi Maori|mk Macedonian|ml Malayalam|mn Mongolian|mr Marathi|ms Malay|mt Maltese|my Burmese|ne Nepali|"
        "nl Dutch|nn Norwegian Nynorsk|no Norwegian|oc Occitan|pa Punjabi|pl Polish|ps Pashto|pt Portuguese|"
        "ro Romanian|ru Russian|sa Sanskrit|sd Sindhi|si Sinhala|sk Slovak|sl Slovenian|sn Shona|so Somali|"
        "sq Albanian|sr Serbian|su Sundanese|sv Swedish|sw Swahili|ta Tamil|te Telugu|tg Tajik|th Thai|tk Turkmen|"
        "tl Tagalog|tr Turkish|tt Tatar|uk Ukrainian|ur Urdu|uz Uzbek|vi Vietnamese|yi Yiddish|yo Yoruba|"
        "zh Chinese|yue Cantonese"
    ).split("|")
)


def _multilingual() -> bool:
    """Whether a served model is multilingual (any language, translation), as far as this
    process can tell."""
    from models.registry.catalog import multilingual

    settings = current_app.extensions["whisperq"].settings
    try:
        return any(multilingual(settings, spec.name) for spec in settings.models)
    except Exception:  # a model cannot be found here: offer everything, the API decides
        return True


def _languages() -> list[tuple[str, str]]:
    """(code, name) pairs the served models can take, by name: with English-only models alone
    only English is offered, so nobody picks a language that is then refused."""
    codes = LANGUAGES if _multilingual() else {"en"}
    return sorted(((code, _NAMES.get(code, code)) for code in codes), key=lambda pair: pair[1])


def _page_options() -> tuple[list, dict[str, str]]:
    """The options the page offers beyond language, model and priority (models.pipeline.request
    declares them), and why any of them cannot be asked for here: translation without a
    multilingual model, an analysis this deployment has not installed."""
    from models.analysis import MODULES, analysis
    from models.pipeline.request import page_options

    offered = [o for o in page_options() if o.control not in ("language", "model", "priority")]
    unavailable = {}
    for o in offered:
        if o.name in MODULES:
            missing = analysis(o.name).missing()
            if missing is not None:
                unavailable[o.name] = f"Not installed on this server: {missing}"
    if not _multilingual():
        offered = [o for o in offered if o.control != "task"]  # nothing to translate with
    return offered, unavailable


def _form(error: str | None = None, status: int = 200):
    settings = current_app.extensions["whisperq"].settings
    options, unavailable = _page_options()
    return (
        render_template(
            "index.html",
            error=error,
            # Only what this visitor may ask for (a tier, or anonymous use, caps it).
            priorities=PRIORITIES[PRIORITIES.index(g.principal.max_priority) :] if g.get("principal") else PRIORITIES,
            priority_hints=PRIORITY_HINTS,
            languages=_languages(),
            models=[spec.name for spec in settings.models],
            default_model=settings.default_model,
            max_mb=settings.max_upload_mb,
            form=request.form,
            options=options,
            unavailable=unavailable,
            more_open=any(request.form.get(o.name) for o in options),
        ),
        status,
    )


@bp.get("/")
def index():
    return _form()


@bp.post("/")
def upload():
    try:
        admit_submission("form")
        auth.check_csrf()
        form = request.form.copy()
        form.pop(auth.CSRF_FIELD, None)
        rt = current_app.extensions["whisperq"]
        job, _ = intake.submit(
            rt, upload_submission(rt, g.principal, "form", request.files.get("file"), form, request.files)
        )
    except WhisperqError as exc:
        return _form(str(exc), exc.http_status)
    return redirect(url_for("pages.job", job_id=job.id), code=303)


@bp.get("/jobs/<job_id>")
def job(job_id: str):
    data = get_job(current_app.extensions["whisperq"], job_id, owner=auth.scope()).to_dict()
    status_url = url_for("api.show", job_id=job_id)
    downloads = {f: url_for("api.transcript", job_id=job_id, format=f, download=1) for f in FORMATS}
    return render_template(
        "job.html",
        job=data,
        status_url=status_url,
        cancel_url=status_url + "/cancel",
        downloads=downloads,
        format_labels=FORMAT_LABELS,
        labels=STATUS_LABELS,
        stages=STAGE_LABELS,
        finished=data["status"] in FINISHED,
        low=LOW_CONFIDENCE,
    )


@bp.route("/login", methods=["GET", "POST"])
def login():
    """Sign the browser in with an API key; the session cookie carries the key's id."""
    from models.access.apikeys import authenticate

    target = auth.safe_next(request.values.get("next"))
    if request.method == "GET":
        return render_template("login.html", next=target, error=None)
    error, status = None, 200
    try:
        auth.check_csrf()
        found = authenticate(current_app.extensions["whisperq"], (request.form.get("key") or "").strip())
    except WhisperqError as exc:
        error, status = str(exc), exc.http_status
    if error is not None:
        return render_template("login.html", next=target, error=error), status
    auth.sign_in(found)
    return redirect(target, code=303)


@bp.post("/logout")
def logout():
    auth.check_csrf()
    auth.sign_out()
    return redirect(url_for("pages.login"), code=303)


@bp.app_template_filter("clock")
def clock(seconds: float | None) -> str:
    """`mm:ss.s` (with hours in front past the hour), as job.js writes it."""
    tenths = max(0, math.floor(float(seconds or 0) * 10 + 0.5))  # rounds halves up, as JavaScript does
    hours, tenths = divmod(tenths, 36000)
    minutes, tenths = divmod(tenths, 600)
    text = f"{minutes:02d}:{tenths // 10:02d}.{tenths % 10}"
    return f"{hours}:{text}" if hours else text


@bp.app_template_filter("from_now")
def from_now(iso: str | None) -> str | None:
    """ "about 20 s" / "about 3 min" until an ISO time, "a moment" if it has passed; None
    if there is no time. job.js writes the same words."""
    if not iso:
        return None
    try:
        when = datetime.fromisoformat(str(iso).replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return about((when - datetime.now(UTC)).total_seconds())


@bp.app_template_filter("sentence")
def sentence(message: str | None) -> str:
    """An error as a sentence: capital first, a full stop last (job.js does the same)."""
    text = str(message or "").strip()
    if not text:
        return ""
    return text[0].upper() + text[1:] + ("" if text[-1] in ".!?" else ".")


def about(seconds: float) -> str:
    if seconds < 5:
        return "a moment"
    if seconds < 55:
        return f"about {int(round(seconds / 5) * 5)} s"
    if seconds < 90 * 60:
        return f"about {max(1, round(seconds / 60))} min"
    return f"about {round(seconds / 3600)} h"
