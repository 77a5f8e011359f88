"""Key rotation: what is stored under which key, and re-encrypting it under the active one.

Safe while the service runs: a file is rewritten and swapped in atomically by its store
(Storage.reseal), only if it is still the file that was read (a job deleted meanwhile stays
deleted); a transcript is rewritten in a transaction that locks its row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, Text, or_, select, type_coerce

from models.jobs.deadletter import DeadLetter
from models.jobs.record import Job
from models.jobs.shadows import ShadowResult
from models.security.crypto import DecryptionError, current_keyring, value_is_bound, value_key_id

if TYPE_CHECKING:
    from models.runtime import Runtime

FOLDERS = ("audio", "prepared")
PLAIN = "(unencrypted)"
BATCH = 200


@dataclass
class Usage:
    files: Counter[str] = field(default_factory=Counter)
    transcripts: Counter[str] = field(default_factory=Counter)


@dataclass
class RotationReport:
    files_rewritten: int = 0
    files_current: int = 0
    files_gone: int = 0  # deleted (or rewritten by someone else) while rotation ran
    transcripts_rewritten: int = 0
    transcripts_current: int = 0
    failures: list[str] = field(default_factory=list)


def stored_files(rt: Runtime) -> Iterator[str]:
    """The reference of every finished file the store holds (not temporary parts, not tmp/)."""
    for stored in rt.storage.listing(FOLDERS):
        yield stored.ref


# A job's sealed values (models.jobs.record), by column: JSON ones hold their token as a JSON string.
JOB_SEALED = {
    "result_text": Text,
    "result_segments": JSON,
    "correction": JSON,
    "callback_url": Text,
    "audio_url": Text,
    "prompt": Text,
    "hotwords": Text,
}


def _transcript_rows(rt: Runtime) -> Iterator[tuple[str, set[str], bool]]:
    """(job id, the key ids of its sealed values: its transcript, a client's correction, what a
    client said of it; whether all are bound to the row), reading the raw tokens."""
    table = Job.__table__
    query = select(table.c.id, *(type_coerce(table.c[name], kind) for name, kind in JOB_SEALED.items())).where(
        or_(*(table.c[name].is_not(None) for name in JOB_SEALED))
    )
    with rt.db.session() as session:
        for job_id, *raw in session.execute(query):
            values = [v for v in raw if v is not None]
            kids = {value_key_id(v) or PLAIN for v in values}
            if kids:  # (a JSON null is no value)
                yield job_id, kids, all(value_is_bound(v) for v in values)


def usage(rt: Runtime) -> Usage:
    out = Usage()
    for ref in stored_files(rt):
        try:
            out.files[rt.storage.key_id(ref) or PLAIN] += 1
        except (FileNotFoundError, DecryptionError):
            out.files["(unreadable)"] += 1
    for _job_id, kids, _bound in _transcript_rows(rt):
        for kid in kids:
            out.transcripts[kid] += 1
    for _row_id, kid, _bound in _shadow_rows(rt):
        out.transcripts[kid] += 1
    return out


def _sealed_rows(rt: Runtime, key: Any, column: Any) -> Iterator[tuple[str, str, bool]]:
    """(row key, key id, bound) of each sealed value in `column` that is set."""
    with rt.db.session() as session:
        for row_id, token in session.execute(select(key, type_coerce(column, Text)).where(column.is_not(None))):
            yield row_id, value_key_id(token) or PLAIN, value_is_bound(token)


def _shadow_rows(rt: Runtime) -> Iterator[tuple[str, str, bool]]:
    """(row id, key id, bound) of each shadow transcript (models.jobs.shadows)."""
    table = ShadowResult.__table__
    return _sealed_rows(rt, table.c.id, table.c.text)


def _traceback_rows(rt: Runtime) -> Iterator[tuple[str, str, bool]]:
    """(job id, key id, bound) of each dead letter's traceback (models.jobs.deadletter)."""
    table = DeadLetter.__table__
    return _sealed_rows(rt, table.c.job_id, table.c.traceback)


def _rotate_tracebacks(rt: Runtime, active: str, report: RotationReport) -> None:
    stale = [job_id for job_id, kid, bound in _traceback_rows(rt) if kid != active or not bound]
    for start in range(0, len(stale), BATCH):
        with rt.db.session(write=True) as session:
            query = select(DeadLetter).where(DeadLetter.job_id.in_(stale[start : start + BATCH])).with_for_update()
            for row in session.execute(query).scalars():
                try:
                    row.traceback = row.traceback  # sealed again under the active key
                except DecryptionError as exc:
                    report.failures.append(f"dead letter {row.job_id}: {exc}")


def _rotate_shadows(rt: Runtime, active: str, report: RotationReport) -> None:
    stale = [row_id for row_id, kid, bound in _shadow_rows(rt) if kid != active or not bound]
    for start in range(0, len(stale), BATCH):
        with rt.db.session(write=True) as session:
            query = select(ShadowResult).where(ShadowResult.id.in_(stale[start : start + BATCH])).with_for_update()
            for row in session.execute(query).scalars():
                try:
                    row.text = row.text  # sealed again under the active key
                    report.transcripts_rewritten += 1
                except DecryptionError as exc:
                    report.failures.append(f"shadow transcript {row.id}: {exc}")


def rotate(rt: Runtime, progress: Callable[[str], None] | None = None) -> RotationReport:
    """Re-encrypt every stored file and transcript that is not under the active key, or (a
    transcript written by an earlier version) not yet bound to its row."""
    report = RotationReport()
    active = current_keyring().active
    for ref in stored_files(rt):
        try:
            if rt.storage.key_id(ref) == active:
                report.files_current += 1
            elif rt.storage.reseal(ref):
                report.files_rewritten += 1
            else:
                report.files_gone += 1
        except FileNotFoundError:
            report.files_gone += 1
        except DecryptionError as exc:
            report.failures.append(str(exc))
        if progress and (report.files_rewritten + 1) % 1000 == 0:
            progress(f"{report.files_rewritten} files re-encrypted so far")
    stale = []
    for job_id, kids, bound in _transcript_rows(rt):
        if kids == {active} and bound:
            report.transcripts_current += 1
        else:
            stale.append(job_id)
    _rotate_shadows(rt, active, report)
    _rotate_tracebacks(rt, active, report)
    for start in range(0, len(stale), BATCH):
        batch = stale[start : start + BATCH]
        try:
            report.transcripts_rewritten += _reencrypt_rows(rt, batch)
        except DecryptionError:
            for job_id in batch:  # find the rows that cannot be read, keep going with the rest
                try:
                    report.transcripts_rewritten += _reencrypt_rows(rt, [job_id])
                except DecryptionError as exc:
                    report.failures.append(f"job {job_id}: {exc}")
    return report


def _reencrypt_rows(rt: Runtime, ids: list[str]) -> int:
    done = 0
    with rt.db.session(write=True) as session:
        for job in session.execute(select(Job).where(Job.id.in_(ids)).with_for_update()).scalars():
            for name in JOB_SEALED:
                value = getattr(job, name)
                if value is not None:  # sealed again: under the active key, bound to its row
                    setattr(job, name, value)
            done += 1
    return done
