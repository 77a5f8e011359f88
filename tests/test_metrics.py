"""Prometheus metrics: /metrics against the real broker and database, a worker's own
metrics after real jobs (in-process, and from a real prefork worker's port), and the
deploy files (alert rules, dashboard, KEDA, the autoscaler's decision)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import re
import shutil
import subprocess
import time
import urllib.request
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from api import submit_id, wait_for_job
from helpers import CLIPS, free_port, need_service, wait_until
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def parse(text: str) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(client) -> dict[tuple, float]:
    resp = client.get("/metrics")
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.content_type.startswith("text/plain")
    return parse(resp.get_data(as_text=True))


def fetch(port: int) -> dict[tuple, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return parse(resp.read().decode())


def value(samples: dict, metric: str, /, **labels) -> float:
    return samples.get((metric, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict, metric: str, /, **labels) -> float:
    """Sum over the series of `metric` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == metric and labels.items() <= dict(ls).items())


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, DEPLOY / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Settings.


def test_alert_thresholds_and_metrics_port_come_from_the_environment():
    from config import ConfigError, Settings

    s = Settings.from_env({})
    assert (
        s.metrics_port,
        s.alert_queue_age_seconds,
        s.alert_queue_depth,
        s.alert_failure_rate,
        s.alert_dead_letters,
        s.alert_disk_free_bytes,
    ) == (0, 600.0, 1000, 0.05, 1, 5 * 1024**3)
    s = Settings.from_env(
        {
            "WHISPERQ_METRICS_PORT": "9200",
            "WHISPERQ_ALERT_FAILURE_RATE": "0.2",
            "WHISPERQ_ALERT_DISK_FREE_BYTES": "1000",
        }
    )
    assert (s.metrics_port, s.alert_failure_rate, s.alert_disk_free_bytes) == (9200, 0.2, 1000)
    for name, bad in (
        ("WHISPERQ_METRICS_PORT", "70000"),
        ("WHISPERQ_ALERT_QUEUE_DEPTH", "lots"),
        ("WHISPERQ_ALERT_FAILURE_RATE", "1.5"),
        ("WHISPERQ_ALERT_QUEUE_AGE_SECONDS", "-1"),
        ("WHISPERQ_ALERT_DEAD_LETTERS", "-1"),
        ("WHISPERQ_ALERT_DISK_FREE_BYTES", "5GB"),
    ):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: bad})


# /metrics on the web app.


