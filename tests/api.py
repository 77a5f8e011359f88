"""The HTTP API as the tests drive it: the Authorization header, a multipart upload, a
submission that must be accepted, and waiting for a job to finish (generic waits, clips and
word error rates are in helpers.py)."""

from __future__ import annotations

import io

from helpers import CLIPS, wait_until

# What a job ends as when it ran (wait_for_job's default), and every state a job ends in.
RAN = ("COMPLETED", "FAILED")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED")


def bearer(token: str | None) -> dict:
    """The header that presents an API key's (or the admin's) token; none for no token."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def upload(
    client,
    clip: str | None = "fox.flac",
    *,
    data: bytes | None = None,
    filename: str | None = None,
    token: str | None = None,
    headers: dict | None = None,
    path: str = "/v1/jobs",
    **fields,
):
    """POST a multipart upload to `path` (the job API's by default): the audio in field 'file',
    `fields` beside it; the response, whatever its status.

    The audio is the fixture clip `clip`, or `data` when given, named `filename` (by default
    the clip's name, or "clip.flac" for data with no clip). `upload(client, None)` sends no
    file part at all. `token` goes as a bearer key, with any other `headers`."""
    form = dict(fields)
    if data is None and clip is not None:
        data = CLIPS[clip]["path"].read_bytes()
    if data is not None:
        name = filename if filename is not None else (clip if clip is not None else "clip.flac")
        form["file"] = (io.BytesIO(data), name)
    return client.post(
        path, data=form, content_type="multipart/form-data", headers={**bearer(token), **(headers or {})}
    )


def submit(client, clip: str | None = "fox.flac", **kwargs) -> dict:
    """upload(client, clip, **kwargs), which must be accepted (202): the job's JSON."""
    resp = upload(client, clip, **kwargs)
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()


def submit_id(client, clip: str | None = "fox.flac", **kwargs) -> str:
    """submit(), for the new job's id only."""
    return submit(client, clip, **kwargs)["job_id"]


def wait_for_job(client, job_id: str, timeout: float = 120.0, statuses: tuple[str, ...] = RAN) -> dict:
    """The job's JSON once `GET /v1/jobs/<id>` answers 200 with a status in `statuses` (polled
    every 0.2 s); AssertionError, with the job as last read, after `timeout` seconds."""

    def ran() -> dict | None:
        resp = client.get(f"/v1/jobs/{job_id}")
        return resp.get_json() if resp.status_code == 200 and resp.get_json()["status"] in statuses else None

    try:
        return wait_until(ran, timeout, f"job {job_id} did not finish", interval=0.2)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {client.get(f'/v1/jobs/{job_id}').get_json()}") from None
