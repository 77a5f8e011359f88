"""The upload form and the job page, through Flask's client (no worker, no browser).

The job page is rendered from stub jobs here, so every state and every optional field
(queue position, progress, estimates, words, a partial transcript) is covered whatever
the job store holds; tests/test_browser.py drives the same pages in Chromium."""

import html
import re
from datetime import UTC, datetime, timedelta

import pytest
from api import upload
from helpers import RESULT_WITH_WORDS, stored_files


def test_form_offers_file_language_and_priority(client):
    page = client.get("/").get_data(as_text=True)
    assert 'enctype="multipart/form-data"' in page and 'action="/"' in page
    # a real file input inside a <label>, in the drop zone, described by the file-info line
    label = re.search(r'<label for="file">(.*?)</label>', page, re.S)
    assert label and 'type="file"' in label.group(1) and 'name="file"' in label.group(1)
    assert 'id="dropzone"' in page and 'aria-describedby="file-info"' in page
    language = re.search(r'<select name="language".*?</select>', page, re.S).group(0)
    assert re.search(r'<option value="">Auto-detect</option>', language)
    assert "selected" not in language  # auto-detect is the default
    assert 'value="en"' in language and ">English<" in language
    radios = re.findall(r'<input type="radio" name="priority" value="(\w+)"( checked)?>', page)
    assert [v for v, _ in radios] == ["high", "normal", "low"] and dict(radios)["normal"] == " checked"
    assert "200 MB" in page
    assert f'data-max-bytes="{200 * 1024 * 1024}"' in page and 'data-max-mb="200"' in page
    assert 'data-api-url="/v1/jobs"' in page and 'data-job-url="/jobs/JOB_ID"' in page
    assert 'id="error"' in page and 'role="alert"' in page and 'id="upload-progress"' in page


def test_an_english_only_model_offers_english_alone(settings, database):
    """Serving tiny.en alone, other languages would only be refused; with base beside it, they
    are offered, and so is the choice of model."""
    import dataclasses

    from web import create_app

    alone = dataclasses.replace(settings, models=settings.models[:1], default_model=settings.models[0].name)
    page = create_app({"SETTINGS": alone, "TESTING": True}).test_client().get("/").get_data(as_text=True)
    language = re.search(r'<select name="language".*?</select>', page, re.S).group(0)
    assert re.findall(r'<option value="(\w*)"', language) == ["", "en"]
    assert 'name="model"' not in page
    page = create_app({"SETTINGS": settings, "TESTING": True}).test_client().get("/").get_data(as_text=True)
    language = re.search(r'<select name="language".*?</select>', page, re.S).group(0)
    assert "de" in re.findall(r'<option value="(\w*)"', language)
    models = re.search(r'<select name="model".*?</select>', page, re.S).group(0)
    assert re.findall(r'<option value="([\w.]*)"( selected)?', models) == [
        ("tiny.en", " selected"),
        ("base", ""),
        ("next", ""),
    ]


def test_pages_load_only_local_scripts_and_styles(client):
    for path in ("/", "/jobs/does-not-exist"):
        page = client.get(path, headers={"Accept": "text/html"}).get_data(as_text=True)
        assert not re.search(r'(src|href)="(https?:)?//', page), page  # air-gapped: nothing from elsewhere
    page = client.get("/").get_data(as_text=True)
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/upload.js" defer>']
    for name, kind in (("upload.js", "javascript"), ("job.js", "javascript"), ("style.css", "text/css")):
        resp = client.get(f"/static/{name}")
        assert resp.status_code == 200 and kind in resp.content_type
        body = resp.get_data(as_text=True)
        assert "http://" not in body and "https://" not in body and "@import" not in body
        resp.close()


def csrf(client) -> str:
    """The session's CSRF token, as the form carries it (web/auth.py)."""
    return re.search(r'name="csrf_token" value="([^"]+)"', client.get("/").get_data(as_text=True)).group(1)


def test_form_upload_redirects_to_the_job_page(client, published):
    resp = upload(client, path="/", priority="low", language="", csrf_token=csrf(client))
    assert resp.status_code == 303
    job_id = resp.headers["Location"].rsplit("/", 1)[-1]
    assert len(published) == 1 and published[0][0]["id"] == job_id
    page = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert job_id in page and "fox.flac" in page
    assert 'id="status"' in page and f'data-status-url="/v1/jobs/{job_id}"' in page  # job.js polls the API
    assert f'data-cancel-url="/v1/jobs/{job_id}/cancel"' in page
    assert '<noscript><meta http-equiv="refresh" content="2"></noscript>' in page  # and without JS it refreshes
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/job.js" defer>']
    # Workers from other tests may already have taken the job.
    status = re.search(r'data-status="([A-Z]+)"', page).group(1)
    assert status in ("PENDING", "PROCESSING", "COMPLETED")
    assert status != "PENDING" or "Waiting in the queue" in page
    for fmt in ("txt", "json", "srt", "vtt"):
        assert f"format={fmt}" in page


