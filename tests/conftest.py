"""Fixtures: settings on a private data dir, the app, a real broker and a real worker.

With no CELERY_BROKER_URL the suite starts the embedded Redis, as `make run` does; point
CELERY_BROKER_URL at Redis or RabbitMQ (and DATABASE_URL at PostgreSQL) to run it there.
A test that needs a service it cannot reach is skipped, or fails when REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import need_service, task_ends, wait_until, worker_argv

ROOT = Path(__file__).resolve().parent.parent

# Fixtures that live beside their helpers: the MQTT bridge's (mosquitto, prefix, listener, bridge,
# restartable_mosquitto), the encryption tests' (keyring_restored, private_rt) and the S3
# server's (s3_server, s3_env, s3_bucket).
pytest_plugins = ["keyrings", "mqtt_harness", "s3_server"]

_state: dict = {}


def pytest_configure(config) -> None:
    # Every temporary file of the run (tmp_path, the workers' too: TMPDIR is inherited) goes in a
    # directory of its own, never a parent of the checkout: a second host (tests/hosts.py) hides
    # it whole, wherever the checkout is (a clone in /tmp included).
    own = tempfile.mkdtemp(prefix="wq-")  # short: Unix socket paths under it have 107 bytes in all
    os.environ["TMPDIR"] = tempfile.tempdir = own
    _state["own_tmp"] = own
    tmp = Path(tempfile.mkdtemp(prefix="whisperq-test-"))
    _state["tmp"] = tmp
    os.environ["WHISPERQ_DATA_DIR"] = str(tmp / "data")
    # Retries come quickly in tests; the defaults (2 s doubling, 3 attempts) stay otherwise.
    os.environ.setdefault("WHISPERQ_RETRY_BASE_SECONDS", "0.5")
    # A killed worker's job is taken over once its claim's lease lapses: 20 s here, not 60
    # (renewed every third of it while a run lasts, so no live run loses it).
    os.environ.setdefault("WHISPERQ_CLAIM_LEASE_SECONDS", "20")
    os.environ.setdefault("WHISPERQ_ADMIN_TOKEN", "test-admin-token")
    # Tests poll their jobs every 0.1 s; the poll limit (429 to a client polling faster than
    # Retry-After) is on in tests/test_polls.py, which turns it on itself.
    os.environ.setdefault("WHISPERQ_POLL_LIMIT", "false")
    # transcribe.delay(path) reads only under these: the temp dir, where the tests write their
    # files, and the fixture clips.
    os.environ.setdefault(
        "WHISPERQ_INPUT_DIRS",
        ",".join([os.path.realpath(tempfile.gettempdir()), str(Path(__file__).resolve().parent / "fixtures")]),
    )
    # Most tests use the API as a single-user install does, without keys; the tests of
    # keys and isolation turn anonymous use off for their own app.
    os.environ.setdefault("WHISPERQ_ALLOW_ANONYMOUS", "true")
    # Most tests ask for any priority anonymously; the anonymous cap (normal by default) has its own test.
    os.environ.setdefault("WHISPERQ_ANONYMOUS_MAX_PRIORITY", "high")
    # One key for every run: a PostgreSQL test database outlives the run's data dir, and
    # a key generated into that dir would leave the next run rows it cannot decrypt.
    os.environ.setdefault("WHISPERQ_ENCRYPTION_KEYS", "test:4BhyR0TH0wSvs+Lxxn+GUw1KjIYpsahZajx2f5AvVsw=")
    # Webhook receivers in the tests listen on loopback; their retries come quickly.
    os.environ.setdefault("WHISPERQ_WEBHOOK_ALLOW", "127.0.0.0/8")
    os.environ.setdefault("WHISPERQ_FETCH_ALLOW", "127.0.0.0/8")
    os.environ.setdefault("WHISPERQ_WEBHOOK_RETRY_BASE_SECONDS", "0.3")
    # Models as a deployment that offers a multilingual one besides the default: the suite's
    # inference pool serves tiny.en; tests start a worker for base where they need one. `next`
    # (tiny.en's weights until a test hot-swaps it) is the model the hot-swap test changes.
    os.environ.setdefault("WHISPERQ_MODELS", "tiny.en=bundled:tiny.en, base=bundled:base, next=bundled:tiny.en")
    if not os.environ.get("CELERY_BROKER_URL"):
        from config.embedded import EmbeddedRedis

        broker = EmbeddedRedis(tmp / "redis")
        os.environ["CELERY_BROKER_URL"] = broker.start()
        _state["embedded"] = broker


def pytest_unconfigure(config) -> None:
    broker = _state.pop("embedded", None)
    if broker is not None:
        broker.stop()
    shutil.rmtree(_state.pop("tmp", ""), ignore_errors=True)
    shutil.rmtree(_state.pop("own_tmp", ""), ignore_errors=True)


@pytest.fixture(scope="session")
def settings():
    from config import Settings

    return Settings.from_env()


@pytest.fixture(autouse=True)
def _process_celery_app_restored():
    """A test that builds an app of its own (create_app with other settings, a private broker)
    leaves the process's Celery app, which transcribe.delay() publishes through, as it found it."""
    from tasks import app as process

    before = process.current_celery()
    yield
    if before is not None and process.current_celery() is not before:
        process.use_celery(before)