def test_metrics_report_the_database_as_it_is(client, app, settings, celery_app):
    from sqlalchemy import delete, select

    from models.jobs.deadletter import DeadLetter
    from models.jobs.record import Job, JobStatus, utcnow
    from models.jobs.workers import alive, beat, forget

    rt = app.extensions["whisperq"]
    now = utcnow()
    rows = [
        Job(status="PENDING", priority="high", audio_ref="x", created_at=now - timedelta(seconds=400)),
        Job(status="PENDING", priority="high", audio_ref="x", created_at=now - timedelta(seconds=5)),
        # a retry not due yet waits, but its age counts from when it falls due
        Job(
            status="PENDING",
            priority="low",
            audio_ref="x",
            created_at=now - timedelta(hours=5),
            next_attempt_at=now + timedelta(seconds=60),
            attempts=1,
        ),
        Job(
            status="PROCESSING",
            stage="queued",
            priority="normal",
            audio_ref="x",
            created_at=now,
            started_at=now - timedelta(seconds=90),
            attempts=1,
        ),
        Job(status="PROCESSING", stage="infer", priority="normal", audio_ref="x", created_at=now, attempts=1),
        Job(status="FAILED", priority="normal", audio_ref="x", created_at=now, error="gave up"),
        Job(status="COMPLETED", priority="low", audio_ref="x", created_at=now),
    ]
    ids = [job.id or str(uuid.uuid4()) for job in rows]
    for job, job_id in zip(rows, ids, strict=True):
        job.id = job_id
    worker_id = f"metrics-test-{uuid.uuid4().hex[:8]}"
    with rt.db.session() as session:
        session.add_all(rows)
        session.flush()
        session.add(DeadLetter(job_id=ids[5], task="whisperq.transcribe", error="gave up", attempts=3, replays=0))
    beat(rt, worker_id, "test-host", "inference", 8, now)
    try:
        samples = scrape(client)
        with rt.db.session() as session:
            jobs = list(session.scalars(select(Job)))
            dead = len(list(session.scalars(select(DeadLetter))))
        for status in JobStatus:
            assert value(samples, "whisperq_jobs", status=status.value) == sum(j.status == status.value for j in jobs)
        for tier in ("high", "normal", "low"):
            pending = sum(j.status == "PENDING" and j.priority == tier for j in jobs)
            queued = sum(j.status == "PROCESSING" and j.stage == "queued" and j.priority == tier for j in jobs)
            assert value(samples, "whisperq_jobs_waiting", priority=tier, stage="prepare") == pending
            assert value(samples, "whisperq_jobs_waiting", priority=tier, stage="inference") == queued
        assert value(samples, "whisperq_jobs_running", stage="inference") == sum(
            j.status == "PROCESSING" and j.stage == "infer" for j in jobs
        )
        assert value(samples, "whisperq_dead_letters") == dead >= 1

        def oldest(js, since):
            return max((time.time() - since(j).timestamp() for j in js), default=0.0)

        due = [
            j for j in jobs if j.status == "PENDING" and (j.next_attempt_at is None or j.next_attempt_at <= utcnow())
        ]
        expected = oldest(due, lambda j: j.next_attempt_at or j.queued_at or j.created_at)
        assert expected >= 400
        assert value(samples, "whisperq_queue_oldest_age_seconds", queue="whisperq.prepare") == pytest.approx(
            expected, abs=3
        )
        queued = [j for j in jobs if j.status == "PROCESSING" and j.stage == "queued"]
        assert value(samples, "whisperq_queue_oldest_age_seconds", queue="whisperq.inference") == pytest.approx(
            oldest(queued, lambda j: j.started_at), abs=3
        )

        live = alive(rt)
        for pool in ("prepare", "inference", "notify"):
            mine = [w for w in live if w["pool"] == pool]
            assert value(samples, "whisperq_workers_alive", pool=pool) == len(mine)
            assert value(samples, "whisperq_worker_slots", pool=pool) == sum(w["slots"] for w in mine)
        assert value(samples, "whisperq_workers_alive", pool="inference") >= 1

        where = settings.data_dir  # not made yet where the database is not SQLite: its file system then
        while not where.exists():
            where = where.parent
        free = shutil.disk_usage(where).free
        assert value(samples, "whisperq_data_dir_free_bytes") == pytest.approx(free, rel=0.01, abs=64 * 1024**2)
        for name, expected_limit in (
            ("queue_age_seconds", settings.alert_queue_age_seconds),
            ("queue_depth", settings.alert_queue_depth),
            ("failure_rate", settings.alert_failure_rate),
            ("dead_letters", settings.alert_dead_letters),
            ("disk_free_bytes", settings.alert_disk_free_bytes),
        ):
            assert value(samples, "whisperq_alert_threshold", name=name) == expected_limit
        for source in ("broker", "database", "disk"):
            assert value(samples, "whisperq_metrics_source_up", source=source) == 1.0

        # Cached for two seconds, then read again.
        with rt.db.session() as session:
            session.execute(delete(Job).where(Job.id == ids[0]))
        assert value(scrape(client), "whisperq_jobs_waiting", priority="high", stage="prepare") == value(
            samples, "whisperq_jobs_waiting", priority="high", stage="prepare"
        )
        app.extensions["whisperq_metrics"].invalidate()
        assert (
            value(scrape(client), "whisperq_jobs_waiting", priority="high", stage="prepare")
            == value(samples, "whisperq_jobs_waiting", priority="high", stage="prepare") - 1
        )
    finally:
        forget(rt, worker_id)
        with rt.db.session() as session:
            session.execute(delete(DeadLetter).where(DeadLetter.job_id.in_(ids)))
            session.execute(delete(Job).where(Job.id.in_(ids)))


def test_an_unreachable_broker_is_reported_not_raised(app, settings, monkeypatch):
    from tasks.app import celery_for
    from web.metrics import ClusterCollector

    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:1/0")  # Celery reads it over its config
    unreachable = celery_for(settings.__class__.from_env())
    collector = ClusterCollector(app.extensions["whisperq"], unreachable)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in collector.collect() for s in f.samples}
    assert value(samples, "whisperq_metrics_source_up", source="broker") == 0.0
    assert value(samples, "whisperq_metrics_source_up", source="database") == 1.0
    assert not any(name == "whisperq_queue_depth" for name, _ in samples)
    assert value(samples, "whisperq_alert_threshold", name="queue_depth") == settings.alert_queue_depth