def test_form_shows_the_error_and_keeps_nothing(client, settings, published):
    before = stored_files(settings)
    resp = upload(client, "x.mp3", data=b"not audio at all" * 100, path="/", csrf_token=csrf(client))
    assert resp.status_code == 415
    page = resp.get_data(as_text=True)
    alert = re.search(r'<p class="error" role="alert" id="error">(.*?)</p>', page, re.S)
    assert alert and "could not be decoded as audio" in alert.group(1)
    assert 'name="file"' in page  # the form is shown again
    assert stored_files(settings) == before and published == []


def test_form_without_its_csrf_token_is_refused_and_keeps_nothing(client, settings, published):
    before = stored_files(settings)
    resp = upload(client, path="/", csrf_token="forged")
    assert resp.status_code == 403
    assert "security token" in resp.get_data(as_text=True)
    assert stored_files(settings) == before and published == []


def test_form_keeps_the_chosen_options_after_an_error(client):
    resp = upload(client, None, path="/", priority="high", language="en", csrf_token=csrf(client))
    assert resp.status_code == 400
    page = resp.get_data(as_text=True)
    assert "No audio file: send it as the multipart form field" in page
    assert '<input type="radio" name="priority" value="high" checked>' in page
    assert '<option value="en" selected>' in page


def test_job_page_for_unknown_id_is_a_404_page(client):
    resp = client.get("/jobs/does-not-exist", headers={"Accept": "text/html"})
    assert resp.status_code == 404
    assert "no job with id" in resp.get_data(as_text=True)


# --- the job page in each state, from stub jobs ---------------------------------------


class StubJob:
    def __init__(self, **fields):
        self.id = fields.setdefault("job_id", "stub-job")
        self.fields = fields

    def to_dict(self):
        base = {
            "status": "PENDING",
            "filename": "talk.mp3",
            "priority": "normal",
            "language": None,
            "audio_duration": 75.25,
            "error": None,
            "result": None,
        }
        return dict(base, **self.fields)


@pytest.fixture()
def job_page(client, monkeypatch):
    def render(**fields):
        monkeypatch.setattr("web.pages.get_job", lambda rt, job_id, owner=None: StubJob(**fields))
        resp = client.get("/jobs/stub-job")
        assert resp.status_code == 200
        return resp.get_data(as_text=True)

    return render


def element(page, id_):
    """(the opening tag, the text inside, whitespace collapsed)"""
    match = re.search(rf'(<(\w+)[^>]*\bid="{id_}"[^>]*>)(.*?)</\2>', page, re.S)
    assert match, f"no element #{id_}"
    return match.group(1), " ".join(html.unescape(re.sub(r"<[^>]+>", "", match.group(3))).split())


def test_a_waiting_job_shows_its_place_and_estimates(job_page):
    soon = datetime.now(UTC) + timedelta(seconds=21)
    later = datetime.now(UTC) + timedelta(seconds=65)
    page = job_page(
        status="PENDING",
        queue_position=3,
        progress=0.0,
        estimated_start_at=soon.isoformat().replace("+00:00", "Z"),
        estimated_finish_at=later.isoformat().replace("+00:00", "Z"),
    )
    assert element(page, "status")[1] == "Waiting in the queue"
    assert element(page, "queue")[1] == "3 jobs ahead of yours"
    assert element(page, "eta")[1] == "Starts in about 20 s · done in about 1 min"
    tag, _ = element(page, "progress")
    assert "hidden" not in tag
    assert "hidden" in element(page, "result")[0] and "hidden" in element(page, "error")[0]
    assert '<meta http-equiv="refresh"' in page
    assert "01:15.3" in page  # the length as mm:ss.s


def test_a_job_without_the_optional_fields_still_renders(job_page):
    page = job_page(status="PROCESSING", queue_position=None, progress=None, estimated_start_at=None)
    assert element(page, "status")[1] == "Transcribing"
    assert "hidden" in element(page, "queue")[0] and "hidden" in element(page, "eta")[0]
    assert "value=" not in element(page, "progress")[0]  # an indeterminate bar
    page = job_page(status="PROCESSING", stage="prepare")  # the keys missing altogether
    assert element(page, "status")[1] == "Transcribing" and "hidden" in element(page, "queue")[0]
    assert element(page, "status-detail")[1] == "Decoding the audio"


