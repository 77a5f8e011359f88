"""Shadow decoding: a share of a model's jobs decoded again by a candidate model, its
transcript kept apart from the job's and compared with it.

The client sees only the primary's transcript. Each shadow transcript is a row here
(sealed like the job's), with the agreement between the two as a word error rate (the
primary's words as the reference), computed once both exist: `whisperq models compare`
and the metric ``whisperq_shadow_wer`` report it per pair of models.
"""

from __future__ import annotations

import re
import unicodedata
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Float, String, Text, func, select
from sqlalchemy.orm import Mapped, mapped_column

from models.db import Base, UTCDateTime, delete_of_jobs, utcnow
from models.jobs.record import Job, JobStatus
from models.security.crypto import SealedAttribute

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from models.runtime import Runtime


class ShadowResult(Base):
    __tablename__ = "shadow_results"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    job_id: Mapped[str] = mapped_column(String(36), index=True)
    model: Mapped[str] = mapped_column(String(48))
    model_version: Mapped[str | None] = mapped_column(String(80))
    primary_model: Mapped[str | None] = mapped_column(String(48))
    primary_version: Mapped[str | None] = mapped_column(String(80))
    text_token: Mapped[str | None] = mapped_column("text", Text)
    # Word error rate of the candidate against the primary: 0 when they agree word for word.
    wer: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)

    text = SealedAttribute("text_token", "shadow_results.text")


_WORD = re.compile(r"[^\w']+")


def words(text: str) -> list[str]:
    """Words for comparing two transcripts: case, accents' forms and punctuation do not count."""
    text = unicodedata.normalize("NFKC", text or "").lower()
    return [w.strip("'") for w in _WORD.split(text) if w.strip("'")]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words, by jiwer; 0 for two empty texts."""
    import jiwer

    ref, hyp = " ".join(words(reference)), " ".join(words(hypothesis))
    if not ref:
        return 0.0 if not hyp else 1.0
    if not hyp:
        return 1.0
    return float(jiwer.wer(ref, hyp))


def record_shadow(rt: Runtime, job_id: str, model: str, version: str | None, text: str) -> ShadowResult | None:
    """Store a candidate's transcript of a job, and the agreement if the primary's is there.
    None when the job is gone (deleted meanwhile): nothing is kept of it."""
    from models.jobs import metrics

    with rt.db.session(write=True) as session:
        job = session.get(Job, job_id)
        if job is None or job.deleted_at is not None:
            return None
        row = ShadowResult(id=str(uuid.uuid4()), job_id=job_id, model=model, model_version=version)
        row.text = text
        session.add(row)
        session.flush()
        _score(job, row)
        if row.wer is not None:
            metrics.observe_shadow(row.primary_model, row.model, row.wer)
        return row


def score_waiting_shadows(session: Session, job: Job) -> list[tuple[str | None, str, float]]:
    """The job's transcript is stored: compare it with shadow transcripts that came first.
    Returns (primary, candidate, wer) of each comparison made, for the metrics."""
    out = []
    for row in session.execute(
        select(ShadowResult).where(ShadowResult.job_id == job.id, ShadowResult.wer.is_(None))
    ).scalars():
        _score(job, row)
        if row.wer is not None:
            out.append((row.primary_model, row.model, row.wer))
    return out


def _score(job: Job, row: ShadowResult) -> None:
    """Score a shadow transcript against the job's own (its word error rate), once the job is COMPLETED."""
    if job.state is not JobStatus.COMPLETED or job.result_purged_at is not None:
        return
    row.primary_model, row.primary_version = job.model, job.model_version
    row.wer = round(word_error_rate(job.result_text or "", row.text or ""), 4)


def forget_shadows(session: Session, job_ids: list[str]) -> int:
    """Deleting a job (or retention purging its transcript) takes its shadow transcripts too."""
    if not job_ids:
        return 0
    return delete_of_jobs(session, ShadowResult, job_ids)


def compare(rt: Runtime, model: str | None = None) -> list[dict[str, Any]]:
    """Agreement per (primary, candidate, candidate version): jobs compared, mean and median WER,
    and the share of jobs where the two agree word for word."""
    query = select(ShadowResult.primary_model, ShadowResult.model, ShadowResult.model_version, ShadowResult.wer).where(
        ShadowResult.wer.is_not(None)
    )
    if model:
        query = query.where((ShadowResult.model == model) | (ShadowResult.primary_model == model))
    groups: dict[tuple[str | None, str, str | None], list[float]] = {}
    with rt.db.session() as session:
        for primary, candidate, version, wer in session.execute(query):
            groups.setdefault((primary, candidate, version), []).append(cast(float, wer))  # compared rows only
        waiting = session.execute(
            select(func.count()).select_from(ShadowResult).where(ShadowResult.wer.is_(None))
        ).scalar_one()
    out = []
    for (primary, candidate, version), wers in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        wers.sort()
        n = len(wers)
        median = wers[n // 2] if n % 2 else (wers[n // 2 - 1] + wers[n // 2]) / 2
        out.append(
            {
                "primary": primary,
                "candidate": candidate,
                "candidate_version": version,
                "jobs": n,
                "mean_wer": round(sum(wers) / n, 4),
                "median_wer": round(median, 4),
                "identical": round(sum(w == 0 for w in wers) / n, 4),
            }
        )
    if waiting:
        out.append({"waiting_for_primary": waiting})
    return out
