"""Workers on a second host: a network namespace of its own (tests/hosts.py) with its own
empty data dir and no view of host 1's files, reaching host 1's broker and PostgreSQL over a
veth. Audio and samples live in PostgreSQL large objects (WHISPERQ_STORAGE=postgres).

The deployment here is the module's own: a broker of its own (a RabbitMQ vhost when the suite
runs on RabbitMQ, else a private Redis) so that the suite's pools never see its jobs, on the
database of its own on the suite's PostgreSQL server (the local one beside a SQLite run).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
from api import submit_id, upload
from conftest import Pools, _state, stop_worker
from helpers import CLIPS, long_recording, need_service, write_wav
from hosts import second_host
from sqlalchemy import select

pytestmark = [
    pytest.mark.integration,
    pytest.mark.hosts,
    pytest.mark.timeout(1200),
]  # a second host's set-up, then waits of up to 360 s

TEST_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/whisperq_test"
VHOST = "whisperq-hosts"
DATABASE = "whisperq_hosts"


@dataclass
class Cluster:
    settings: object  # host 1's (and so the deployment's) settings
    rt: object
    celery: object
    client: object
    env: dict  # what a host-1 worker process is started with
    host2: object  # tests/hosts.SecondHost
    tmp: object

    def pools_on_host2(self, tag: str) -> Pools:
        host = self.host2

        def popen(argv, env=None, **kwargs):
            return host.popen(argv, env=host.env(base=env), **kwargs)

        return Pools(self.celery, self.tmp, tag, env=self.env, popen=popen)

    def pools_on_host1(self, tag: str) -> Pools:
        return Pools(self.celery, self.tmp, tag, env=self.env)

    def submit(self, n: int, clip: str = "fox.flac") -> list[str]:
        audio = CLIPS[clip]["path"].read_bytes()

        def one(i: int) -> str:
            return submit_id(
                self.client.application.test_client(),
                f"burst-{i}{CLIPS[clip]['path'].suffix}",
                data=audio,
                language="en",
            )

        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(one, range(n)))

    def jobs(self, ids: list[str]) -> list:
        from models.jobs.record import Job

        with self.rt.db.session() as session:
            rows = list(session.scalars(select(Job).where(Job.id.in_(ids))))
            for row in rows:
                session.expunge(row)
        order = {job_id: n for n, job_id in enumerate(ids)}
        return sorted(rows, key=lambda row: order[row.id])

    def wait(self, ids: list[str], timeout: float = 240, sweep: bool = False, during=None) -> list:
        from tasks.broker import run_sweep

        deadline = time.monotonic() + timeout
        swept = 0.0
        while True:
            jobs = self.jobs(ids)
            if all(j.state.finished for j in jobs) or time.monotonic() > deadline:
                return jobs
            if during is not None:
                during(jobs)
            if sweep and time.monotonic() - swept >= 2:  # beat's pass, without the start-up grace
                run_sweep(self.celery, grace=__import__("datetime").timedelta(0), rt=self.rt)
                swept = time.monotonic()
            # A poll pacing the look, not ordering events; `during` looks often: a job runs on a
            # host for a second or two, and a look every 2 s could miss every one of them.
            time.sleep(0.2 if during is not None else 2)


def ledger_problems(cluster, ids, hosts=()) -> dict[str, str]:
    """What the engine ledger (models.jobs.ledger) finds wrong with these jobs: other than one
    stored pass each, only passes left unended on a host whose every process was killed."""
    from models.jobs.ledger import Explained, passes, problems

    return problems(passes(cluster.rt.db, ids), Explained(hosts=frozenset(hosts)))


def host_of(job) -> str:
    return (job.worker or "").rsplit("@", 1)[-1]


def _vhost(url: str) -> str:
    """A vhost of the module's own on the suite's (local) RabbitMQ, empty."""
    if shutil.which("rabbitmqctl") is None:
        need_service("rabbitmqctl is not on PATH: the two-host test makes a RabbitMQ vhost of its own")
    ctl = ["rabbitmqctl", "-q"]
    subprocess.run([*ctl, "delete_vhost", VHOST], capture_output=True, timeout=60)
    subprocess.run([*ctl, "add_vhost", VHOST], check=True, capture_output=True, timeout=60)
    subprocess.run(
        [*ctl, "set_permissions", "-p", VHOST, "guest", ".*", ".*", ".*"], check=True, capture_output=True, timeout=60
    )
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/{VHOST}"


@pytest.fixture(scope="module")
def cluster(settings):
    from sqlalchemy import create_engine, text

    from config.embedded import EmbeddedRedis
    from models.runtime import Runtime
    from tasks.app import celery_for
    from web import create_app

    suite_broker = settings.broker_url
    if not suite_broker.startswith(("amqp", "pyamqp")) and not suite_broker.startswith("redis"):
        pytest.skip(f"the two-host tests run on Redis or RabbitMQ, not {suite_broker.split('://')[0]}")
    server = settings.database_url if settings.database_url.startswith("postgres") else TEST_POSTGRES
    pg = server.rsplit("/", 1)[0] + "/" + DATABASE  # a database of its own: the suite's sweeper never sees its jobs
    try:
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
            conn.execute(text(f"CREATE DATABASE {DATABASE}"))
        engine.dispose()
    except Exception as exc:
        need_service(
            f"the two-host tests need PostgreSQL ({server.rsplit('@', 1)[-1]}) and a database of their own there: {exc}"
        )

    tmp = _state["tmp"] / f"hosts-{uuid.uuid4().hex[:6]}"
    (tmp / "host1").mkdir(parents=True)
    redis = None
    if suite_broker.startswith(("amqp", "pyamqp")):
        broker = _vhost(suite_broker)
    else:
        redis = EmbeddedRedis(tmp / "redis")
        broker = redis.start()
    host1 = dataclasses.replace(
        settings, data_dir=tmp / "host1", broker_url=broker, database_url=pg, storage="postgres", result_backend=None
    )
    env = {
        "CELERY_BROKER_URL": broker,
        "DATABASE_URL": pg,
        "WHISPERQ_STORAGE": "postgres",
        "WHISPERQ_DATA_DIR": str(host1.data_dir),
        "CELERY_RESULT_BACKEND": "",
    }
    rt = Runtime(host1)
    rt.db.upgrade()
    celery = celery_for(host1)
    mp = pytest.MonkeyPatch()
    for name, value in env.items():  # what this process publishes with, as a host-1 process would
        mp.setenv(name, value)
    try:
        # Host 2 sees none of host 1's files: the suite's temporary tree (host 1's data dir,
        # the uploads' spools) lies under an empty tmpfs there.
        with second_host(hide=[_state["tmp"]]) as host2:
            app = create_app({"SETTINGS": host1, "TESTING": True})
            yield Cluster(host1, rt, celery, app.test_client(), env, host2, tmp)
    finally:
        mp.undo()
        rt.db.dispose()
        engine = create_engine(server, isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
        engine.dispose()
        if redis is not None:
            redis.stop()
        elif suite_broker.startswith(("amqp", "pyamqp")):
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", VHOST], capture_output=True, timeout=60)


def test_host_2_cannot_see_host_1s_files_and_reaches_its_services_over_the_veth(cluster):
    probe = cluster.tmp / "host1" / "visible-only-on-host-1"
    probe.write_text("host 1")
    seen = cluster.host2.run(["ls", str(probe)])
    assert seen.returncode != 0, seen.stdout
    env = cluster.host2.env(base=dict(cluster.env))
    assert (
        cluster.host2.host1_address in env["CELERY_BROKER_URL"] and cluster.host2.host1_address in env["DATABASE_URL"]
    )
    assert env["WHISPERQ_DATA_DIR"] != cluster.env["WHISPERQ_DATA_DIR"]


def test_jobs_sent_to_host_1_are_transcribed_on_host_2(cluster):
    from models.storage import prepared_ref

    pools = cluster.pools_on_host2("h2")  # host 1 runs the web only
    try:
        ids = cluster.submit(3) + cluster.submit(1, "report.opus")
        jobs = cluster.wait(ids)
        assert [j.status for j in jobs] == ["COMPLETED"] * 4, [(j.status, j.error) for j in jobs]
        assert {host_of(j) for j in jobs} == {cluster.host2.hostname}
        for job in jobs:
            expected = "fox" if job.filename.endswith(".flac") else "report"
            assert expected in job.result_text.lower(), job.result_text
            # The audio is in the database, sealed; the samples went with the job's inference.
            assert cluster.rt.storage.exists(job.audio_ref) and not cluster.rt.storage.exists(prepared_ref(job.id))
            assert cluster.rt.storage.raw(job.audio_ref).startswith(b"WQENC2")
        log = pools.prepare.output()
        assert all(f"job {i} prepared" in log for i in ids), log[-2000:]
        assert not any((cluster.settings.data_dir / "audio").rglob("*"))  # nothing on host 1's disk
        # Operators see the second host in /readyz and the metrics, with its own disk and memory.
        hosts = _wait_for_host(cluster, cluster.host2.hostname)
        assert {"prepare", "inference", "notify"} <= set(hosts[cluster.host2.hostname]["workers"])
        assert hosts[cluster.host2.hostname]["disk_free_bytes"] > 0
        metrics = cluster.client.get("/metrics").get_data(as_text=True)
        assert f'whisperq_host_workers{{host="{cluster.host2.hostname}",pool="inference"}}' in metrics
        # Estimates and cancellation across hosts: a job waits behind host 2's workers, and a
        # cancel sent to host 1 stops it where host 2 runs it.
        samples, _text = long_recording(repeats=6)
        wav = write_wav(cluster.tmp / "long.wav", samples).read_bytes()
        resp = upload(cluster.client, "long.wav", data=wav, language="en")
        assert resp.status_code == 202, resp.get_json()
        long_id = resp.get_json()["job_id"]
        status = cluster.client.get(f"/v1/jobs/{long_id}").get_json()
        assert status["estimated_finish_at"] is not None, status
        deadline = time.monotonic() + 60
        while cluster.jobs([long_id])[0].status == "PENDING" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert cluster.client.post(f"/v1/jobs/{long_id}/cancel").status_code in (200, 202)
        (cancelled,) = cluster.wait([long_id], timeout=120)
        assert cancelled.status == "CANCELLED" and host_of(cancelled) == cluster.host2.hostname, cancelled.status
        # Deleted on host 1, gone for every host.
        assert cluster.client.delete(f"/v1/jobs/{ids[0]}").status_code in (200, 204)
        assert not cluster.rt.storage.exists(jobs[0].audio_ref)
    finally:
        pools.stop()


def _wait_for_host(cluster, hostname: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        hosts = cluster.client.get("/readyz").get_json().get("hosts", {})
        if (hostname in hosts and len(hosts[hostname]["workers"]) >= 3) or time.monotonic() > deadline:
            return hosts
        time.sleep(1)


def test_with_both_hosts_running_jobs_spread_over_both_and_a_host_killed_mid_burst_loses_nothing(cluster):
    one = cluster.pools_on_host1("h1")
    two = None
    try:
        two = cluster.pools_on_host2("h2b")
        ids = cluster.submit(16)
        jobs = cluster.wait(ids)
        assert [j.status for j in jobs] == ["COMPLETED"] * 16, [(j.status, j.error) for j in jobs]
        assert [j.engine_runs for j in jobs] == [1] * 16
        assert ledger_problems(cluster, ids) == {}
        hosts = {host_of(j) for j in jobs}
        assert hosts == {cluster.host2.hostname, __import__("socket").gethostname()}, [j.worker for j in jobs]

        # Host 2 dies (kill -9, every worker) while it holds jobs: host 1 finishes them all.
        ids = cluster.submit(24)
        held, killed = [], []

        def kill_when_busy(jobs) -> None:
            busy = [j.id for j in jobs if j.status == "PROCESSING" and host_of(j) == cluster.host2.hostname]
            if not held and busy and sum(j.status == "COMPLETED" for j in jobs) >= 2:
                for worker in (two.prepare, two.inference, two.notify):
                    worker.proc.kill()
                    worker.proc.wait()
                held.extend(busy)
                # A job host 2 finished as it died (between that look and the kill, or a commit
                # already on the wire) is its own, done once: the others are host 1's to finish.
                time.sleep(1)
                killed.extend(j.id for j in cluster.jobs(held) if not j.state.finished)

        jobs = cluster.wait(ids, timeout=360, sweep=True, during=kill_when_busy)
        assert killed, f"host 2 held no unfinished job when it was killed (it held {held})"
        assert [j.status for j in jobs] == ["COMPLETED"] * 24, [(j.status, j.error) for j in jobs]
        assert all("fox" in j.result_text.lower() for j in jobs)
        assert {host_of(j) for j in jobs if j.id in killed} == {__import__("socket").gethostname()}
        # The engine went through each job once, as the row counts it under the job's claim
        # (models.jobs.claims), whichever host finished it: host 2's killed runs never finished,
        # and host 1 took their jobs over only once their claims' leases had lapsed.
        assert {j.id: j.engine_runs for j in jobs} == {i: 1 for i in ids}
        # and the engine ledger: one stored pass per job; any other one is host 2's, which never ended
        assert ledger_problems(cluster, ids, hosts={cluster.host2.hostname}) == {}
    finally:
        one.stop()
        if two is not None:
            for worker in (two.prepare, two.inference, two.notify):
                if worker.proc.poll() is None:
                    stop_worker(worker)