def test_a_running_job_has_no_place_in_the_queue(job_page):
    """The API gives a job on the speech model queue_position 0: it is not "next" any more."""
    page = job_page(
        status="PROCESSING", stage="infer", queue_position=0, progress=0.25, estimated_start_at="2020-01-01T00:00:00Z"
    )
    assert "hidden" in element(page, "queue")[0] and "hidden" in element(page, "eta")[0]
    assert 'value="0.25"' in element(page, "progress")[0]
    page = job_page(status="PROCESSING", stage="prepare", queue_position=1)  # decoded, waiting for the model
    assert element(page, "queue")[1] == "1 job ahead of yours"
    page = job_page(status="PENDING", queue_position=0)
    assert element(page, "queue")[1] == "Yours is next in the queue"


def test_the_job_page_hands_job_js_its_data_in_attributes(job_page):
    page = job_page(status="PENDING", cancel_url="/v1/jobs/stub-job/cancel?x=1")
    root = re.search(r'<article id="job"[^>]*>', page, re.S).group(0)
    assert 'data-cancel-url="/v1/jobs/stub-job/cancel?x=1"' in root
    labels = html.unescape(re.search(r'data-labels="([^"]*)"', root).group(1))
    import json

    assert json.loads(labels)["CANCELLED"] == "Cancelled"
    assert 'id="cancel"' in page and re.search(r'<button type="button" id="cancel"[^>]*hidden', page)  # JS shows it


def test_a_completed_job_shows_the_transcript_words_and_downloads(job_page):
    page = job_page(status="COMPLETED", progress=1.0, result=RESULT_WITH_WORDS)
    assert element(page, "status")[1] == "Done"
    assert "refresh" not in page and "hidden" in element(page, "progress")[0]
    assert "hidden" not in element(page, "result")[0] and "hidden" in element(page, "partial-note")[0]
    assert element(page, "full-text")[1] == "Hello there. General Kenobi."
    items = re.findall(r"<li><time[^>]*>([^<]*)</time>\s*<span class=\"text\">(.*?)</span></li>", page, re.S)
    assert [t for t, _ in items] == ["00:00.0", "01:01.3"]
    assert '<span class="word" title="00:00.6"> there.</span>' in items[0][1]
    assert items[1][1] == " General Kenobi."
    links = dict(re.findall(r'href="([^"]+)" data-format="(\w+)" download>', page))
    assert sorted(links.values()) == ["json", "srt", "txt", "vtt"]
    for href, fmt in links.items():
        assert href == f"/v1/jobs/stub-job/transcript?format={fmt}&amp;download=1"
    assert re.search(r'<button type="button" id="copy"[^>]*>Copy text</button>', page)


def test_a_failed_or_expired_job_shows_why(job_page):
    page = job_page(status="FAILED", error="the file could not be decoded as audio")
    assert element(page, "status")[1] == "Failed"
    tag, text = element(page, "error")
    assert "hidden" not in tag and text == "The file could not be decoded as audio."
    page = job_page(status="EXPIRED", error="the job was not started within its time-to-live (WHISPERQ_JOB_TTL)")
    assert element(page, "status")[1] == "Expired" and "WHISPERQ_JOB_TTL" in element(page, "error")[1]


def test_a_cancelled_job_shows_its_partial_transcript(job_page):
    result = {"text": "the first part", "partial": True, "segments": [{"start": 0, "end": 2, "text": "the first part"}]}
    page = job_page(status="CANCELLED", error="cancelled by the client", result=result)
    assert element(page, "status")[1] == "Cancelled"
    assert "hidden" in element(page, "error")[0]  # cancelling is no error
    assert "hidden" not in element(page, "partial-note")[0] and "partial" in element(page, "partial-note")[1]
    assert element(page, "full-text")[1] == "the first part"
    assert "hidden" in element(page, "downloads")[0]
    page = job_page(status="CANCELLED", result=None)
    assert "hidden" in element(page, "result")[0]


@pytest.mark.parametrize(
    "seconds, words",
    [
        (0, "a moment"),
        (4, "a moment"),
        (21, "about 20 s"),
        (54, "about 55 s"),
        (60, "about 1 min"),
        (150, "about 2 min"),
        (3 * 3600, "about 3 h"),
    ],
)
def test_relative_times(seconds, words):
    from web.pages import about

    assert about(seconds) == words


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "00:00.0"),
        (4.24, "00:04.2"),
        (61.25, "01:01.3"),
        (599.96, "10:00.0"),
        (3725.5, "1:02:05.5"),
        (None, "00:00.0"),
    ],
)
def test_clock(seconds, text):
    from web.pages import clock

    assert clock(seconds) == text
