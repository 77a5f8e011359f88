"""A person in a real browser (headless Chromium): pick a file, submit, watch the job
finish without reloading, read the transcript with its timestamps."""
import shutil
import threading

import pytest

from helpers import CLIPS, need_service, word_error_rate

pytestmark = pytest.mark.integration


@pytest.fixture()
def live_server(app):
    from werkzeug.serving import make_server

    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture()
def browser(tmp_path):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        need_service("Debian's chromium and chromium-driver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1000,900"):
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(driver), options=options)
    drv.set_page_load_timeout(30)
    yield drv
    drv.quit()


def test_upload_in_the_browser_and_watch_it_finish(live_server, browser, worker, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import Select, WebDriverWait

    clip = CLIPS["report.opus"]
    browser.get(live_server + "/")
    assert browser.title == "whisperq"
    browser.find_element(By.NAME, "file").send_keys(str(clip["path"]))
    Select(browser.find_element(By.NAME, "priority")).select_by_value("high")
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

    WebDriverWait(browser, 10).until(ec.url_contains("/jobs/"))
    page_url = browser.current_url
    WebDriverWait(browser, 120).until(ec.text_to_be_present_in_element((By.ID, "status"), "COMPLETED"))
    assert browser.current_url == page_url  # updated in place, no reload
    segments = browser.find_elements(By.CSS_SELECTOR, "#segments li")
    assert segments and all(li.find_element(By.TAG_NAME, "time").text.endswith(" s") for li in segments)
    text = " ".join(li.text.split(" s ", 1)[-1] for li in segments)
    assert word_error_rate(clip["text"], text) <= 0.2, text
    links = {a.text: a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "#downloads a")}
    assert set(links) == {"txt", "json", "srt", "vtt"}
    browser.save_screenshot(str(tmp_path / "job.png"))


def test_a_bad_file_shows_the_reason_in_the_form(live_server, browser, tmp_path):
    from selenium.webdriver.common.by import By

    bad = tmp_path / "notes.mp3"
    bad.write_text("this is a text file, not a recording\n" * 30)
    browser.get(live_server + "/")
    browser.find_element(By.NAME, "file").send_keys(str(bad))
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    alert = browser.find_element(By.ID, "error")
    assert "could not be decoded as audio" in alert.text