@pytest.fixture(scope="session")
def celery_app(settings):
    from tasks.app import init_celery

    celery_app = init_celery(settings)  # the process's app, as a worker or transcribe.delay() caller has

    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=2, timeout=5)
    except Exception as exc:
        need_service(f"broker {settings.describe()['broker_url']} unreachable: {exc}")
    return celery_app


@pytest.fixture(scope="session")
def database(settings):
    from models.db import Database

    db = Database(settings.database_url)
    try:
        db.upgrade()
    except Exception as exc:
        need_service(f"database {settings.describe()['database_url']} unreachable: {exc}")
    return db


@pytest.fixture()
def private_db(settings, database, tmp_path):
    """A database URL of the test's own, empty: a SQLite file, or on PostgreSQL a schema of
    its own (dropped afterwards), for tests that count every row or purge everything old."""
    from sqlalchemy import create_engine, text

    url = settings.database_url
    if url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'private.db'}"
        return
    schema = f"private_{uuid.uuid4().hex[:12]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture()
def app(settings, database):
    from web import create_app

    return create_app({"SETTINGS": settings, "TESTING": True})


@pytest.fixture()
def app_rt(app):
    """The app's own runtime (that of the test's `app`, a module's own included)."""
    return app.extensions["whisperq"]


@pytest.fixture()
def client(app):
    return app.test_client()


@pytest.fixture()
def live_server(app):
    """The app over real HTTP, for browsers and HTTP clients: its base URL."""
    from helpers import LiveServer

    with LiveServer(app) as server:
        yield server.url


@pytest.fixture()
def own_inference(settings):
    """A runtime and a batcher of the test's own, in this process, with the engine its
    `settings` choose, loaded afresh (a runtime builds its own)."""
    from models.runtime import Runtime

    rt = Runtime(settings)
    rt.db.upgrade()
    batcher = rt.batcher
    yield rt, batcher
    batcher.close()


@pytest.fixture()
def runner(app):
    return app.test_cli_runner()


@pytest.fixture(scope="module")
def bundled_engine():
    """faster-whisper on the bundled model, on the CPU, in this process: one per module."""
    from models.speech.engines import FasterWhisperEngine, bundled_model_path

    return FasterWhisperEngine(bundled_model_path(), device="cpu")


@pytest.fixture()
def published():
    """Task messages this process publishes, as (headers, body) pairs."""
    from celery.signals import before_task_publish

    seen: list = []

    def record(sender=None, headers=None, body=None, **_kw):
        seen.append((headers, body))

    before_task_publish.connect(record, weak=False)
    yield seen
    before_task_publish.disconnect(record)


@dataclass
class BrokerStack:
    """What a broker-restart test drives: a client, the worker pools, the Celery app they
    share, and `restart(down, during)`, which stops their broker for `down` seconds (calls
    `during()` while it is down) and starts it again."""

    client: object
    worker: object
    celery_app: object
    restart: object


def _restart_embedded(broker):
    def restart(down: float = 2.0, during=None) -> None:
        broker.stop()
        time.sleep(down)  # the outage itself, as long as asked: not a wait for an event
        if during is not None:
            during()
        broker.start()

    return restart


