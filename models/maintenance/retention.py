"""Retention (run by Celery beat as `whisperq.retention`): delete what finished jobs no
longer need, on a schedule, so that audio and transcripts are not kept for good.

- Audio: once a job has ended (COMPLETED, FAILED, CANCELLED, EXPIRED) and
  WHISPERQ_AUDIO_RETENTION has passed, its stored upload and its prepared samples are
  deleted and the row records when (`audio_purged_at`). A file the caller owns
  (`transcribe.delay("/abs/path")`) is never touched; only the prepared copy goes.
- Transcript: once WHISPERQ_RESULT_RETENTION has passed, the transcript, a client's
  correction of it and what the client sent with it (file name, prompt, URLs) are
  cleared, with the job's webhook deliveries, its dead letter and its result-backend
  entry; the row stays, so the job id still answers, saying the transcript was deleted
  (`result_purged_at`). A batch finished as long ago loses its callback_url and its
  `batch.completed` delivery the same way; its row and counts stay.
- Leftovers: spooled uploads in tmp/ older than a day (a request that crashed), and
  files under audio/ and prepared/ older than an hour whose job does not exist, was
  deleted, or had its audio purged already (a crash between storing and recording).

Jobs that have not ended are never touched, however old. The work goes in batches of
BATCH rows, each its own transaction with its rows locked (SKIP LOCKED on PostgreSQL, the
write lock on SQLite), so a backlog holds no lock for long and two overlapping runs share
the work instead of doing it twice; every step is idempotent. Logs carry counts only.
"""

from __future__ import annotations

import logging
import re
import stat
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update

from models.db import delete_of_jobs
from models.delivery.notify import WebhookDelivery
from models.jobs.deadletter import DeadLetter
from models.jobs.ledger import EnginePass
from models.jobs.record import Job, JobAnalysis, JobStatus, utcnow
from models.jobs.shadows import forget_shadows
from models.storage import prepared_ref

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from models.runtime import Runtime

log = logging.getLogger(__name__)

BATCH = 500
# A spooled upload lives for the length of one request; one a day old was left by a crash.
TMP_AGE = timedelta(days=1)
# A stored file is recorded on its job's row a moment after it is written.
ORPHAN_AGE = timedelta(hours=1)
FINISHED = tuple(s.value for s in JobStatus if s.finished)
# `<id>.<ext>`, or `.<id>.<ext>.<random>.part` (a write cut short; see models.security.sealed).
_JOB_FILE = re.compile(r"^\.?([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})(\..*)?$")
# What a pass counts, in this order: the keys of what run_retention returns (and
# `whisperq retention --json` prints), the kinds of whisperq_retention_deleted_total.
COUNTS = (
    "audio_purged",
    "results_purged",
    "files_deleted",
    "webhook_deliveries_deleted",
    "dead_letters_deleted",
    "tmp_deleted",
    "orphans_deleted",
    "errors",
)


def run_retention(rt: Runtime, now: datetime | None = None, batch: int = BATCH) -> dict[str, int]:
    """One pass; returns what it deleted, as counts. With a broker on the runtime, purged
    jobs' result-backend entries go too."""
    now = now or utcnow()
    counts = dict.fromkeys(COUNTS, 0)
    settings = rt.settings
    if settings.audio_retention_seconds is not None:
        _purge_audio(rt, now - timedelta(seconds=settings.audio_retention_seconds), now, batch, counts)
    if settings.result_retention_seconds is not None:
        forget = rt.broker.forget_result if rt.broker is not None else None
        _purge_results(rt, now - timedelta(seconds=settings.result_retention_seconds), now, batch, counts, forget)
        _purge_batches(rt, now - timedelta(seconds=settings.result_retention_seconds), batch, counts)
    _sweep_tmp(rt, now, counts)
    _sweep_orphans(rt, now, batch, counts)
    log.info(
        "retention: audio of %d jobs and results of %d jobs deleted (%d files, %d webhook deliveries, "
        "%d dead letters); %d stale uploads and %d orphaned files removed; %d errors",
        counts["audio_purged"],
        counts["results_purged"],
        counts["files_deleted"],
        counts["webhook_deliveries_deleted"],
        counts["dead_letters_deleted"],
        counts["tmp_deleted"],
        counts["orphans_deleted"],
        counts["errors"],
    )
    from models.jobs import metrics

    metrics.count_purged(counts)
    return counts


