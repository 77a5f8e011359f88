"""A client's correction of a finished transcript (`PUT /v1/jobs/<id>/transcript`).

The correction is kept beside the original, never in its place: the original is what the
model made (and what its version is measured by), the correction what was said. Both are
encrypted at rest, bound to the row. `whisperq dataset export` (models.maintenance.dataset)
takes the correction's text as the transcription of a collected job; deleting the job, or
retention deleting its transcript, deletes the correction with it.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from models.errors import InvalidRequest, JobNotFound, JobNotReady, TranscriptPurged
from models.jobs.operations import ANY, _visible
from models.jobs.record import Job, JobStatus, utcnow

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)

# A transcript of the longest audio a deployment takes (4 h, WHISPERQ_MAX_AUDIO_SECONDS) is
# about 250,000 characters and 3,000 segments: room for that, not for anything else.
MAX_TEXT = 400_000
MAX_SEGMENTS = 20_000
MAX_SEGMENT_TEXT = 10_000
MAX_BYTES = 2 * 1024 * 1024  # the request body (web): text and segments as JSON
# Whisper's timestamps may run a little past the end of the audio; a segment far past it
# is a mistake (milliseconds for seconds).
END_SLACK = 1.0
EXAMPLE = '{"text": "The quick brown fox.", "segments": [{"start": 0.0, "end": 2.1, "text": "The quick brown fox."}]}'


def check_correction(body: Any) -> dict[str, Any]:
    """The correction a request body carries, as it is stored: `text`, and `segments` (a
    list of {start, end, text}) or None. Anything else is InvalidRequest saying what to send."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"send a JSON object such as {EXAMPLE} (segments may be left out)")
    unknown = sorted(set(body) - {"text", "segments"})
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(repr(u) for u in unknown)}; a correction has 'text' "
            "and, optionally, 'segments'"
        )
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        got = "nothing" if text is None else f"a {_kind(text)}" if not isinstance(text, str) else "blank text"
        raise InvalidRequest(
            f"text must be the corrected transcript as a non-empty string (got {got}); to remove a "
            "job's transcript and audio, DELETE the job"
        )
    if len(text) > MAX_TEXT:
        raise InvalidRequest(f"text is {len(text)} characters; a transcript may have at most {MAX_TEXT}")
    segments = body.get("segments")
    if segments is not None:
        segments = _check_segments(segments)
    return {"text": text, "segments": segments}


def _check_segments(segments: Any) -> list[dict[str, Any]]:
    if not isinstance(segments, list):
        raise InvalidRequest(
            f"segments must be a list of objects with start, end (seconds) and text, not a "
            f"{_kind(segments)}; or leave it out"
        )
    if len(segments) > MAX_SEGMENTS:
        raise InvalidRequest(f"segments has {len(segments)} items; a transcript may have at most {MAX_SEGMENTS}")
    out = []
    for n, seg in enumerate(segments):
        where = f"segments[{n}]"
        if not isinstance(seg, dict):
            raise InvalidRequest(f"{where} must be an object with start, end (seconds) and text, not a {_kind(seg)}")
        missing = [k for k in ("start", "end", "text") if k not in seg]
        extra = sorted(set(seg) - {"start", "end", "text"})
        if missing or extra:
            raise InvalidRequest(
                f"{where} "
                + (f"lacks {', '.join(missing)}" if missing else f"has {', '.join(repr(e) for e in extra)}")
                + "; a corrected segment has exactly start, end (seconds) and text"
            )
        start, end = (_seconds(seg[k], f"{where}.{k}") for k in ("start", "end"))
        if end < start:
            raise InvalidRequest(f"{where} ends ({end}) before it starts ({start}); give start <= end, in seconds")
        if not isinstance(seg["text"], str):
            raise InvalidRequest(f"{where}.text must be a string, not a {_kind(seg['text'])}")
        if len(seg["text"]) > MAX_SEGMENT_TEXT:
            raise InvalidRequest(
                f"{where}.text is {len(seg['text'])} characters; a segment may have at most {MAX_SEGMENT_TEXT}"
            )
        out.append({"start": start, "end": end, "text": seg["text"]})
    return out


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidRequest(f"{where} must be a number of seconds from 0, not {value!r}")
    return float(value)


def _kind(value: Any) -> str:
    return {bool: "boolean", int: "number", float: "number", str: "string", list: "list", dict: "object"}.get(
        type(value), type(value).__name__
    )


def correct_transcript(rt: Runtime, job_id: str, correction: dict[str, Any], owner: object = ANY) -> Job:
    """Keep `correction` (from check_correction) beside a COMPLETED job's transcript,
    replacing an earlier correction; the original stays as the model made it."""
    with rt.db.session(write=True) as session:
        job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
        if not _visible(job, owner):
            raise JobNotFound(f"no job with id {job_id!r}")
        if job.state is not JobStatus.COMPLETED:
            raise JobNotReady(f"job {job_id} is {job.status}; a transcript can be corrected once the job is COMPLETED")
        if job.result_purged_at is not None:
            raise TranscriptPurged(
                f"job {job_id}'s transcript was deleted after the retention period "
                "(WHISPERQ_RESULT_RETENTION); there is nothing left to correct"
            )
        late = [
            n
            for n, s in enumerate(correction["segments"] or [])
            if job.audio_duration is not None and s["end"] > job.audio_duration + END_SLACK
        ]
        if late:
            seg = correction["segments"][late[0]]
            raise InvalidRequest(
                f"segments[{late[0]}] ends at {seg['end']} s, past the end of the audio "
                f"({job.audio_duration} s); give times in seconds from the start"
            )
        job.correction = correction
        job.corrected_at = utcnow()
        session.flush()
        session.expunge(job)
    log.info("job %s: transcript corrected (%d characters)", job_id, len(correction["text"]))
    return job