# Worker-side metrics.


def test_a_real_job_is_observed_in_the_worker_registry(settings, database, tmp_path):
    from sqlalchemy import select

    from models.errors import TransientJobError
    from models.jobs import metrics
    from models.jobs.operations import fail_job, schedule_retry
    from models.jobs.record import Job, new_job_id
    from models.pipeline.inference import infer_job
    from models.pipeline.preparation import prepare_job
    from models.runtime import get_runtime
    from tasks.metrics import _state, listen, registry_for

    metrics.enable()
    try:
        rt = get_runtime()
        registry = registry_for(False, {"pool": "inference", "hostname": "test", "worker_id": "t", "mode": "threads"})
        port = listen(registry, "127.0.0.1", [free_port()])
        server = _state.pop("server", None)
        before = fetch(port)

        job_id = new_job_id()
        prepared = prepare_job(rt, job_id, str(CLIPS["fox.flac"]["path"]), {"priority": "high", "language": "en"})
        result = infer_job(rt, prepared, rt.batcher)
        assert result["text"]
        # A second job: its file is missing (a transient failure, retried), then it fails for good.
        other = new_job_id()
        with pytest.raises(TransientJobError):
            prepare_job(rt, other, str(tmp_path / "whisperq-metrics-missing.flac"), {"priority": "low"})
        assert schedule_retry(rt, other, "the file is missing") is not None
        fail_job(rt, other, "gave up")
        after = fetch(port)
        if server is not None:
            server.shutdown()
    finally:
        metrics.disable()

    def delta(name, **labels):
        return total(after, name, **labels) - total(before, name, **labels)

    with rt.db.session() as session:
        job = session.scalars(select(Job).where(Job.id == job_id)).one()
    inference = (job.finished_at - job.infer_started_at).total_seconds()
    assert delta("whisperq_job_wait_seconds_count", priority="high") == 1
    assert delta("whisperq_job_wait_seconds_count", priority="low") == 1
    assert 0 <= delta("whisperq_job_wait_seconds_sum", priority="high") < 5
    assert delta("whisperq_job_prepare_seconds_count") == 1  # the second job never got prepared
    assert 0 < delta("whisperq_job_prepare_seconds_sum") < 60
    assert delta("whisperq_job_inference_seconds_count") == 1
    assert delta("whisperq_job_inference_seconds_sum") == pytest.approx(inference, abs=1e-3)
    assert delta("whisperq_job_end_to_end_seconds_count", priority="high") == 1
    assert delta("whisperq_job_end_to_end_seconds_sum", priority="high") == pytest.approx(
        (job.finished_at - job.created_at).total_seconds(), abs=1e-3
    )
    assert delta("whisperq_real_time_factor_count") == 1
    assert delta("whisperq_real_time_factor_sum") == pytest.approx(inference / job.audio_duration, rel=1e-3)
    assert delta("whisperq_jobs_finished_total", status="COMPLETED") == 1
    assert delta("whisperq_jobs_finished_total", status="FAILED") == 1
    assert delta("whisperq_job_retries_total") == 1
    # One window, batched alone: one batch of one.
    assert delta("whisperq_batch_size_count") >= 1
    assert delta("whisperq_batch_size_sum") == delta("whisperq_batch_size_count")
    assert delta("whisperq_batch_wait_seconds_count") == delta("whisperq_batch_size_count")
    # A histogram's +Inf bucket holds every observation.
    assert total(after, "whisperq_job_inference_seconds_bucket", le="+Inf") == total(
        after, "whisperq_job_inference_seconds_count"
    )
    assert value(after, "process_resident_memory_bytes") > 10 * 1024**2
    assert value(after, "whisperq_worker_info", pool="inference", hostname="test", worker_id="t", mode="threads") == 1