def _due(rt: Runtime, session: Session, marker: Any, cutoff: datetime, batch: int) -> list[Any]:
    """The next batch of ended jobs past `cutoff` not yet purged, locked for this run:
    (id, audio_ref, audio_owned) only. Transcripts are never loaded, so a row encrypted
    with a key no longer configured is purged all the same."""
    ended = func.coalesce(Job.finished_at, Job.created_at)
    query = (
        select(Job.id, Job.audio_ref, Job.audio_owned)
        .where(Job.status.in_(FINISHED), marker.is_(None), ended < cutoff)
        .order_by(ended)
        .limit(batch)
    )
    if not rt.db.url.startswith("sqlite"):  # SQLite: the session holds the write lock already
        query = query.with_for_update(skip_locked=True)
    return list(session.execute(query).all())


def _delete_file(rt: Runtime, ref: str, counts: dict[str, int]) -> None:
    try:
        existed = rt.storage.exists(ref)
        rt.storage.delete(ref)
        counts["files_deleted"] += existed
    except (OSError, ValueError) as exc:  # the orphan sweep tries again next run
        counts["errors"] += 1
        log.warning("retention: a stored file could not be deleted (%s)", type(exc).__name__)


def _purge_audio(rt: Runtime, cutoff: datetime, now: datetime, batch: int, counts: dict[str, int]) -> None:
    while True:
        with rt.db.session(write=True) as session:
            rows = _due(rt, session, Job.audio_purged_at, cutoff, batch)
            ours = [r for r in rows if r.audio_owned and r.audio_ref and rt.storage.owns(r.audio_ref)]
            if rows:
                session.execute(
                    update(Job)
                    .where(Job.id.in_([r.id for r in rows]), Job.audio_purged_at.is_(None))
                    .values(audio_purged_at=now),
                    execution_options={"synchronize_session": False},
                )
            if ours:
                session.execute(
                    update(Job).where(Job.id.in_([r.id for r in ours])).values(audio_ref=""),
                    execution_options={"synchronize_session": False},
                )
            # Deleted under the rows' locks, before the commit: a crash in between leaves
            # the rows unmarked, and the next run deletes again (the files are gone: no-op).
            # A file the caller owns is never touched: only its prepared copy goes.
            shadows = [prepared_ref(f"{r.id}.shadow") for r in rows]  # a shadow's copy no worker took
            prepared = [prepared_ref(r.id) for r in rows] + [ref for ref in shadows if rt.storage.exists(ref)]
            for ref in [r.audio_ref for r in ours] + prepared:
                _delete_file(rt, ref, counts)
        counts["audio_purged"] += len(rows)
        if len(rows) < batch:
            return


def _purge_results(
    rt: Runtime,
    cutoff: datetime,
    now: datetime,
    batch: int,
    counts: dict[str, int],
    forget: Callable[[str], None] | None,
) -> None:
    while True:
        with rt.db.session(write=True) as session:
            rows = _due(rt, session, Job.result_purged_at, cutoff, batch)
            ids = [r.id for r in rows]
            theirs = [r.id for r in rows if not r.audio_owned]
            if ids:
                session.execute(
                    update(Job)
                    .where(Job.id.in_(ids), Job.result_purged_at.is_(None))
                    .values(
                        result_text_token=None,
                        result_segments_token=None,
                        result_language=None,
                        filename=None,
                        prompt=None,
                        hotwords=None,
                        result_extra=None,
                        audio_url=None,
                        callback_url=None,
                        correction_token=None,
                        corrected_at=None,
                        result_purged_at=now,
                    ),
                    execution_options={"synchronize_session": False},
                )
                counts["webhook_deliveries_deleted"] += delete_of_jobs(session, WebhookDelivery, ids)
                counts["dead_letters_deleted"] += delete_of_jobs(session, DeadLetter, ids)
                delete_of_jobs(session, JobAnalysis, ids)  # what the analyses found goes with the transcript
                delete_of_jobs(session, EnginePass, ids)  # and the engine's passes over it
                forget_shadows(session, ids)  # transcripts too
            if theirs:  # the caller's own path goes with the transcript; an owned one with its audio
                session.execute(
                    update(Job).where(Job.id.in_(theirs)).values(audio_ref=""),
                    execution_options={"synchronize_session": False},
                )
        counts["results_purged"] += len(ids)
        if forget is not None and ids:
            try:
                for job_id in ids:
                    forget(job_id)
            except Exception as exc:  # results expire on their own (result_expires)
                counts["errors"] += 1
                log.warning("retention: result backend entries not removed now (%s)", type(exc).__name__)
        if len(ids) < batch:
            return


