"""The engine ledger: every pass of the engine over a job's windows, written where the engine
runs (models.pipeline.inference), apart from the path that stores the transcript.

A pass is recorded as it starts, in a transaction of its own (job, model, windows, audio
seconds, worker, claim token), and given its end once it ends, however it ends:

- ``stored``: its transcript is the job's;
- ``discarded``: the engine ran but its work was thrown away: its claim was taken over (the
  fence, models.jobs.claims), or the job already held a transcript stored by another pass;
- ``cancelled``: stopped at a window boundary, its part kept;
- ``failed``: an error, a time limit, a shutdown;
- no end at all: its process was killed mid-pass (a pass started by a process that is gone
  and never ended).

So "the engine went through a job once" is checked on what the engine did (`problems`), not on
what was stored: a job has exactly one stored pass, and every other pass must be explained (a
kill, or a failure the caller expected), never a discarded one. `whisperq_engine_passes_total`
counts passes by how they ended; a rise of ``discarded`` is duplicate engine work.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import Float, Index, Integer, String, Text, select, update
from sqlalchemy.orm import Mapped, mapped_column

from models.db import Base
from models.jobs.record import UTCDateTime, utcnow

if TYPE_CHECKING:
    from models.db import Database
    from models.runtime import Runtime

log = logging.getLogger(__name__)

STORED, DISCARDED, CANCELLED, FAILED = "stored", "discarded", "cancelled", "failed"
OUTCOMES = (STORED, DISCARDED, CANCELLED, FAILED)


class EnginePass(Base):
    __tablename__ = "engine_passes"
    __table_args__ = (Index("ix_engine_passes_job_id", "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # no foreign key: a pass outlives a row deleted under it (retention removes both)
    job_id: Mapped[str] = mapped_column(String(36))
    model: Mapped[str | None] = mapped_column(String(64))
    windows: Mapped[int] = mapped_column(Integer)
    audio_seconds: Mapped[float | None] = mapped_column(Float)
    worker: Mapped[str | None] = mapped_column(String(255))  # the Celery node (pool@host)
    process: Mapped[str] = mapped_column(String(255))  # host:pid, as a claim's holder
    claim_token: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    outcome: Mapped[str | None] = mapped_column(String(16))
    detail: Mapped[str | None] = mapped_column(Text)


def this_process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def begin(
    rt: Runtime,
    job_id: str,
    *,
    windows: int,
    audio_seconds: float | None,
    model: str | None,
    worker: str | None,
    claim_token: int | None,
) -> int | None:
    """Record a pass as the engine starts on a job's windows; its id (None: not recorded)."""
    try:
        with rt.db.session(write=True) as session:
            row = EnginePass(
                job_id=job_id,
                model=model,
                windows=windows,
                audio_seconds=audio_seconds,
                worker=worker,
                process=this_process(),
                claim_token=claim_token,
            )
            session.add(row)
            session.flush()
            return row.id
    except Exception:  # the ledger observes; a database hiccup here must not fail the job
        log.warning("engine ledger: the pass of job %s was not recorded", job_id, exc_info=True)
        return None


def end(rt: Runtime, pass_id: int | None, outcome: str, detail: str | None = None, model: str | None = None) -> None:
    """Give a recorded pass its end, and count it (whisperq_engine_passes_total)."""
    from models.jobs.metrics import observe_engine_pass

    observe_engine_pass(model or "", outcome)
    if pass_id is None:
        return
    try:
        with rt.db.session(write=True) as session:
            session.execute(
                update(EnginePass)
                .where(EnginePass.id == pass_id)
                .values(ended_at=utcnow(), outcome=outcome, detail=(detail or None) and detail[:500])
            )
    except Exception:
        log.warning("engine ledger: the end of pass %s (%s) was not recorded", pass_id, outcome, exc_info=True)


def passes(db: Database, job_ids: Iterable[str]) -> dict[str, list[EnginePass]]:
    """Each job's passes, oldest first."""
    wanted = list(job_ids)
    out: dict[str, list[EnginePass]] = {job_id: [] for job_id in wanted}
    with db.session() as session:
        for start in range(0, len(wanted), 500):
            rows = session.scalars(
                select(EnginePass).where(EnginePass.job_id.in_(wanted[start : start + 500])).order_by(EnginePass.id)
            ).all()
            for row in rows:
                session.expunge(row)
                out[row.job_id].append(row)
    return out


@dataclass(frozen=True)
class Explained:
    """What may explain a pass other than the stored one: a pass without an end whose process
    was killed (`killed`: the pid of every process killed; `hosts`: hosts whose every process
    was killed; `killed=None` accepts any pass without an end), the outcomes a caller
    expects (a failure while a database it killed was down), and spans in which a pass that
    started may have ended with the database away, its end unrecorded (`unrecorded`: from,
    to; a caller that killed the database gives from the kill less the longest pass, to when
    it was back)."""

    killed: frozenset[int] | None = frozenset()
    hosts: frozenset[str] = frozenset()
    outcomes: frozenset[str] = frozenset()
    unrecorded: tuple[tuple[datetime, datetime], ...] = ()

    def kill_explains(self, process: str) -> bool:
        host, _, pid = process.rpartition(":")
        return self.killed is None or host in self.hosts or (pid.isdigit() and int(pid) in self.killed)

    def outage_explains(self, started_at: datetime) -> bool:
        return any(since <= started_at <= until for since, until in self.unrecorded)


def problems(by_job: dict[str, list[EnginePass]], explained: Explained = Explained()) -> dict[str, str]:
    """Each job whose passes break "the engine went through it once", and why: not exactly
    one stored pass, or another pass that is discarded work or not explained."""
    found: dict[str, str] = {}
    for job_id, rows in by_job.items():
        stored = [p for p in rows if p.outcome == STORED]
        if len(stored) != 1:
            found[job_id] = f"{len(stored)} stored passes (of {len(rows)})"
            continue
        for p in rows:
            if p.outcome == STORED:
                continue
            if p.outcome is None:
                if explained.kill_explains(p.process) or explained.outage_explains(p.started_at):
                    continue
                found[job_id] = f"pass {p.id} in {p.process} never ended, and that process was not killed"
            elif p.outcome not in explained.outcomes:
                found[job_id] = f"pass {p.id} in {p.process} ended {p.outcome}: {p.detail or ''}".rstrip(": ")
            if job_id in found:
                break
    return found
