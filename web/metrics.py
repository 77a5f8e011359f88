"""`GET /metrics`: the whole service as Prometheus sees it, computed at scrape time.

Any web process answers for the cluster: messages waiting in the broker per queue and
priority, jobs by status and where they wait (the database), the oldest wait, dead
letters, live workers (heartbeats), free space in the data dir, and the alert
thresholds in force, so alert rules compare against the configured numbers. The values
are cached for two seconds: several scrapers, or gunicorn's processes, cost the broker
and the database little. Latencies, batches and the real-time factor are observed in
the workers and served on their own ports (tasks.metrics).

Usage: this month's (UTC) billed audio seconds, billed jobs, audio held by jobs in flight and
the quota of each API key (models.access.usage), labelled by the key's id: one series per
key and metric, which is fine for the tens or hundreds of keys operators make by hand (with
thousands, drop them with a relabel rule and read GET /v1/usage instead).

Queue depth: on Redis each queue is one list per priority step, counted directly
(`priority` = high, normal, low). RabbitMQ gives one count per queue (`priority="all"`);
the split by tier is then `whisperq_jobs_waiting`, from the database. On SQS each tier is a
queue of its own, counted as SQS estimates it (ApproximateNumberOfMessages: approximate, and
without the messages workers hold). `sum by (queue)` of `whisperq_queue_depth` is the
queue's depth on any broker.

Who may read it: with WHISPERQ_METRICS_TOKEN set, whoever sends it (or an admin key) as a
bearer token; without, this machine only (loopback, not through a proxy), since the usage
series name every API key. Anyone else gets 403 saying to set the token.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from flask import Blueprint, Flask, Response, current_app, request
from sqlalchemy import func, select

from config import PRIORITIES, Settings
from config.celeryconfig import QUEUES
from models.jobs.deadletter import DeadLetter
from models.jobs.record import Job, JobStatus, Stage, utcnow
from models.jobs.workers import alive, by_host
from models.runtime import Runtime

if TYPE_CHECKING:
    from models.access.apikeys import ApiKey

log = logging.getLogger(__name__)

bp = Blueprint("metrics", __name__)

CACHE_SECONDS = 2.0
# Headers a reverse proxy adds: a request it forwards arrives from loopback but is not local.
PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")
POOLS = tuple(QUEUES.values())
STAGE_QUEUES = {"prepare": "whisperq.prepare", "inference": "whisperq.inference"}


def broker_depths(celery) -> dict[tuple[str, str], int]:
    """(queue, priority) -> messages waiting, read from the broker itself (its transport)."""
    from tasks.broker.transport import transport_for

    return transport_for(celery).depths()


def database_figures(rt: Runtime, now: datetime | None = None) -> dict[str, Any]:
    """Job counts, waits and dead letters, as the database has them."""
    now = now or utcnow()
    pending = Job.status == JobStatus.PENDING.value
    queued = (Job.status == JobStatus.PROCESSING.value) & (Job.stage == Stage.QUEUED.value)
    with rt.db.session() as session:
        statuses = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
        waiting = {
            ("prepare", p): n
            for p, n in session.execute(select(Job.priority, func.count()).where(pending).group_by(Job.priority))
        }
        waiting.update(
            {
                ("inference", p): n
                for p, n in session.execute(select(Job.priority, func.count()).where(queued).group_by(Job.priority))
            }
        )
        running = dict(
            session.execute(
                select(Job.stage, func.count())
                .where(
                    Job.status == JobStatus.PROCESSING.value, Job.stage.in_([Stage.PREPARE.value, Stage.INFER.value])
                )
                .group_by(Job.stage)
            ).all()
        )
        # A job waits for preparation since it was queued (or replayed), or since its
        # retry fell due; for inference, since its preparation began (no finer record).
        first = session.execute(
            select(func.min(func.coalesce(Job.queued_at, Job.created_at))).where(pending, Job.next_attempt_at.is_(None))
        ).scalar()
        retry = session.execute(
            select(func.min(Job.next_attempt_at)).where(pending, Job.next_attempt_at <= now)
        ).scalar()
        prepared = session.execute(select(func.min(Job.started_at)).where(queued)).scalar()
        dead = session.execute(select(func.count()).select_from(DeadLetter)).scalar_one()
    oldest_prepare = min((t for t in (first, retry) if t is not None), default=None)
    return {
        "statuses": statuses,
        "waiting": waiting,
        "running": {"prepare": running.get("prepare", 0), "inference": running.get("infer", 0)},
        "oldest": {STAGE_QUEUES["prepare"]: _age(now, oldest_prepare), STAGE_QUEUES["inference"]: _age(now, prepared)},
        "dead_letters": int(dead),
    }


def _age(now: datetime, since: datetime | None) -> float:
    return max(0.0, (now - since).total_seconds()) if since is not None else 0.0


def thresholds(settings: Settings) -> dict[str, float]:
    """The alert thresholds (WHISPERQ_ALERT_*), as deploy/prometheus-alerts.yml names them."""
    return {
        "queue_age_seconds": settings.alert_queue_age_seconds,
        "queue_depth": settings.alert_queue_depth,
        "failure_rate": settings.alert_failure_rate,
        "dead_letters": settings.alert_dead_letters,
        "disk_free_bytes": settings.alert_disk_free_bytes,
    }


class ClusterCollector:
    """A prometheus_client collector whose values are read at scrape time, cached briefly.
    A source that does not answer is left out and `whisperq_metrics_source_up` says so."""

    def __init__(self, rt: Runtime, celery, ttl: float = CACHE_SECONDS):
        self.rt, self.celery, self.ttl = rt, celery, ttl
        self._lock = threading.Lock()
        self._cached: list = []
        self._until = 0.0

    def invalidate(self) -> None:
        with self._lock:
            self._until = 0.0

    def collect(self):
        with self._lock:
            if time.monotonic() >= self._until:
                self._cached = self._compute()
                self._until = time.monotonic() + self.ttl
            return list(self._cached)

    def _compute(self) -> list:
        from prometheus_client.core import GaugeMetricFamily as Gauge

        out: list = []
        up = Gauge("whisperq_metrics_source_up", "Whether /metrics could read this source", labels=["source"])
        for source, read in (
            ("broker", self._broker),
            ("database", self._database),
            ("disk", self._disk),
            ("usage", self._usage),
        ):
            try:
                out.extend(read(Gauge))
                up.add_metric([source], 1.0)
            except Exception as exc:
                log.warning("metrics: %s not read: %s", source, exc)
                up.add_metric([source], 0.0)
        limits = Gauge("whisperq_alert_threshold", "Alert thresholds in force (WHISPERQ_ALERT_*)", labels=["name"])
        for name, value in thresholds(self.rt.settings).items():
            limits.add_metric([name], float(value))
        return [*out, up, limits]

    def _broker(self, Gauge) -> list:
        depth = Gauge(
            "whisperq_queue_depth",
            'Messages waiting in the broker, per queue and priority tier (RabbitMQ: priority="all")',
            labels=["queue", "priority"],
        )
        for (queue, tier), count in sorted(broker_depths(self.celery).items()):
            depth.add_metric([queue, tier], float(count))
        return [depth]

    def _database(self, Gauge) -> list:
        figures = database_figures(self.rt)
        jobs = Gauge("whisperq_jobs", "Jobs in the database by status", labels=["status"])
        for status in JobStatus:
            jobs.add_metric([status.value], float(figures["statuses"].get(status.value, 0)))
        waiting = Gauge(
            "whisperq_jobs_waiting",
            "Jobs waiting per priority and stage, from the database "
            "(prepare: PENDING; inference: prepared, not started)",
            labels=["priority", "stage"],
        )
        for stage in ("prepare", "inference"):
            for tier in PRIORITIES:
                waiting.add_metric([tier, stage], float(figures["waiting"].get((stage, tier), 0)))
        running = Gauge("whisperq_jobs_running", "Jobs being prepared or transcribed now", labels=["stage"])
        for stage, count in figures["running"].items():
            running.add_metric([stage], float(count))
        oldest = Gauge(
            "whisperq_queue_oldest_age_seconds",
            "Age of the oldest job waiting for this queue's pool (0 when none waits)",
            labels=["queue"],
        )
        for queue, age in figures["oldest"].items():
            oldest.add_metric([queue], age)
        dead = Gauge("whisperq_dead_letters", "Jobs in the dead-letter store", value=float(figures["dead_letters"]))
        workers = alive(self.rt)
        count = Gauge("whisperq_workers_alive", "Worker processes with a recent heartbeat", labels=["pool"])
        slots = Gauge("whisperq_worker_slots", "Jobs the live workers can hold at once", labels=["pool"])
        for pool in sorted(set(POOLS) | {w["pool"] for w in workers}):
            mine = [w for w in workers if w["pool"] == pool]
            count.add_metric([pool], float(len(mine)))
            slots.add_metric([pool], float(sum(w["slots"] for w in mine)))
        served = Gauge(
            "whisperq_model_workers",
            "Live inference workers serving each model (0: its jobs are refused, the default model's wait)",
            labels=["model"],
        )
        for spec in self.rt.settings.models:
            serving = sum(spec.name in w["models"] for w in workers if w["pool"] == "inference")
            served.add_metric([spec.name], float(serving))
        per_host = Gauge(
            "whisperq_host_workers", "Live worker processes on each host, by pool", labels=["host", "pool"]
        )
        disk = Gauge(
            "whisperq_host_disk_free_bytes",
            "Free bytes on the file system of each worker host's data dir (from its workers' heartbeats)",
            labels=["host"],
        )
        memory = Gauge(
            "whisperq_host_memory_available_bytes",
            "Available memory of each worker host (from its workers' heartbeats)",
            labels=["host"],
        )
        for name, host in by_host(workers).items():
            for pool, n in host["workers"].items():
                per_host.add_metric([name, pool], float(n))
            if host.get("disk_free_bytes") is not None:
                disk.add_metric([name], float(host["disk_free_bytes"]))
            if host.get("memory_available_bytes") is not None:
                memory.add_metric([name], float(host["memory_available_bytes"]))
        return [jobs, waiting, running, oldest, dead, count, slots, served, per_host, disk, memory]

    def _usage(self, Gauge) -> list:
        from models.access.apikeys import list_keys
        from models.access.quotas import quota_of
        from models.access.usage import Figures, by_key_this_month

        found = by_key_this_month(self.rt)
        keys: dict[str | None, ApiKey] = {k.id: k for k in list_keys(self.rt, include_revoked=True)}
        owners = {k for k in found} | {k.id for k in keys.values() if k.revoked_at is None}
        labels = ["key", "name", "tier"]
        audio = Gauge(
            "whisperq_usage_audio_seconds",
            "Audio seconds billed this month (UTC) per API key: completed "
            'jobs, and what cancelled ones transcribed (key="anonymous": jobs without a key)',
            labels=labels,
        )
        jobs = Gauge("whisperq_usage_jobs", "Jobs billed this month (UTC) per API key", labels=labels)
        held = Gauge(
            "whisperq_usage_in_flight_audio_seconds",
            "Audio seconds of each API key's jobs in flight, held against its quota",
            labels=labels,
        )
        quota = Gauge(
            "whisperq_quota_audio_seconds",
            "Each API key's monthly audio quota (keys whose tier has one)",
            labels=labels,
        )
        for owner in sorted(owners, key=lambda o: o or ""):
            key = keys.get(owner)
            names = [owner or "anonymous", key.name if key else "", key.tier if key else ""]
            figures = found.get(owner, Figures())
            audio.add_metric(names, figures.audio_seconds)
            jobs.add_metric(names, float(figures.jobs))
            held.add_metric(names, figures.in_flight_audio_seconds)
            limit = quota_of(self.rt, owner, tier=key.tier) if key else None
            if limit is not None:
                quota.add_metric(names, limit.seconds)
        return [audio, jobs, held, quota]

    def _disk(self, Gauge) -> list:
        from models.access.admission import free_bytes

        return [
            Gauge(
                "whisperq_data_dir_free_bytes",
                "Free bytes on the data dir's file system",
                value=float(free_bytes(self.rt.settings.data_dir)),
            )
        ]


def init_app(app: Flask) -> None:
    from prometheus_client import CollectorRegistry

    collector = ClusterCollector(app.extensions["whisperq"], app.extensions["celery"])
    registry = CollectorRegistry()
    registry.register(collector)
    app.extensions["whisperq_metrics"] = collector
    app.extensions["whisperq_metrics_registry"] = registry
    app.register_blueprint(bp)


@bp.get("/metrics")
def metrics():
    from prometheus_client.exposition import choose_encoder

    _check_token()

    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return Response(encoder(current_app.extensions["whisperq_metrics_registry"]), content_type=content_type)


def _from_this_machine() -> bool:
    """Whether the request came over loopback (127.0.0.0/8, ::1), not through a proxy."""
    try:
        address = ipaddress.ip_address(request.remote_addr or "")
    except ValueError:
        return False
    address = getattr(address, "ipv4_mapped", None) or address
    return address.is_loopback and not any(h in request.headers for h in PROXY_HEADERS)


def _check_token() -> None:
    """With WHISPERQ_METRICS_TOKEN set, /metrics needs it (or an admin key) as a bearer
    token, as Prometheus sends with `authorization: {credentials: ...}` in its scrape job.
    Without one it answers this machine only: it names every API key and its usage."""
    from models.access.apikeys import BadKey, authenticate
    from models.errors import Forbidden, Unauthorized
    from models.pipeline.door import matches

    from .auth import bearer_token

    rt = current_app.extensions["whisperq"]
    if not rt.settings.metrics_token:
        if _from_this_machine():
            return
        raise Forbidden(
            "/metrics answers only this machine (127.0.0.1) while WHISPERQ_METRICS_TOKEN is unset; "
            "set WHISPERQ_METRICS_TOKEN and have Prometheus send it as a bearer token"
        )
    try:
        token = bearer_token()
        if token is not None and (
            matches(token, rt.settings.metrics_token)
            or matches(token, rt.settings.admin_token)
            or authenticate(rt, token).admin
        ):
            return
    except BadKey:
        pass
    raise Unauthorized("/metrics needs 'Authorization: Bearer <WHISPERQ_METRICS_TOKEN>' (or an admin API key)")