def test_a_rolled_back_change_counts_nothing(settings, database):
    from prometheus_client import generate_latest

    from models.jobs import metrics
    from models.jobs.record import Job, new_job_id
    from models.runtime import get_runtime

    rt = get_runtime()
    job_id = new_job_id()
    with rt.db.session() as session:
        session.add(Job(id=job_id, status="PROCESSING", stage="infer", audio_ref="x", attempts=1))
    metrics.enable()
    try:
        before = total(parse(generate_latest(metrics.registry()).decode()), "whisperq_jobs_finished_total")
        with pytest.raises(RuntimeError), rt.db.session() as session:
            session.get(Job, job_id).fail("about to be rolled back")
            session.flush()
            raise RuntimeError("rollback")
        with rt.db.session() as session:
            session.get(Job, job_id).fail("for real")
        after = parse(generate_latest(metrics.registry()).decode())
    finally:
        metrics.disable()
    assert total(after, "whisperq_jobs_finished_total") == before + 1


def test_worker_metrics_listen_on_loopback_unless_told(monkeypatch, caplog):
    """The worker port asks for no token: it binds 127.0.0.1 whatever HOST the web binds,
    and another address only when WHISPERQ_METRICS_ADDRESS names it (a scraper elsewhere)."""
    from types import SimpleNamespace

    from config import Settings
    from tasks import metrics as worker_metrics

    bound = []
    monkeypatch.setattr(worker_metrics, "pool_name", lambda app: "inference")
    monkeypatch.setattr(worker_metrics, "registry_for", lambda *a, **k: object())
    monkeypatch.setattr(worker_metrics, "listen", lambda registry, host, candidates: bound.append(host) or 9201)
    monkeypatch.setitem(worker_metrics._state, "prefork", False)
    for env, address in (
        ({"HOST": "0.0.0.0"}, "127.0.0.1"),
        ({"WHISPERQ_METRICS_ADDRESS": "0.0.0.0"}, "0.0.0.0"),
        ({"WHISPERQ_METRICS_ADDRESS": "::1"}, "::1"),
    ):
        s = Settings.from_env({"WHISPERQ_METRICS_PORT": "9200", **env})
        assert s.metrics_address == address
        worker = SimpleNamespace(app=SimpleNamespace(conf=SimpleNamespace(whisperq_settings=s)), hostname="w@h")
        assert worker_metrics.serve(worker) == 9201 and bound[-1] == address
    s = Settings.from_env({"WHISPERQ_METRICS_PORT": "9200", "WHISPERQ_METRICS_ADDRESS": "everywhere"})
    worker = SimpleNamespace(app=SimpleNamespace(conf=SimpleNamespace(whisperq_settings=s)), hostname="w@h")
    with caplog.at_level(logging.ERROR, logger="tasks.metrics"):
        assert worker_metrics.serve(worker) is None and bound[-1] == "::1"
    assert "WHISPERQ_METRICS_ADDRESS='everywhere' is not an IP address; set it to 127.0.0.1" in caplog.text


def test_worker_ports_follow_the_pool():
    from tasks.metrics import ports

    assert ports(9200, "prepare")[:3] == [9200, 9203, 9204]
    assert ports(9200, "inference")[0] == 9201
    assert ports(9200, "notify")[0] == 9202
    assert ports(9200, "inference,prepare")[0] == 9203
    assert max(ports(9200, "notify")) == 9299


# Queue depth against the broker, and a real prefork worker's metrics port.


def _broker_counts(celery_app) -> dict[tuple[str, str], int]:
    """What the broker says, asked the broker's own way."""
    from config.celeryconfig import is_redis, queues_for
    from config.priorities import REDIS_PRIORITY_STEPS
    from tasks.broker.redis import STEP_TIERS, redis_queue_keys

    out: dict[tuple[str, str], int] = {}
    queues = queues_for(celery_app.conf.whisperq_settings)  # the pools' and base's (conftest's registry)
    assert "whisperq.inference.base" in queues
    with celery_app.connection_for_write() as conn:
        if is_redis(celery_app.conf.broker_url):
            client = conn.default_channel.client
            for queue in queues:
                for step, key in zip(REDIS_PRIORITY_STEPS, redis_queue_keys(celery_app, queue), strict=True):
                    out[(queue, STEP_TIERS[step])] = out.get((queue, STEP_TIERS[step]), 0) + client.llen(key)
        else:
            for queue in queues:
                channel = conn.channel()
                try:
                    out[(queue, "all")] = channel.queue_declare(queue=queue, passive=True).message_count
                except Exception as exc:  # a model's queue nobody has declared yet: empty
                    assert "NOT_FOUND" in str(exc) or "404" in str(exc), exc
                    out[(queue, "all")] = 0
                finally:
                    with contextlib.suppress(Exception):
                        channel.close()
    return out


