"""A person in a real browser (headless Chromium): pick a file, submit, watch the job
finish without reloading, read the transcript with its timestamps, download subtitles;
and see why an upload was refused, in words, on the form.

The first test runs real workers; the others need none: they drive the same pages with
the job API answered by a stub, so that every state and optional field is seen."""

import math
import re
import shutil
from datetime import UTC, datetime, timedelta

import pytest
from helpers import CLIPS, RESULT_WITH_WORDS, need_service, word_error_rate

pytestmark = pytest.mark.integration

FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "EXPIRED"}


def start_chromium(profile, javascript: bool = True):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        need_service("Debian's chromium and chromium-driver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1000,900",
    ):
        options.add_argument(flag)
    if not javascript:
        options.add_experimental_option("prefs", {"profile.managed_default_content_settings.javascript": 2})
    drv = webdriver.Chrome(service=Service(driver), options=options)
    drv.set_page_load_timeout(30)
    return drv


@pytest.fixture()
def browser(tmp_path):
    drv = start_chromium(tmp_path / "profile")
    yield drv
    drv.quit()


@pytest.fixture()
def browser_without_js(tmp_path):
    drv = start_chromium(tmp_path / "profile-nojs", javascript=False)
    yield drv
    drv.quit()


def by_id(browser, id_):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, id_)


def status_of(browser) -> str:
    return by_id(browser, "status").get_attribute("data-status")


def wait_for(browser, condition, timeout: float = 10, message: str = ""):
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    # A page that refreshes itself: an element read during the reload is missing, stale,
    # or (Chromium) "does not belong to the document"; the next poll reads the new page.
    ignored = (WebDriverException,)
    return WebDriverWait(browser, timeout, poll_frequency=0.1, ignored_exceptions=ignored).until(
        lambda b: condition(), message
    )


def check_srt(text: str) -> str:
    """Valid SubRip: cues numbered from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, text, a blank
    line between cues; returns the cues' text."""
    clock = r"(\d\d):([0-5]\d):([0-5]\d),(\d{3})"
    blocks = text.replace("\r\n", "\n").strip("\n").split("\n\n")
    assert blocks and blocks[0], text
    words, previous = [], 0.0
    for number, block in enumerate(blocks, start=1):
        lines = block.split("\n")
        assert lines[0] == str(number), block
        times = re.fullmatch(f"{clock} --> {clock}", lines[1])
        assert times, block
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, times.groups())
        start, end = h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000
        assert previous <= start <= end, block
        previous = start
        assert len(lines) > 2 and all(line.strip() for line in lines[2:]), block
        words.extend(lines[2:])
    return " ".join(words)