def _purge_batches(rt: Runtime, cutoff: datetime, batch: int, counts: dict[str, int]) -> None:
    """Batches finished before `cutoff` (their jobs' results purged by now): their
    `callback_url` and `batch.completed` delivery go too; the row stays, so the batch id
    still answers with its counts."""
    from models.jobs.batches import Batch

    while True:
        with rt.db.session(write=True) as session:
            query = (
                select(Batch.id)
                .where(Batch.finished_at < cutoff, Batch.callback_url.is_not(None))
                .order_by(Batch.finished_at)
                .limit(batch)
            )
            if not rt.db.url.startswith("sqlite"):
                query = query.with_for_update(skip_locked=True)
            ids = list(session.scalars(query).all())
            if ids:
                session.execute(
                    update(Batch).where(Batch.id.in_(ids)).values(callback_url=None),
                    execution_options={"synchronize_session": False},
                )
                # A batch's `batch.completed` delivery holds the batch id in its job_id.
                counts["webhook_deliveries_deleted"] += delete_of_jobs(session, WebhookDelivery, ids)
        if len(ids) < batch:
            return


def _age(path: Path, now: datetime) -> float | None:
    """Seconds since the file was last written or moved (a rename updates ctime, not
    mtime), or None if it is not a plain file (any more)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return now.timestamp() - max(st.st_mtime, st.st_ctime)


def _sweep_tmp(rt: Runtime, now: datetime, counts: dict[str, int]) -> None:
    tmp = rt.storage.root / "tmp"
    if not tmp.is_dir():
        return
    for path in tmp.iterdir():
        age = _age(path, now)
        if age is not None and age > TMP_AGE.total_seconds():
            try:
                path.unlink(missing_ok=True)
                counts["tmp_deleted"] += 1
            except OSError:
                counts["errors"] += 1


def _stored_files(rt: Runtime, now: datetime) -> Iterator[tuple[str, str]]:
    """(job id, reference) of each file the service stored under audio/ and
    prepared/ (`<folder>/<id[:2]>/<id>.<ext>`) older than ORPHAN_AGE."""
    for stored in rt.storage.listing(("audio", "prepared"), parts=True):
        parts = stored.ref.split("/")
        if len(parts) != 3:
            continue  # not a place the service writes to: not ours to judge
        match = _JOB_FILE.match(parts[2])
        if match is None or match.group(1)[:2] != parts[1]:
            continue
        if now.timestamp() - stored.written_at > ORPHAN_AGE.total_seconds():
            yield match.group(1), stored.ref


def _sweep_orphans(rt: Runtime, now: datetime, batch: int, counts: dict[str, int]) -> None:
    pending: list[tuple[str, str]] = []
    for item in _stored_files(rt, now):
        pending.append(item)
        if len(pending) >= batch:
            _drop_orphans(rt, pending, counts)
            pending = []
    if pending:
        _drop_orphans(rt, pending, counts)


def _drop_orphans(rt: Runtime, files: list[tuple[str, str]], counts: dict[str, int]) -> None:
    ids = {job_id for job_id, _ in files}
    with rt.db.session() as session:
        rows = {
            row.id: row
            for row in session.execute(
                select(Job.id, Job.status, Job.deleted_at, Job.audio_purged_at, Job.audio_ref).where(Job.id.in_(ids))
            )
        }
    for job_id, ref in files:
        row = rows.get(job_id)
        # A live job's files stay, unless it has ended and its audio was purged already
        # (the purge's delete failed); so does a file its row names.
        purged = row is not None and row.audio_purged_at is not None and row.status in FINISHED
        if row is not None and row.deleted_at is None and not purged:
            continue
        if row is not None and row.audio_ref == ref:
            continue
        try:
            if rt.storage.exists(ref):
                rt.storage.delete(ref)
                counts["orphans_deleted"] += 1
        except (OSError, ValueError):
            counts["errors"] += 1