def _depths(samples) -> dict[tuple[str, str], int]:
    return {
        (dict(ls)["queue"], dict(ls)["priority"]): int(v)
        for (n, ls), v in samples.items()
        if n == "whisperq_queue_depth"
    }


@pytest.mark.integration
@pytest.mark.brokers
@pytest.mark.timeout(900)  # waits of 180 + 300 s (setup.cfg's default is 300)
def test_queue_depth_per_priority_is_the_brokers_own(client, app, worker, celery_app, tmp_path):
    from conftest import start_worker, stop_worker

    from config import INFERENCE_QUEUE, PREPARE_QUEUE
    from config.celeryconfig import is_redis
    from models.jobs.record import Job
    from models.jobs.workers import alive

    redis = is_redis(celery_app.conf.broker_url)
    collector, rt = app.extensions["whisperq_metrics"], app.extensions["whisperq"]
    queued = {"high": 2, "normal": 3, "low": 4}
    ids: list[str] = []

    def look():
        collector.invalidate()
        samples, broker = scrape(client), _broker_counts(celery_app)
        assert _depths(samples) == broker, "whisperq_queue_depth differs from the broker's own counts"
        return samples, broker

    with worker.paused(celery_app):
        samples0, broker0 = look()
        ids = [submit_id(client, priority=tier, language="en") for tier, n in queued.items() for _ in range(n)]
        samples1, broker1 = look()
        for tier, n in queued.items():
            if redis:
                assert broker1[(PREPARE_QUEUE, tier)] - broker0[(PREPARE_QUEUE, tier)] == n
            assert (
                value(samples1, "whisperq_jobs_waiting", priority=tier, stage="prepare")
                - value(samples0, "whisperq_jobs_waiting", priority=tier, stage="prepare")
            ) == n
        if not redis:
            assert broker1[(PREPARE_QUEUE, "all")] - broker0[(PREPARE_QUEUE, "all")] == sum(queued.values())
        assert value(samples1, "whisperq_queue_oldest_age_seconds", queue=PREPARE_QUEUE) > 0

        # A prefork preparation worker serving its metrics takes them to the inference queue.
        base = free_port()
        extra = start_worker(
            celery_app,
            tmp_path,
            f"prepare-metrics-{uuid.uuid4().hex[:6]}",
            PREPARE_QUEUE,
            extra_env={"WHISPERQ_METRICS_PORT": str(base)},
        )
        try:

            def stages() -> list:
                with rt.db.session() as session:
                    return [session.get(Job, job_id).stage for job_id in ids]

            wait_until(lambda: stages() == ["queued"] * len(ids), 180, "the extra worker did not prepare every job")
            samples2, broker2 = look()
            for tier, n in queued.items():
                if redis:
                    assert broker2[(INFERENCE_QUEUE, tier)] - broker1[(INFERENCE_QUEUE, tier)] == n
                assert (
                    value(samples2, "whisperq_jobs_waiting", priority=tier, stage="inference")
                    - value(samples1, "whisperq_jobs_waiting", priority=tier, stage="inference")
                ) == n
            if not redis:
                assert broker2[(INFERENCE_QUEUE, "all")] - broker1[(INFERENCE_QUEUE, "all")] == sum(queued.values())
            assert value(samples2, "whisperq_workers_alive", pool="prepare") == len(alive(rt, "prepare")) >= 2

            found = re.search(r"worker metrics on http://[^:]+:(\d+)/metrics", extra.output())
            assert found, extra.output()[-3000:]
            port = int(found.group(1))
            assert port == base or port >= base + 3
            served = fetch(port)  # the main process serves what its child observed
            for tier, n in queued.items():
                assert value(served, "whisperq_job_wait_seconds_count", priority=tier) == n
            assert value(served, "whisperq_job_prepare_seconds_count") == len(ids)
            assert 0 < value(served, "whisperq_job_prepare_seconds_sum") < 60 * len(ids)
            assert total(served, "whisperq_worker_info", pool="prepare", mode="prefork") == 1
            assert value(served, "process_resident_memory_bytes") > 10 * 1024**2
            assert total(served, "whisperq_pool_process_resident_memory_bytes") > 10 * 1024**2
        finally:
            stop_worker(extra)
    jobs = [wait_for_job(client, job_id, timeout=300) for job_id in ids]
    assert [j["status"] for j in jobs] == ["COMPLETED"] * len(ids)


