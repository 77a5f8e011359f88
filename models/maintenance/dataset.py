"""Training-data export (`whisperq dataset export`): the collected jobs as a Hugging Face
`audiofolder` dataset, which `datasets.load_dataset("audiofolder", data_dir=OUT_DIR)` reads.

    OUT_DIR/metadata.jsonl     one line per file: file_name, transcription, original_transcription,
                               corrected, language, duration, model, model_version, job_id, created_at
    OUT_DIR/data/<job id>.wav  the stored audio, decrypted and decoded as the model heard it:
                               16 kHz, mono, 16-bit PCM

A job is exported when it was collected (its key collects every job, or it asked with
`collect`), is COMPLETED, and its audio and transcript are still stored: deleting the job
and retention (WHISPERQ_AUDIO_RETENTION, WHISPERQ_RESULT_RETENTION) take it out of every
export after. The transcription is the client's correction where there is one
(models.jobs.corrections), the model's transcript otherwise; both are in the line.

The files are the decrypted audio: what the export makes is readable by its owner alone
(directories 0700, files 0600). A crash leaves no metadata.jsonl that names a missing file: each WAV is written beside
itself and renamed into place, and metadata.jsonl is renamed into place last, after every
file it names is on disk. A job deleted while an export runs is left out of it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import wave
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
from sqlalchemy import or_, select

from config import private_dir
from models.analysis import hides
from models.errors import InvalidRequest, UnsupportedAudio
from models.jobs.record import Job, JobStatus
from models.security.crypto import DecryptionError
from models.speech import audio as audio_io

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)

METADATA = "metadata.jsonl"
PARTIAL = ".metadata.jsonl.part"
DATA = "data"
BATCH = 100
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_WRITTEN = re.compile(rf"^(?:{_UUID}\.wav|\.{_UUID}\.wav\.part)$")  # what an export writes under data/


@dataclass
class ExportReport:
    out_dir: Path
    exported: int = 0
    corrected: int = 0
    seconds: float = 0.0  # of audio exported
    skipped: Counter[str] = field(default_factory=Counter)  # why collected jobs were left out: reason -> count


def export_dataset(
    rt: Runtime,
    out_dir: str | Path,
    *,
    since: datetime | None = None,
    model: str | None = None,
    corrected_only: bool = False,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ExportReport:
    """Write the collected jobs (made from `since` on, by `model`, only those a client
    corrected: each if given) into `out_dir`, new or empty (or, with `overwrite`, holding an
    earlier export, which is replaced)."""
    out = Path(out_dir)
    _prepare(out, overwrite)
    report = ExportReport(out)
    partial = out / PARTIAL
    try:
        with _private(partial, "w", encoding="utf-8") as meta:
            for ids in _batches(_candidates(rt, since, model, corrected_only, report.skipped)):
                _export_batch(rt, ids, out / DATA, meta, report)
                if progress:
                    progress(f"exported so far: {report.exported}")
            meta.flush()
            os.fsync(meta.fileno())
        _sync_dir(out / DATA)  # every file the index names is on disk before the index is
        os.replace(partial, out / METADATA)
    except BaseException:
        partial.unlink(missing_ok=True)  # the WAVs written stay, named by nothing: --overwrite replaces them
        raise
    _sync_dir(out)
    log.info(
        "dataset export: %d jobs (%.0f s of audio) exported, %d skipped",
        report.exported,
        report.seconds,
        sum(report.skipped.values()),
    )
    return report


def _export_batch(rt: Runtime, ids: list[str], data: Path, meta: IO[str], report: ExportReport) -> None:
    lines = {}
    for job in _load(rt, ids):
        line = _export_one(rt, job, data, report.skipped)
        if line is not None:
            lines[job.id] = line
    for job_id in _gone_meanwhile(rt, list(lines)):
        (data / f"{job_id}.wav").unlink(missing_ok=True)
        report.skipped["deleted while the export ran"] += 1
        del lines[job_id]
    for line in lines.values():
        meta.write(json.dumps(line, ensure_ascii=False) + "\n")
        report.exported += 1
        report.corrected += line["corrected"]
        report.seconds += line["duration"]


def _prepare(out: Path, overwrite: bool) -> None:
    """A new or empty directory, or one holding only an earlier export (with `overwrite`):
    its index goes first, then its files, so no index ever names a file that is gone."""
    if out.exists() and not out.is_dir():
        raise InvalidRequest(f"{out} is a file; give the path of a new or empty directory for the export")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise InvalidRequest(
                f"{out} is not empty; give a new or empty directory, or pass --overwrite to "
                "replace an earlier export there"
            )
        data = out / DATA
        strangers = [p.name for p in out.iterdir() if p.name not in (METADATA, PARTIAL, DATA)]
        if data.is_symlink() or (data.exists() and not data.is_dir()):
            strangers.append(DATA)
        elif data.is_dir():
            strangers += [f"{DATA}/{p.name}" for p in data.iterdir() if not (_WRITTEN.match(p.name) and p.is_file())]
        if strangers:
            raise InvalidRequest(
                f"{out} holds {strangers[0]!r}, which an export does not write; --overwrite "
                "replaces only an earlier export: give a new or empty directory"
            )
        (out / METADATA).unlink(missing_ok=True)
        (out / PARTIAL).unlink(missing_ok=True)
        if data.is_dir():
            for path in data.iterdir():
                path.unlink()
    private_dir(out / DATA)


def _candidates(
    rt: Runtime, since: datetime | None, model: str | None, corrected_only: bool, skipped: Counter[str]
) -> Iterator[str]:
    """The ids of the collected jobs to export, oldest first; those that cannot be are
    counted in `skipped`, by reason."""
    query = select(
        Job.id, Job.status, Job.deleted_at, Job.audio_purged_at, Job.result_purged_at, Job.audio_ref, Job.analyses
    ).where(Job.collect.is_(True))
    if since is not None:
        query = query.where(Job.created_at >= since)
    if model is not None:
        query = query.where(Job.model == model)
    if corrected_only:
        query = query.where(Job.corrected_at.is_not(None))
    with rt.db.session() as session:
        rows = list(session.execute(query.order_by(Job.created_at, Job.id)))
    for row in rows:
        reason = _left_out(row)
        if reason is None:
            yield row.id
        else:
            skipped[reason] += 1


def _left_out(row: Any) -> str | None:
    if row.deleted_at is not None:
        return "deleted"
    if hides(row.analyses):  # its redacted text must never be paired with the audio that says it
        return "asked for redaction"
    if row.status != JobStatus.COMPLETED.value:
        return "not completed"
    if row.result_purged_at is not None:
        return "transcript deleted by retention"
    if row.audio_purged_at is not None:
        return "audio deleted by retention"
    if not row.audio_ref:
        return "no stored audio"
    return None


def _batches(ids: Iterator[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for job_id in ids:
        batch.append(job_id)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def _load(rt: Runtime, ids: list[str]) -> list[Job]:
    with rt.db.session() as session:
        jobs = list(session.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.created_at, Job.id)))
        for job in jobs:
            session.expunge(job)
    return jobs


def _export_one(rt: Runtime, job: Job, data: Path, skipped: Counter[str]) -> dict[str, Any] | None:
    """Write the job's WAV; its metadata line, or None (counted in `skipped`) if its audio
    cannot be read now."""
    reason = _left_out(job)
    if reason is not None:  # changed since the ids were read
        skipped[reason] += 1
        return None
    try:
        with rt.storage.open(job.audio_ref) as fh:
            samples = audio_io.decode(fh, format=job.audio_format)
    except FileNotFoundError:
        skipped["audio file missing"] += 1
        log.warning("dataset export: job %s's audio file is missing", job.id)
        return None
    except (DecryptionError, UnsupportedAudio, OSError, ValueError) as exc:
        skipped["audio unreadable"] += 1
        log.warning("dataset export: job %s's audio could not be read (%s)", job.id, exc)
        return None
    _write_wav(data / f"{job.id}.wav", samples)
    original = job.result_text or ""
    correction = job.correction
    return {
        "file_name": f"{DATA}/{job.id}.wav",
        "transcription": correction["text"] if correction else original,
        "original_transcription": original,
        "corrected": correction is not None,
        "language": job.result_language or job.language,
        "duration": round(samples.size / audio_io.SAMPLE_RATE, 3),
        "model": job.model,
        "model_version": job.model_version,
        "job_id": job.id,
        "created_at": job.created_at.isoformat().replace("+00:00", "Z") if job.created_at else None,
    }


def _write_wav(dest: Path, samples: np.ndarray) -> None:
    """16 kHz mono 16-bit PCM, written beside `dest` and renamed into place."""
    pcm = np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2")
    part = dest.with_name(f".{dest.name}.part")
    try:
        with _private(part, "wb") as fh:
            with wave.open(fh, "wb") as w:
                w.setnchannels(1)
                w.setsampwidth(2)
                w.setframerate(audio_io.SAMPLE_RATE)
                w.writeframes(pcm.tobytes())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(part, dest)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _gone_meanwhile(rt: Runtime, ids: list[str]) -> list[str]:
    """Of `ids`, the jobs deleted (or purged by retention) since they were read."""
    if not ids:
        return []
    with rt.db.session() as session:
        return list(
            session.scalars(
                select(Job.id).where(
                    Job.id.in_(ids),
                    or_(
                        Job.deleted_at.is_not(None), Job.audio_purged_at.is_not(None), Job.result_purged_at.is_not(None)
                    ),
                )
            )
        )


def _private(path: Path, mode: str, **kwargs: Any) -> IO[Any]:
    """A new file readable by its owner alone, open for writing."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), mode, **kwargs)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