def test_upload_in_the_browser_and_watch_it_finish(live_server, browser, worker, celery_app, tmp_path):
    import requests
    from selenium.webdriver.common.by import By

    clip = CLIPS["fox.flac"]
    browser.get(live_server + "/")
    assert browser.title == "Transcribe audio · whisperq"
    file_input = by_id(browser, "file")
    assert file_input.is_displayed()  # a real, visible input: keyboard and screen readers reach it
    file_input.send_keys(str(clip["path"]))
    info = by_id(browser, "file-info").text
    assert info.startswith("fox.flac · ") and info.endswith(" KB"), info
    high = browser.find_element(By.CSS_SELECTOR, "input[name=priority][value=high]")
    high.click()
    assert high.is_selected()
    browser.save_screenshot(str(tmp_path / "upload-page.png"))

    with worker.paused(celery_app):  # hold the job in the queue, to see the page while it waits
        by_id(browser, "submit").click()
        wait_for(browser, lambda: "/jobs/" in browser.current_url, message="the upload did not open the job page")
        page_url = browser.current_url
        browser.execute_script("window.stillTheSamePage = true")
        wait_for(browser, lambda: status_of(browser) == "PENDING")
        assert by_id(browser, "status").text == "Waiting in the queue"
        assert by_id(browser, "progress").is_displayed() and by_id(browser, "cancel").is_displayed()
        assert not by_id(browser, "result").is_displayed()
        assert browser.find_element(By.CSS_SELECTOR, "dl.details").text.count("high") == 1
        job = requests.get(live_server + "/v1/jobs/" + page_url.rsplit("/", 1)[-1], timeout=10).json()
        if isinstance(job.get("queue_position"), int):  # where the API tells the place in the queue, so does the page
            wait_for(browser, lambda: by_id(browser, "queue").is_displayed())
            assert re.fullmatch(r"Yours is next in the queue|\d+ jobs? ahead of yours", by_id(browser, "queue").text)

    def finished():
        status, bar_shown = browser.execute_script(
            "return [document.getElementById('status').dataset.status, !document.getElementById('progress').hidden]"
        )
        assert bar_shown or status in FINISHED, f"no progress bar while {status}"
        return status in FINISHED

    wait_for(browser, finished, timeout=180, message="the job did not finish within 180 s")
    assert status_of(browser) == "COMPLETED", by_id(browser, "error").text
    assert by_id(browser, "status").text == "Done"
    assert browser.current_url == page_url and browser.execute_script("return window.stillTheSamePage") is True
    assert not by_id(browser, "progress").is_displayed() and not by_id(browser, "cancel").is_displayed()

    segments = browser.find_elements(By.CSS_SELECTOR, "#segments li")
    assert segments
    for li in segments:
        assert re.fullmatch(r"\d\d:\d\d\.\d", li.find_element(By.TAG_NAME, "time").text), li.text
    text = " ".join(li.find_element(By.CLASS_NAME, "text").text for li in segments)
    assert word_error_rate(clip["text"], text) <= 0.2, text
    assert word_error_rate(clip["text"], by_id(browser, "full-text").text) <= 0.2

    links = {
        a.get_attribute("data-format"): a.get_attribute("href")
        for a in browser.find_elements(By.CSS_SELECTOR, "#downloads a")
    }
    assert set(links) == {"txt", "json", "srt", "vtt"} and by_id(browser, "downloads").is_displayed()
    resp = requests.get(links["srt"], timeout=10)
    assert resp.status_code == 200 and resp.headers["Content-Disposition"].startswith("attachment")
    assert word_error_rate(clip["text"], check_srt(resp.text)) <= 0.2, resp.text

    by_id(browser, "copy").click()
    wait_for(browser, lambda: by_id(browser, "copy-status").text != "")

    shot = tmp_path / "job-page.png"
    browser.save_screenshot(str(shot))
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True}
    )
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    browser.save_screenshot(str(tmp_path / "job-page-phone.png"))
    print(f"screenshots: {shot} and {tmp_path / 'job-page-phone.png'}")


def test_without_javascript_the_form_and_the_refreshing_page_still_work(live_server, browser_without_js, worker):
    """No script runs: the form posts to /, the server redirects to the job page, and
    the page refreshes itself (<noscript>) until the transcript is there."""
    from selenium.webdriver.common.by import By

    browser = browser_without_js
    clip = CLIPS["fox.flac"]
    browser.get(live_server + "/")
    by_id(browser, "file").send_keys(str(clip["path"]))
    browser.find_element(By.CSS_SELECTOR, "input[name=priority][value=low]").click()
    by_id(browser, "submit").click()
    wait_for(browser, lambda: "/jobs/" in browser.current_url)
    assert browser.find_element(By.CSS_SELECTOR, "dl.details").text.count("low") == 1
    wait_for(
        browser, lambda: status_of(browser) in FINISHED, timeout=180, message="the page did not refresh to the end"
    )
    assert by_id(browser, "status").text == "Done" and not by_id(browser, "cancel").is_displayed()
    assert word_error_rate(clip["text"], by_id(browser, "full-text").text) <= 0.2
    assert by_id(browser, "downloads").is_displayed()