# The deploy files.


def _known_names(app) -> set[str]:
    """Every sample name /metrics and a worker can serve."""
    from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

    from models.jobs import metrics

    metrics._get()
    registry = CollectorRegistry()
    registry.register(metrics.registry())
    ProcessCollector(registry=registry)
    text = app.test_client().get("/metrics").get_data(as_text=True) + generate_latest(registry).decode()
    names = {name for name, _ in parse(text)}
    # Served only where they exist: GPU memory on CUDA, children's memory in prefork.
    return names | {"whisperq_gpu_memory_bytes", "whisperq_pool_process_resident_memory_bytes", "whisperq_worker_info"}


def _metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:whisperq|process)_[a-z0-9_]+)\b", expr))


def _exprs() -> dict[str, str]:
    out = {}
    for group in yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            out[f"alert {rule['alert']}"] = rule["expr"]
    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            out[f"panel {panel['title']} {target['refId']}"] = target["expr"].replace("$worker_job", "whisperq-workers")
    keda = yaml.safe_load((DEPLOY / "k8s" / "keda-scaledobject.yaml").read_text())
    out["keda"] = keda["spec"]["triggers"][0]["metadata"]["query"]
    keda = yaml.safe_load((DEPLOY / "k8s" / "keda-prepare-scaledobject.yaml").read_text())
    out["keda prepare"] = keda["spec"]["triggers"][0]["metadata"]["query"]
    return out


