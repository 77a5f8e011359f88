"""Worker heartbeats: each worker process says every few seconds that it is alive, which
pool it serves (an inference worker: which models) and how many jobs it can hold. Estimates and `whisperq status` read them."""
from __future__ import annotations

import logging
import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Integer, String, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from models.db import Base
from models.db import UTCDateTime, utcnow

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)

INTERVAL = 10.0
# A worker not heard from for this long is taken for dead.
ALIVE = timedelta(seconds=3 * INTERVAL)


class WorkerHeartbeat(Base):
    __tablename__ = "worker_heartbeats"

    worker_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(255))
    pool: Mapped[str] = mapped_column(String(32), index=True)  # prepare, inference, notify
    slots: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    # An inference worker's models (the queues it consumes), comma-separated.
    models: Mapped[str | None] = mapped_column(String(255))


def beat(rt: Runtime, worker_id: str, hostname: str, pool: str, slots: int, started_at: datetime,
         models: tuple[str, ...] = ()) -> None:
    with rt.db.session() as session:
        row = session.get(WorkerHeartbeat, worker_id)
        if row is None:
            session.add(WorkerHeartbeat(worker_id=worker_id, hostname=hostname, pool=pool, slots=slots,
                                        started_at=started_at, last_seen_at=utcnow(), models=",".join(models) or None))
        else:
            row.last_seen_at = utcnow()


def forget(rt: Runtime, worker_id: str) -> None:
    with rt.db.session() as session:
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.worker_id == worker_id))


def alive(rt: Runtime, pool: str | None = None, now: datetime | None = None) -> list[dict[str, Any]]:
    now = now or utcnow()
    query = select(WorkerHeartbeat).where(WorkerHeartbeat.last_seen_at >= now - ALIVE)
    if pool is not None:
        query = query.where(WorkerHeartbeat.pool == pool)
    with rt.db.session() as session:
        return [{"worker_id": w.worker_id, "hostname": w.hostname, "pool": w.pool, "slots": w.slots,
                 "started_at": w.started_at, "last_seen_at": w.last_seen_at,
                 "models": w.models.split(",") if w.models else []} for w in session.scalars(query)]


def served_models(rt: Runtime, now: datetime | None = None) -> set[str]:
    """The models some live inference worker serves now."""
    return {m for w in alive(rt, pool="inference", now=now) for m in w["models"]}


def start_heartbeat(get_rt, worker_id: str, hostname: str, pool: str, slots: int,
                    models: tuple[str, ...] = ()) -> threading.Event:
    """Beat from a daemon thread until the returned event is set."""
    stop = threading.Event()
    started = utcnow()

    def run() -> None:
        while True:
            try:
                beat(get_rt(), worker_id, hostname, pool, slots, started, models)
            except Exception as exc:  # the database may be restarting; try again next time
                log.warning("heartbeat not recorded: %s", exc)
            if stop.wait(INTERVAL):
                break
        try:
            forget(get_rt(), worker_id)
        except Exception:
            pass

    threading.Thread(target=run, name="whisperq-heartbeat", daemon=True).start()
    return stop
