"""Worker heartbeats: each worker process says every few seconds that it is alive, which
pool it serves (an inference worker: which models), how many jobs it can hold, and the host
it runs on with that host's free disk (its data dir) and memory, and (an inference worker)
the speed its batches reach (models.jobs.throughput). Estimates, `/readyz`, the metrics and
`whisperq status` read them: the database is what every host shares."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import JSON, BigInteger, Integer, String, delete, select
from sqlalchemy.orm import Mapped, mapped_column

from models.db import Base, UTCDateTime, utcnow
from models.jobs import throughput

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from models.runtime import Runtime

log = logging.getLogger(__name__)

INTERVAL = 10.0
# How soon after a batch its speed goes out (throughput.news).
NEWS_INTERVAL = 1.0
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
    # The machine it runs on, and what that machine has left (revision 0004).
    host: Mapped[str | None] = mapped_column(String(255))
    disk_free_bytes: Mapped[int | None] = mapped_column(BigInteger)
    disk_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_available_bytes: Mapped[int | None] = mapped_column(BigInteger)
    memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # An inference worker's speed by model (models.jobs.throughput.figures; revision 0009).
    throughput: Mapped[dict[str, Any] | None] = mapped_column(JSON)


def host_figures(data_dir: str | os.PathLike[str]) -> dict[str, int | str | None]:
    """This host's name, the free and total bytes of the file system its data dir is on
    (where spools and, on local storage, the audio go) and its available and total memory."""
    figures: dict[str, int | str | None] = {"host": socket.gethostname()}
    try:
        disk = shutil.disk_usage(_existing(data_dir))
        figures.update(disk_free_bytes=disk.free, disk_total_bytes=disk.total)
    except OSError:
        figures.update(disk_free_bytes=None, disk_total_bytes=None)
    figures.update(_memory())
    return figures


def _existing(path: str | os.PathLike[str]) -> Path:
    from pathlib import Path

    path = Path(path)
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


def _memory() -> dict[str, int | None]:
    """MemAvailable and MemTotal from /proc/meminfo (Linux); the page counts elsewhere."""
    try:
        with open("/proc/meminfo") as fh:
            info = {k: int(v.split()[0]) * 1024 for k, v in (line.split(":", 1) for line in fh if ":" in line)}
        return {"memory_available_bytes": info.get("MemAvailable"), "memory_total_bytes": info.get("MemTotal")}
    except (OSError, ValueError):
        try:
            page = os.sysconf("SC_PAGE_SIZE")
            return {
                "memory_available_bytes": page * os.sysconf("SC_AVPHYS_PAGES"),
                "memory_total_bytes": page * os.sysconf("SC_PHYS_PAGES"),
            }
        except (ValueError, OSError, AttributeError):
            return {"memory_available_bytes": None, "memory_total_bytes": None}


def beat(
    rt: Runtime,
    worker_id: str,
    hostname: str,
    pool: str,
    slots: int,
    started_at: datetime,
    models: tuple[str, ...] = (),
) -> None:
    figures = dict(host_figures(rt.settings.data_dir), throughput=throughput.figures())
    with rt.db.session() as session:
        row = session.get(WorkerHeartbeat, worker_id)
        if row is None:
            session.add(
                WorkerHeartbeat(
                    worker_id=worker_id,
                    hostname=hostname,
                    pool=pool,
                    slots=slots,
                    started_at=started_at,
                    last_seen_at=utcnow(),
                    models=",".join(models) or None,
                    **figures,
                )
            )
        else:
            row.last_seen_at = utcnow()
            for name, value in figures.items():
                setattr(row, name, value)


def forget(rt: Runtime, worker_id: str) -> None:
    with rt.db.session() as session:
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.worker_id == worker_id))


def alive(rt: Runtime, pool: str | None = None, now: datetime | None = None) -> list[dict[str, Any]]:
    now = now or utcnow()
    query = select(WorkerHeartbeat).where(WorkerHeartbeat.last_seen_at >= now - ALIVE)
    if pool is not None:
        query = query.where(WorkerHeartbeat.pool == pool)
    with rt.db.session() as session:
        return [
            {
                "worker_id": w.worker_id,
                "hostname": w.hostname,
                "pool": w.pool,
                "slots": w.slots,
                "started_at": w.started_at,
                "last_seen_at": w.last_seen_at,
                "models": w.models.split(",") if w.models else [],
                "host": w.host or w.hostname.rsplit("@", 1)[-1],
                "disk_free_bytes": w.disk_free_bytes,
                "disk_total_bytes": w.disk_total_bytes,
                "memory_available_bytes": w.memory_available_bytes,
                "memory_total_bytes": w.memory_total_bytes,
                "throughput": w.throughput or {},
            }
            for w in session.scalars(query)
        ]


def by_host(workers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The live workers grouped by the host they run on: how many of each pool, their slots,
    the models served there, and the host's newest free disk and memory figures."""
    hosts: dict[str, dict[str, Any]] = {}
    for w in sorted(workers, key=lambda w: w["last_seen_at"]):
        host = hosts.setdefault(w["host"], {"workers": {}, "slots": {}, "models": set()})
        host["workers"][w["pool"]] = host["workers"].get(w["pool"], 0) + 1
        host["slots"][w["pool"]] = host["slots"].get(w["pool"], 0) + w["slots"]
        host["models"].update(w["models"])
        for name in ("disk_free_bytes", "disk_total_bytes", "memory_available_bytes", "memory_total_bytes"):
            if w[name] is not None:
                host[name] = w[name]  # the newest heartbeat's: they are sorted oldest first
    for host in hosts.values():
        host["models"] = sorted(host["models"])
    return dict(sorted(hosts.items()))


def served_models(rt: Runtime, now: datetime | None = None) -> set[str]:
    """The models some live inference worker serves now."""
    return {m for w in alive(rt, pool="inference", now=now) for m in w["models"]}


def start_heartbeat(
    get_rt: Callable[[], Runtime], worker_id: str, hostname: str, pool: str, slots: int, models: tuple[str, ...] = ()
) -> threading.Event:
    """Beat from a daemon thread until the returned event is set: every INTERVAL, and within a
    second of a batch when the pool's speed moved (a burst's estimates need it at once)."""
    stop = threading.Event()
    started = utcnow()

    def run() -> None:
        due = 0.0
        while True:
            if time.monotonic() >= due or throughput.news():
                try:
                    beat(get_rt(), worker_id, hostname, pool, slots, started, models)
                except Exception as exc:  # the database may be restarting; try again next time
                    log.warning("heartbeat not recorded: %s", exc)
                due = time.monotonic() + INTERVAL
            if stop.wait(NEWS_INTERVAL):
                break
        with contextlib.suppress(Exception):
            forget(get_rt(), worker_id)

    threading.Thread(target=run, name="whisperq-heartbeat", daemon=True).start()
    return stop