@pytest.fixture()
def broker_stack(celery_app, settings, database, request):
    """A broker that may be restarted, with pools and a client on it: the suite's own when it
    is the embedded Redis (append-only file on) or a local RabbitMQ (durable queues). A Redis
    the suite did not start is not restarted (a run without persistence would lose its
    queues): the test gets a private redis-server of its own, with its own pools and web
    app, on the same database."""
    url = celery_app.conf.broker_url
    if _state.get("embedded") is not None or url.startswith(("amqp", "pyamqp")):
        if _state.get("embedded") is not None:
            restart = _restart_embedded(_state["embedded"])
        elif "@127.0.0.1" in url or "@localhost" in url:
            if shutil.which("rabbitmqctl") is None:
                need_service("rabbitmqctl is not on PATH: the RabbitMQ restart test needs the local broker's CLI")

            def restart(down: float = 2.0, during=None) -> None:
                subprocess.run(["rabbitmqctl", "-q", "stop_app"], check=True, timeout=120, capture_output=True)
                time.sleep(down)  # the outage itself, as long as asked: not a wait for an event
                if during is not None:
                    during()
                subprocess.run(["rabbitmqctl", "-q", "start_app"], check=True, timeout=120, capture_output=True)
                subprocess.run(["rabbitmqctl", "-q", "await_startup"], check=True, timeout=120, capture_output=True)
        else:
            pytest.skip(f"the suite restarts a local RabbitMQ only, not one at {url.split('@')[-1]}")
        pools = request.getfixturevalue("worker")
        from web import create_app

        yield BrokerStack(create_app({"SETTINGS": settings, "TESTING": True}).test_client(), pools, celery_app, restart)
        # The workers came through it (that is what the tests show), but their consumers
        # no longer obey cancel_consumer reliably, which later tests pause them with.
        pools.restart_all()
        return
    if not url.startswith(("redis", "rediss")):
        pytest.skip(f"no way to restart a {url.split('://')[0]} broker here")
    from config.embedded import EmbeddedRedis
    from tasks.app import celery_for
    from web import create_app

    tmp = Path(tempfile.mkdtemp(prefix="private-broker-", dir=_state["tmp"]))
    broker = EmbeddedRedis(tmp / "redis")
    private = dataclasses.replace(
        settings,
        broker_url=broker.start(),
        result_backend=None if settings.result_backend == url else settings.result_backend,
    )
    # Celery reads CELERY_BROKER_URL before its configuration: this process's apps and the
    # pools started now must all see the private broker.
    request.getfixturevalue("monkeypatch").setenv("CELERY_BROKER_URL", private.broker_url)
    app, private_celery = create_app({"SETTINGS": private, "TESTING": True}), celery_for(private)
    pools = None
    try:
        pools = Pools(private_celery, tmp, uuid.uuid4().hex[:6], env={"CELERY_BROKER_URL": private.broker_url})
        yield BrokerStack(app.test_client(), pools, private_celery, _restart_embedded(broker))
    finally:
        if pools is not None:
            pools.stop()
        broker.stop()


@contextmanager
def control_connection(celery_app):
    """A new broker connection for control commands: pooled ones may have died with a
    broker restart, and control commands do not retry."""
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=5, interval_start=0.5, interval_step=0.5)
        yield conn


class Worker:
    def __init__(self, proc: subprocess.Popen, name: str, log: Path):
        self.proc, self.name, self.log = proc, name, log
        self.node = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start_worker(
    celery_app,
    tmp: Path,
    name: str,
    queue: str,
    pool: str = "prefork",
    concurrency: int = 1,
    extra_env: dict | None = None,
    popen=subprocess.Popen,
) -> Worker:
    """A worker process, answering pings. `popen` starts it elsewhere (tests/hosts.py: on a second host)."""
    log = tmp / f"{name}.log"
    env = dict(os.environ, **(extra_env or {}))
    proc = popen(
        [*worker_argv(name, queue, pool, concurrency), "-E"],  # -E: task events, as the Procfile's pools send
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    worker = Worker(proc, name, log)
    if celery_app.conf.broker_url.startswith("sqs://"):  # no remote control to ping: its log says
        line = re.compile(rf"\b({re.escape(name)}@\S+) ready\.")
        try:
            ready = wait_until(
                lambda: proc.poll() is not None or line.search(worker.output()), 90, f"worker {name} ready"
            )
        except AssertionError:
            proc.kill()
            raise
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}:\n{worker.output()}")
        worker.node = ready.group(1)
        return worker
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}:\n{worker.output()}")
        with control_connection(celery_app) as conn:
            replies = celery_app.control.ping(timeout=1.0, connection=conn)
        nodes = [key for reply in replies for key in reply if key.startswith(f"{name}@")]
        if nodes:
            worker.node = nodes[0]
            return worker
    proc.kill()
    raise RuntimeError(f"worker did not answer a ping within 90 s:\n{worker.output()}")