def test_deploy_files_use_the_metrics_that_exist(app):
    from web.metrics import thresholds

    known = _known_names(app)
    for where, expr in _exprs().items():
        missing = _metric_names(expr) - known
        assert not missing, f"{where} uses metrics nobody serves: {missing}"
    rules = (DEPLOY / "prometheus-alerts.yml").read_text()
    used = set(re.findall(r'whisperq_alert_threshold\{name="([a-z_]+)"\}', rules))
    assert used == set(thresholds(app.extensions["whisperq"].settings)), used

    dashboard = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] == "whisperq"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in (
        "queue depth",
        "oldest",
        "throughput",
        "latency",
        "batch size",
        "real-time factor",
        "workers alive",
        "dead letters",
        "memory",
        "free",
    ):
        assert topic in titles, topic
    assert any("histogram_quantile" in t["expr"] for p in dashboard["panels"] for t in p["targets"])
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])

    keda = yaml.safe_load((DEPLOY / "k8s" / "keda-scaledobject.yaml").read_text())
    assert keda["apiVersion"] == "keda.sh/v1alpha1" and keda["kind"] == "ScaledObject"
    trigger = keda["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert 'whisperq_queue_depth{queue="whisperq.inference"}' in trigger["metadata"]["query"]


def test_alert_rules_and_queries_pass_promtool(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        need_service("promtool is not installed (Debian: apt-get install prometheus)")
    out = subprocess.run(
        [promtool, "check", "rules", str(DEPLOY / "prometheus-alerts.yml")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    # Every dashboard and KEDA query, checked as recording rules.
    exprs = {k: v for k, v in _exprs().items() if not k.startswith("alert ")}
    rules = {
        "groups": [
            {"name": "queries", "rules": [{"record": f"check:q{i}", "expr": e} for i, e in enumerate(exprs.values())]}
        ]
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    # And the alerts fire when, and only when, they should (series made up in the fixture).
    out = subprocess.run(
        [promtool, "test", "rules", "prometheus-alerts-test.yml"],
        cwd=ROOT / "tests" / "fixtures",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# The autoscaler.


def test_autoscale_decision():
    desired = load_script("autoscale").desired_workers

    assert desired({}, 0, 8, min_workers=0) == 0
    assert desired({}, 0, 8) == 1  # --min
    assert desired({"high": 8}, 0, 8) == 1
    assert desired({"high": 9}, 0, 8) == 2
    assert desired({"normal": 16}, 0, 8) == 1  # two waiting normal jobs per slot
    assert desired({"low": 32}, 0, 8) == 1  # four waiting low jobs per slot
    assert desired({"high": 8, "normal": 16, "low": 32}, 8, 8) == 4
    assert desired({"high": 1000}, 0, 8) == 10  # --max
    assert desired({"high": 1000}, 0, 8, max_workers=50) == 50
    # Shrinks one worker a step; grows at once.
    assert desired({}, 0, 8, current=6) == 5
    assert desired({"high": 40}, 0, 8, current=1) == 5
    with pytest.raises(ValueError):
        desired({}, 0, 0)


def test_autoscale_reads_metrics_on_either_broker():
    autoscale = load_script("autoscale")
    args = type("Args", (), {"slots": 0, "min": 1, "max": 10})()
    common = """
whisperq_jobs_running{stage="inference"} 4
whisperq_workers_alive{pool="inference"} 2
whisperq_worker_slots{pool="inference"} 16
whisperq_jobs_waiting{priority="high",stage="inference"} 10
whisperq_jobs_waiting{priority="normal",stage="inference"} 0
whisperq_jobs_waiting{priority="low",stage="inference"} 30
whisperq_queue_depth{priority="high",queue="whisperq.prepare"} 500
"""
    redis = autoscale.decide(
        common
        + """
whisperq_queue_depth{priority="high",queue="whisperq.inference"} 12
whisperq_queue_depth{priority="normal",queue="whisperq.inference"} 0
whisperq_queue_depth{priority="low",queue="whisperq.inference"} 28
""",
        args,
    )
    assert redis["depth"] == {"high": 12, "normal": 0, "low": 28}
    assert redis["slots"] == 8 and redis["running"] == 4
    assert redis["workers"] == 3  # 4 running + 12 high + 28/4 low = 23 slots
    rabbit = autoscale.decide(common + 'whisperq_queue_depth{priority="all",queue="whisperq.inference"} 40\n', args)
    assert rabbit["depth"] == {"high": 10, "normal": 0, "low": 30}  # split as the database has them
    assert rabbit["workers"] == 3  # 4 + 10 + 7.5 = 21.5 slots


# Who may read /metrics.


def test_without_a_token_metrics_answer_this_machine_only(app):
    from models.access.apikeys import create_key

    create_key(app.extensions["whisperq"], "metrics-visibility-test", "standard")
    client = app.test_client()
    assert not app.extensions["whisperq"].settings.metrics_token
    for local in ("127.0.0.1", "::1", "127.0.0.2", "::ffff:127.0.0.1"):
        resp = client.get("/metrics", environ_base={"REMOTE_ADDR": local})
        assert resp.status_code == 200 and "metrics-visibility-test" in resp.get_data(as_text=True)
    for remote, headers in (
        ("10.1.2.3", {}),
        ("192.0.2.7", {}),
        ("127.0.0.1", {"X-Forwarded-For": "203.0.113.9"}),
        ("127.0.0.1", {"Forwarded": "for=203.0.113.9"}),
    ):
        resp = client.get("/metrics", environ_base={"REMOTE_ADDR": remote}, headers=headers)
        assert resp.status_code == 403, (remote, headers)
        body = resp.get_data(as_text=True)
        assert "WHISPERQ_METRICS_TOKEN" in body and "metrics-visibility-test" not in body


def test_with_a_token_metrics_need_it_from_anywhere(settings, database):
    import dataclasses

    from web import create_app

    secured = create_app({"SETTINGS": dataclasses.replace(settings, metrics_token="scrape-secret-1"), "TESTING": True})
    client = secured.test_client()
    for remote in ("127.0.0.1", "10.1.2.3"):
        assert client.get("/metrics", environ_base={"REMOTE_ADDR": remote}).status_code == 401
        ok = client.get(
            "/metrics", environ_base={"REMOTE_ADDR": remote}, headers={"Authorization": "Bearer scrape-secret-1"}
        )
        assert ok.status_code == 200 and "whisperq_jobs" in ok.get_data(as_text=True)
        wrong = client.get("/metrics", environ_base={"REMOTE_ADDR": remote}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