def test_a_bad_file_shows_the_reason_in_the_form(live_server, browser, tmp_path):
    bad = tmp_path / "notes.wav"
    bad.write_text("this is a text file, not a recording\n" * 30)
    browser.get(live_server + "/")
    browser.execute_script("window.stillTheSamePage = true")
    by_id(browser, "file").send_keys(str(bad))
    by_id(browser, "submit").click()
    alert = by_id(browser, "error")
    wait_for(browser, alert.is_displayed, message="no error was shown")
    assert "could not be decoded as audio" in alert.text and alert.get_attribute("role") == "alert"
    # shown by upload.js from the API's JSON, on the same page, and the form is ready again
    assert browser.execute_script("return window.stillTheSamePage") is True
    assert by_id(browser, "submit").is_enabled() and not by_id(browser, "upload-progress").is_displayed()


def test_a_file_over_the_limit_is_refused_before_it_is_sent(live_server, browser, tmp_path):
    big = tmp_path / "long.wav"
    with big.open("wb") as fh:  # sparse: 201 MB on paper, nothing on disk
        fh.truncate(201 * 1024 * 1024)
    browser.get(live_server + "/")
    by_id(browser, "file").send_keys(str(big))
    alert = by_id(browser, "error")
    assert alert.is_displayed() and "the limit is 200 MB" in alert.text
    browser.execute_script("window.stillTheSamePage = true")
    by_id(browser, "submit").click()
    assert browser.execute_script("return window.stillTheSamePage") is True
    assert not by_id(browser, "upload-progress").is_displayed() and "the limit is 200 MB" in alert.text


def test_an_unreachable_server_is_said_in_words(live_server, browser, tmp_path):
    browser.get(live_server + "/")
    by_id(browser, "file").send_keys(str(CLIPS["fox.flac"]["path"]))
    browser.execute_script(
        "document.getElementById('upload').setAttribute('data-api-url', 'http://127.0.0.1:9/v1/jobs')"
    )
    by_id(browser, "submit").click()
    alert = by_id(browser, "error")
    wait_for(browser, alert.is_displayed)
    assert alert.text == "Could not reach the server; check your connection and try again."
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 360, "height": 740, "deviceScaleFactor": 2, "mobile": True}
    )
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")  # fits a phone
    browser.save_screenshot(str(tmp_path / "upload-error-phone.png"))


# --- the live job page against a scripted API -----------------------------------------


def iso(seconds_from_now: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds_from_now)).isoformat().replace("+00:00", "Z")


@pytest.fixture()
def scripted_job(app, monkeypatch):
    """A job whose API answer is whatever the test puts in `state["job"]`."""
    from flask import jsonify

    state = {
        "job": {
            "job_id": "stub-job",
            "status": "PENDING",
            "filename": "talk.mp3",
            "priority": "normal",
            "audio_duration": 75.0,
            "error": None,
            "result": None,
        },
        "cancel": [],
    }

    class Stub:
        id = "stub-job"

        def to_dict(self):
            return dict(state["job"])

    monkeypatch.setattr("web.pages.get_job", lambda rt, job_id, **kw: Stub())  # kw: owner=
    app.view_functions["api.show"] = lambda job_id: jsonify(state["job"])

    def cancel():
        status, body = state["cancel"].pop(0)
        return jsonify(body), status

    app.add_url_rule("/test/cancel", "test_cancel", cancel, methods=["POST"])
    return state