def stop_worker(worker: Worker) -> None:
    worker.proc.terminate()
    try:
        worker.proc.wait(30)
    except subprocess.TimeoutExpired:
        worker.proc.kill()
        worker.proc.wait()


class Pools:
    """The preparation and inference workers, as the Procfile runs them."""

    def __init__(self, celery_app, tmp: Path, tag: str, env: dict | None = None, popen=subprocess.Popen):
        from config import NOTIFY_QUEUE, PREPARE_QUEUE

        self.celery_app, self.tmp, self.tag, self.restarts, self.env = celery_app, tmp, tag, 0, env
        self.popen = popen
        self.prepare = start_worker(celery_app, tmp, f"prepare-{tag}", PREPARE_QUEUE, extra_env=env, popen=popen)
        try:
            self.inference = self._start_inference()
            self.notify = start_worker(
                celery_app,
                tmp,
                f"notify-{tag}",
                NOTIFY_QUEUE,
                pool="threads",
                concurrency=4,
                extra_env=env,
                popen=popen,
            )
        except BaseException:
            stop_worker(self.prepare)
            if hasattr(self, "inference"):
                stop_worker(self.inference)
            raise

    def _start_inference(self) -> Worker:
        from config import INFERENCE_QUEUE

        name = f"inference-{self.tag}" + (f"-{self.restarts}" if self.restarts else "")
        return start_worker(
            self.celery_app,
            self.tmp,
            name,
            INFERENCE_QUEUE,
            pool="threads",
            concurrency=8,
            extra_env=self.env,
            popen=self.popen,
        )

    def kill_inference(self) -> None:
        """kill -9 the inference worker: no warm shutdown, no acks, no goodbyes."""
        self.inference.proc.kill()
        self.inference.proc.wait()

    def restart_inference(self) -> None:
        self.restarts += 1
        self.inference = self._start_inference()

    def stop(self) -> None:
        stop_worker(self.notify)
        stop_worker(self.inference)
        stop_worker(self.prepare)

    def restart_all(self) -> None:
        self.stop()
        self.tag += "r"
        self.restarts = 0
        self.__init__(self.celery_app, self.tmp, self.tag, self.env, self.popen)

    def sweep(self, grace_seconds: float = 0.0):
        """One sweeper pass now, as beat would run it, without the start-up grace."""
        from datetime import timedelta

        from tasks.broker import run_sweep

        return run_sweep(self.celery_app, grace=timedelta(seconds=grace_seconds))

    def output(self) -> str:
        return self.prepare.output() + self.inference.output()

    def inference_output(self) -> str:
        """Every inference worker's log of these pools, restarts included."""
        return "".join(p.read_text(errors="replace") for p in sorted(self.tmp.glob(f"inference-{self.tag}*.log")))

    def consuming(self, celery_app, node: str) -> set[str]:
        """The queues a worker consumes from now (`celery inspect active_queues`)."""
        with control_connection(celery_app) as conn:
            reply = celery_app.control.inspect(destination=[node], timeout=5, connection=conn).active_queues() or {}
        return {q["name"] for q in reply.get(node, [])}

    @contextmanager
    def paused(self, celery_app, pools=("prepare", "inference")):
        """Stop pools consuming, so a backlog can be queued, then let them go.

        cancel_consumer answers before the worker has cancelled (it schedules the cancel on
        its event loop), so this waits until each worker no longer lists the queue: from then
        on a message for it stays in the broker. (On Redis a BRPOP already under way may still
        bring one back; with no consumer left for it, kombu puts it straight back in its queue,
        behind the ones waiting there.)"""
        from config import INFERENCE_QUEUE, PREPARE_QUEUE

        pairs = [
            (q, w.node)
            for pool, q, w in (("prepare", PREPARE_QUEUE, self.prepare), ("inference", INFERENCE_QUEUE, self.inference))
            if pool in pools
        ]
        with control_connection(celery_app) as conn:
            for queue, node in pairs:
                celery_app.control.cancel_consumer(queue, destination=[node], reply=True, timeout=5, connection=conn)
        for queue, node in pairs:
            wait_until(
                lambda queue=queue, node=node: queue not in self.consuming(celery_app, node),
                30,
                f"{node} still consumes from {queue}",
            )
        try:
            yield
        finally:
            with control_connection(celery_app) as conn:
                for queue, node in pairs:
                    celery_app.control.add_consumer(queue, destination=[node], reply=True, timeout=5, connection=conn)

    def prepared(self, celery_app) -> int:
        """How many transcribe tasks the prepare worker has run."""
        with control_connection(celery_app) as conn:
            stats = (
                celery_app.control.inspect(destination=[self.prepare.node], timeout=5, connection=conn).stats() or {}
            )
        return stats.get(self.prepare.node, {}).get("total", {}).get("whisperq.transcribe", 0)

    def batcher_stats(self, celery_app) -> dict:
        """The inference worker's batcher figures (`celery inspect batcher_stats`)."""
        with control_connection(celery_app) as conn:
            reply = (
                celery_app.control.inspect(destination=[self.inference.node], timeout=5, connection=conn)._request(
                    "batcher_stats"
                )
                or {}
            )
        return reply.get(self.inference.node, {})

    def batch_sizes(self, job_ids) -> list[int]:
        """The sizes of the batches that ran these jobs' windows and no other job's, from the
        inference workers' logs (a batch is logged, with its jobs, before its results go out)."""
        ours, sizes = set(job_ids), []
        for size, jobs in re.findall(r"batch: (\d+) windows from \d+ jobs \(([^)]*)\)", self.inference_output()):
            named = set(jobs.split(", ")) - {""}
            if named and named <= ours:
                sizes.append(int(size))
        return sizes

    def held(self, celery_app) -> set[str]:
        """The tasks (job ids) the preparation and inference pools run or hold reserved now
        (`celery inspect active` and `reserved`)."""
        nodes, found = [self.prepare.node, self.inference.node], set()
        with control_connection(celery_app) as conn:
            inspect = celery_app.control.inspect(destination=nodes, timeout=5, connection=conn)
            for reply in (inspect.active() or {}, inspect.reserved() or {}):
                found |= {task["id"] for tasks in reply.values() for task in tasks}
        return found

    def handled(self, job_id: str, deliveries: int, timeout: float = 120.0) -> None:
        """Until the pools have finished `deliveries` transcribe messages for this job, every
        inference message those sent has been taken, and the live workers have ended every
        task of the job they took, as Celery logs each task's start and end: the proof that
        a duplicate had its chance, for checks that it changed nothing."""

        def done() -> bool:
            prepare, live, every = self.prepare.output(), self.inference.output(), self.inference_output()
            taken = every.count(f"Task whisperq.infer[{job_id}] received")
            return (
                task_ends(prepare, "whisperq.transcribe", job_id) >= deliveries
                and taken >= prepare.count(f"job {job_id} prepared:")
                and task_ends(prepare, "whisperq.transcribe", job_id)
                == prepare.count(f"Task whisperq.transcribe[{job_id}] received")
                and task_ends(live, "whisperq.infer", job_id) == live.count(f"Task whisperq.infer[{job_id}] received")
            )

        wait_until(done, timeout, f"the pools did not handle {deliveries} deliveries of job {job_id}")


@pytest.fixture(scope="session")
def worker(celery_app, database):
    """Real worker processes for the whole session: a prefork preparation worker and a
    threads-pool inference worker with its batcher, as in the Procfile."""
    celery_app.control.purge()
    pools = Pools(celery_app, _state["tmp"], uuid.uuid4().hex[:6])
    yield pools
    pools.stop()
