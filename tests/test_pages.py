"""The upload form and the job page, through Flask's client."""
import io

from helpers import CLIPS, stored_files


def test_form_offers_file_language_and_priority(client):
    page = client.get("/").get_data(as_text=True)
    assert 'enctype="multipart/form-data"' in page
    assert 'name="file"' in page and 'name="language"' in page and 'name="priority"' in page
    assert "200 MB" in page


def test_form_upload_redirects_to_the_job_page(client, published):
    resp = client.post("/", data={"file": (io.BytesIO(CLIPS["fox.flac"]["path"].read_bytes()), "fox.flac"),
                                  "priority": "low"}, content_type="multipart/form-data")
    assert resp.status_code == 303
    job_id = resp.headers["Location"].rsplit("/", 1)[-1]
    assert len(published) == 1 and published[0][0]["id"] == job_id
    page = client.get(resp.headers["Location"]).get_data(as_text=True)
    assert job_id in page and "fox.flac" in page
    assert 'id="status"' in page and f"/v1/jobs/{job_id}" in page  # the page polls the API
    for fmt in ("txt", "json", "srt", "vtt"):
        assert f"format={fmt}" in page


def test_form_shows_the_error_and_keeps_nothing(client, settings, published):
    before = stored_files(settings)
    resp = client.post("/", data={"file": (io.BytesIO(b"not audio at all" * 100), "x.mp3")}, content_type="multipart/form-data")
    assert resp.status_code == 415
    page = resp.get_data(as_text=True)
    assert 'role="alert"' in page and "could not be decoded as audio" in page
    assert 'name="file"' in page  # the form is shown again
    assert stored_files(settings) == before and published == []


def test_job_page_for_unknown_id_is_a_404_page(client):
    resp = client.get("/jobs/does-not-exist", headers={"Accept": "text/html"})
    assert resp.status_code == 404
    assert "no job with id" in resp.get_data(as_text=True)