def test_the_job_page_follows_the_job_without_reloading(live_server, browser, scripted_job, tmp_path):
    from selenium.webdriver.common.by import By

    scripted_job["job"].update(queue_position=2, progress=0.0, estimated_start_at=iso(21), estimated_finish_at=iso(65))
    browser.get(live_server + "/jobs/stub-job")
    browser.execute_script("window.stillTheSamePage = true")
    wait_for(browser, lambda: by_id(browser, "queue").text == "2 jobs ahead of yours")
    assert by_id(browser, "status").text == "Waiting in the queue"
    assert re.fullmatch(r"Starts in about (20|15) s · done in about 1 min", by_id(browser, "eta").text)
    assert by_id(browser, "progress").is_displayed() and by_id(browser, "cancel").is_displayed()
    browser.save_screenshot(str(tmp_path / "job-page-waiting.png"))

    updated_at = datetime.now(UTC)
    finish_at = updated_at + timedelta(seconds=40)
    scripted_job["job"].update(
        status="PROCESSING",
        stage="infer",
        queue_position=0,
        progress=0.5,
        estimated_start_at=None,
        estimated_finish_at=finish_at.isoformat().replace("+00:00", "Z"),
    )
    wait_for(browser, lambda: status_of(browser) == "PROCESSING")
    assert by_id(browser, "status").text == "Transcribing" and not by_id(browser, "queue").is_displayed()
    assert by_id(browser, "progress").get_attribute("value") == "0.5"
    eta = by_id(browser, "eta").text
    read_at = datetime.now(UTC)

    # The page counts down to the estimate at each poll, to the nearest 5 s (job.js: about), by its
    # clock set from the Date header (to the second): its last poll fell between the update and now.
    def shown(seconds: float) -> int:
        return 5 * math.floor(seconds / 5 + 0.5)

    done_in = re.fullmatch(r"Done in about (\d+) s", eta)
    lowest, highest = (
        shown((finish_at - read_at).total_seconds() - 1),
        shown((finish_at - updated_at).total_seconds() + 1),
    )
    assert done_in and lowest <= int(done_in.group(1)) <= highest, (eta, lowest, highest)
    assert by_id(browser, "status-detail").text == "Recognising speech"

    scripted_job["job"].update(
        status="COMPLETED",
        progress=1.0,
        estimated_finish_at=None,
        transcript_urls={
            f: f"{live_server}/v1/jobs/stub-job/transcript?format={f}" for f in ("txt", "json", "srt", "vtt")
        },
        result=RESULT_WITH_WORDS,
    )
    wait_for(browser, lambda: status_of(browser) == "COMPLETED")
    assert browser.execute_script("return window.stillTheSamePage") is True
    assert browser.title == "Done · talk.mp3 · whisperq"
    assert not by_id(browser, "eta").is_displayed() and not by_id(browser, "progress").is_displayed()
    times = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#segments time")]
    assert times == ["00:00.0", "01:01.3"]
    words = browser.find_elements(By.CSS_SELECTOR, "#segments .word")
    assert [(w.text, w.get_attribute("title")) for w in words] == [("Hello", "00:00.0"), ("there.", "00:00.6")]
    assert by_id(browser, "full-text").text == "Hello there. General Kenobi."
    srt = browser.find_element(By.CSS_SELECTOR, "#downloads a[data-format=srt]").get_attribute("href")
    assert srt == f"{live_server}/v1/jobs/stub-job/transcript?format=srt&download=1"
    assert not by_id(browser, "partial-note").is_displayed()
    browser.save_screenshot(str(tmp_path / "job-page-words.png"))


def test_cancel_shows_the_refusal_then_the_partial_transcript(live_server, browser, scripted_job):
    scripted_job["job"].update(status="PROCESSING", progress=0.3, cancel_url="/test/cancel")
    browser.get(live_server + "/jobs/stub-job")
    wait_for(browser, lambda: status_of(browser) == "PROCESSING")

    scripted_job["cancel"].append((409, {"error": {"code": "conflict", "message": "job stub-job already finished"}}))
    by_id(browser, "cancel").click()
    problem = by_id(browser, "cancel-error")
    wait_for(browser, problem.is_displayed)
    assert problem.text == "Job stub-job already finished."
    assert by_id(browser, "cancel").is_enabled()

    partial = {
        "text": "the first part",
        "partial": True,
        "segments": [{"start": 0.0, "end": 2.0, "text": "the first part"}],
    }
    cancelled = dict(scripted_job["job"], status="CANCELLED", error="cancelled by the client", result=partial)
    scripted_job["cancel"].append((200, cancelled))
    scripted_job["job"] = cancelled
    by_id(browser, "cancel").click()
    wait_for(browser, lambda: status_of(browser) == "CANCELLED")
    assert by_id(browser, "status").text == "Cancelled" and not by_id(browser, "cancel").is_displayed()
    assert not by_id(browser, "cancel-error").is_displayed() and not by_id(browser, "error").is_displayed()
    assert by_id(browser, "partial-note").is_displayed() and by_id(browser, "full-text").text == "the first part"
    assert not by_id(browser, "downloads").is_displayed()
