"""A worker's own metrics over HTTP, for Prometheus to scrape (tasks.worker starts it).

Off unless WHISPERQ_METRICS_PORT is set. Each Celery worker serves one port, on
WHISPERQ_METRICS_ADDRESS (127.0.0.1 unless set: the port asks for no token, so a scraper on
another machine, as in Kubernetes, needs 0.0.0.0 set deliberately): the base port plus its
pool's offset (prepare +0, inference +1, notify +2), so that one host running the Procfile
exposes base..base+2. A second worker of the same pool on the same host finds its port taken
and takes the first free one from base+3 up to base+99 (it logs which). In Kubernetes, one
pool per Deployment, each pod serves its pool's port.

Threads pools (inference, notify) run jobs in the worker process itself and serve its
registry. The prefork pool (prepare) runs them in child processes: their metrics go
through prometheus_client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR, a fresh
directory per worker start, removed at shutdown) and the main process serves the sum.
Every port also has the serving process's `process_*` metrics (resident memory), the
prefork children's memory, and `whisperq_gpu_memory_bytes` where a model runs on CUDA.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

from config.celeryconfig import pool_of
from config.settings import METRICS_PORT_SPAN

log = logging.getLogger(__name__)

OFFSETS = {"prepare": 0, "inference": 1, "notify": 2}
FIRST_SPARE = 3
_state: dict[str, Any] = {}


def pool_name(app) -> str:
    """The pool a worker serves, from the queues it consumes (as its heartbeat names it)."""
    consumed = sorted(app.amqp.queues.consume_from or {})
    return ",".join(dict.fromkeys(pool_of(name) for name in consumed)) or "default"


def ports(base: int, pool: str) -> list[int]:
    """The ports a worker of this pool tries, in order."""
    spare = [base + n for n in range(FIRST_SPARE, METRICS_PORT_SPAN)]
    return ([base + OFFSETS[pool]] if pool in OFFSETS else []) + spare


def setup(worker) -> None:
    """worker_init, before the pool starts: choose multiprocess mode for prefork and start
    observing. Must run before any worker metric is created."""
    settings = worker.app.conf.whisperq_settings
    if not settings.metrics_port:
        return
    from celery import concurrency
    from celery.concurrency.prefork import TaskPool

    pool_cls = concurrency.get_implementation(worker.pool_cls)
    prefork = isinstance(pool_cls, type) and issubclass(pool_cls, TaskPool)
    _state.update(prefork=prefork, directory=None, owned=False)
    if prefork:
        directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not directory:
            directory = tempfile.mkdtemp(prefix="whisperq-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory  # inherited by the children
            _state["owned"] = True
        _state["directory"] = directory
        from prometheus_client import values

        values.ValueClass = values.get_value_class()  # in case prometheus_client was imported already
    from models.jobs import metrics

    metrics.enable()


def registry_for(prefork: bool, info: dict[str, str], directory: str | None = None):
    """What a worker serves: its jobs' metrics (its own, or its children's sum), process
    metrics, GPU memory and a `whisperq_worker_info` series that names it."""
    from prometheus_client import CollectorRegistry, ProcessCollector

    from models.jobs import metrics

    registry = CollectorRegistry()
    if prefork:
        from prometheus_client.multiprocess import MultiProcessCollector

        MultiProcessCollector(registry, path=directory)
        registry.register(_ChildMemory())
    else:
        registry.register(metrics.registry())
        from models.runtime import current_runtime

        registry.register(metrics.GPUMemory(lambda: rt.built("engine") if (rt := current_runtime()) else []))
    ProcessCollector(registry=registry)
    registry.register(_Info(info))
    return registry


def serve(worker, host: str | None = None) -> int | None:
    """worker_ready: start the HTTP server; returns the port, or None when off or no port was free."""
    settings = worker.app.conf.whisperq_settings
    if not settings.metrics_port or "prefork" not in _state:
        return None
    pool = pool_name(worker.app)
    info = {
        "pool": pool,
        "hostname": worker.hostname,
        "worker_id": os.environ.get("WHISPERQ_WORKER_ID", ""),
        "mode": "prefork" if _state["prefork"] else "threads",
    }
    try:
        registry = registry_for(_state["prefork"], info, _state.get("directory"))
    except Exception:
        log.exception("worker metrics not served")
        return None
    address = host or settings.metrics_address
    try:
        ipaddress.ip_address(address)
    except ValueError:
        log.error(
            "worker metrics not served: WHISPERQ_METRICS_ADDRESS=%r is not an IP address; set it to 127.0.0.1 "
            "(this host only) or 0.0.0.0 (every interface, for a scraper on another machine)",
            address,
        )
        return None
    port = listen(registry, address, ports(settings.metrics_port, pool))
    if port is not None and pool in OFFSETS and port != settings.metrics_port + OFFSETS[pool]:
        log.warning(
            "metrics port %d was taken; this %s worker serves its metrics on %d instead",
            settings.metrics_port + OFFSETS[pool],
            pool,
            port,
        )
    return port


def listen(registry, host: str, candidates: Iterable[int]) -> int | None:
    from prometheus_client import start_http_server

    for port in candidates:
        try:
            server, _thread = start_http_server(port, addr=host, registry=registry)
        except OSError:
            continue
        log.info("worker metrics on http://%s:%d/metrics", host, port)
        _state.update(port=port, server=server)
        return port
    log.warning("worker metrics not served: no free port from WHISPERQ_METRICS_PORT up")
    return None


def shutdown() -> None:
    """worker_shutdown: remove the multiprocess directory this worker made."""
    if _state.get("owned") and _state.get("directory"):
        shutil.rmtree(_state["directory"], ignore_errors=True)


class _Info:
    def __init__(self, labels: dict[str, str]):
        self.labels = labels

    def collect(self) -> Iterator:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily("whisperq_worker_info", "The worker serving these metrics", labels=list(self.labels))
        family.add_metric(list(self.labels.values()), 1.0)
        yield family


class _ChildMemory:
    """Resident memory of each prefork child (the serving process's own is process_*)."""

    def collect(self) -> Iterator:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "whisperq_pool_process_resident_memory_bytes", "Resident memory of each pool child process", labels=["pid"]
        )
        page = os.sysconf("SC_PAGE_SIZE")
        me = os.getpid()
        try:
            pids = [p for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                if ppid != me:
                    continue
                with open(f"/proc/{pid}/statm") as fh:
                    family.add_metric([pid], float(int(fh.read().split()[1]) * page))
            except (OSError, ValueError, IndexError):
                continue
        yield family
