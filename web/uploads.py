"""What the web's ways in hand the one door (models.pipeline.door): an upload spooled and
sealed as it arrives, its file name checked, and a Submission built from a form or a JSON
body. The rules a job must pass are the door's, not these: this module only says what the
body's shape must be."""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Mapping
from typing import IO, cast

from flask import Request, current_app
from werkzeug.datastructures import FileStorage
from werkzeug.exceptions import RequestEntityTooLarge

from models.access.apikeys import Principal
from models.analysis import analysis
from models.errors import InvalidRequest
from models.jobs.operations import ANY, get_job
from models.pipeline.door import Submission
from models.pipeline.request import FIELDS, RERUN_KEPT
from models.runtime import Runtime
from models.storage import SealedSpool

log = logging.getLogger(__name__)


def check_fields(form: Mapping[str, str], files, source: str = "file") -> None:
    unknown = sorted((set(form) - set(FIELDS) - ({source} if source != "file" else set())) | (set(files) - {"file"}))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(repr(u) for u in unknown)}; the fields are {source!r}, "
            f"{', '.join(repr(f) for f in FIELDS)}"
        )


def check_filename(name: str) -> None:
    """A client's file name is shown back to people: refuse what cannot be a plain name."""
    if "\ufffd" in name:
        raise InvalidRequest("the file name is not valid UTF-8; rename the file")
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise InvalidRequest("the file name contains control characters; rename the file")
    if "/" in name or "\\" in name or name.strip(". ") == "":
        raise InvalidRequest("the file name must be a plain name, without directories or '..'")
    if len(name) > 255:
        raise InvalidRequest("the file name is longer than 255 characters; rename the file")


def sealed_upload(rt: Runtime, upload: FileStorage) -> SealedSpool:
    """An uploaded file, its name checked, complete and sealed (encrypted in the data dir's
    tmp folder: UploadRequest did it as it arrived, else it is done now); refused when empty.
    The caller moves it into the store or discards it."""
    check_filename(cast(str, upload.filename))  # a file field always has a name ("" when none was sent)
    spooled: IO[bytes] | SealedSpool = upload.stream
    if not isinstance(spooled, SealedSpool):  # not parsed by UploadRequest: spool it encrypted now
        spooled = rt.storage.spool(spooled, limit=rt.settings.max_upload_bytes, too_large=RequestEntityTooLarge)
    try:
        spooled.finish()
        if spooled.size == 0:
            raise InvalidRequest("the uploaded file is empty; choose a file with audio in it")
    except BaseException:
        spooled.discard()
        raise
    return spooled


def upload_submission(
    rt: Runtime,
    who: Principal,
    door: str,
    upload: FileStorage | None,
    form: Mapping[str, str],
    files=None,
    idempotency_key: str | None = None,
) -> Submission:
    """A multipart upload as the door takes it: its fields named, its file sealed (removed by
    the door on any refusal, and by UploadRequest at the end of the request)."""
    check_fields(form, files or {})
    if upload is None or not upload.filename:
        raise InvalidRequest("no audio file: send it as the multipart form field 'file', with a UTF-8 file name")
    spooled = sealed_upload(rt, upload)
    return Submission(
        who, door, fields=dict(form.items()), upload=spooled, filename=upload.filename, idempotency_key=idempotency_key
    )


def url_submission(who: Principal, door: str, body, idempotency_key: str | None = None) -> Submission:
    """A JSON body naming its audio by `audio_url`, as the door takes it."""
    if not isinstance(body, dict):
        raise InvalidRequest('send a JSON object such as {"audio_url": "https://example.com/call.mp3"}')
    check_fields(body, {}, source="audio_url")
    url = body.get("audio_url")
    if not isinstance(url, str) or not url.strip():
        raise InvalidRequest("audio_url is missing: give the http(s) URL of the audio, or upload the file as multipart")
    return Submission(
        who,
        door,
        fields={k: v for k, v in body.items() if k != "audio_url"},
        audio_url=url.strip(),
        idempotency_key=idempotency_key,
    )


def rerun_submission(rt: Runtime, who: Principal, job_id: str, body) -> Submission:
    """A re-run of `job_id` (POST /v1/jobs/<id>/rerun): the same audio, with the options of the
    body (JSON, the fields of POST /v1/jobs but the audio) over the original's, most often
    another model. Its audio is a copy, so either job may be deleted alone; it is billed to
    the original's key, like the original."""
    from models.errors import AudioPurged

    if not isinstance(body, dict):
        raise InvalidRequest('send a JSON object such as {"model": "base"} (or nothing, to run the same options again)')
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(repr(u) for u in unknown)}; a re-run takes "
            f"{', '.join(repr(f) for f in FIELDS)}"
        )
    original = get_job(rt, job_id, owner=ANY if who.admin else who.owner)
    if (
        original.deleted_at is not None
        or original.audio_purged_at is not None
        or not (original.audio_ref or original.audio_url)
    ):
        raise AudioPurged(
            f"job {job_id}'s audio is no longer kept (deleted, or removed after "
            "WHISPERQ_AUDIO_RETENTION); it cannot be re-run: submit the audio again"
        )
    kept = {name: getattr(original, name) for name in RERUN_KEPT}
    kept.update({name: analysis(name).given(params) for name, params in (original.analyses or {}).items()})
    form = {"model": original.route or original.model, **{k: v for k, v in kept.items() if v is not None}, **body}
    form = {k: (str(v).lower() if isinstance(v, bool) else v) for k, v in form.items()}
    if form.get("temperature") is not None:
        form["temperature"] = str(form["temperature"])
    return Submission(who, "rerun", fields=form, rerun_of=original)


class UploadRequest(Request):
    """Flask's request, with file parts spooled encrypted into the data dir's tmp folder
    as they arrive (werkzeug would spool them in plaintext to /tmp), hashed and counted
    on the way, and refused with 413 the moment one passes WHISPERQ_MAX_UPLOAD_MB, even
    in a chunked request without a Content-Length. Whatever the view does not keep is
    removed when the request ends."""

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        rt = current_app.extensions["whisperq"]
        spool = SealedSpool(rt.storage.tmp_dir, limit=rt.settings.max_upload_bytes, too_large=RequestEntityTooLarge)
        self.__dict__.setdefault("_whisperq_spools", []).append(spool)
        return spool

    def close(self) -> None:
        try:
            super().close()
        finally:
            for spool in self.__dict__.pop("_whisperq_spools", ()):
                spool.discard()
