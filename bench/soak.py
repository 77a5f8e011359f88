"""Soak: the whole stack as `make run` starts it, under a steady stream of work with bursts on
top, while its processes are killed on a schedule; does every job come out right, once?

The stack runs on the embedded broker and SQLite by default; with CELERY_BROKER_URL (Redis or
RabbitMQ) and DATABASE_URL (PostgreSQL) set it runs on those. The stream comes at --rate jobs a
minute (default: two thirds of the capacity measured first, on this machine, with bursts of the
9.4 s clip the tests use, tests/fixtures/report.opus), Poisson arrivals, and a burst of
--burst-size jobs every --burst-every seconds. Each arrival is one of: an upload, an audio_url
(served by a file server in this process), a batch of audio_urls, a `transcribe.delay()` call,
an upload asking for an analysis (`redact=pii`, run by the analysis pool after the transcript),
or bad input (garbage bytes, a format not taken, a URL to garbage), at every priority. A share
of the uploads and audio_urls (--webhook-share) give a callback_url to a webhook receiver in
this process. Every HTTP submission carries an Idempotency-Key. Bad input must be refused at
the door or end FAILED, never be lost; an analysis must end DONE.

On a schedule (--chaos-every seconds) it SIGKILLs, in turn: the prepare, inference, analysis
and notify pools, a web worker, the broker, the gunicorn master (web), beat, flower, the gRPC
door and, on PostgreSQL, PostgreSQL. supervisord starts the programs again (the embedded
broker too); an external Redis or RabbitMQ on this machine, and PostgreSQL, are started again
here (or with --broker-restart CMD, a command that restarts the broker, instead of the kill).
supervisord itself is not killed: nothing would start it again (docs/soak.md).

After the stream it waits (up to --drain seconds in all) for every accepted job to finish,
looks up whether a submission that was refused for now (429/503), cut off or answered 5xx
made a job after all (its Idempotency-Key; a delay() call's task id) and waits for those too,
then for each completed job's webhook; then it reads each job's row (the database is the
truth), its engine passes (the engine ledger, models/jobs/ledger.py) and transcript, and
reports: accepted, accepted after a refusal, completed, failed as expected, failed
unexpectedly, refused for now, lost (accepted, never finished), engine problems (not exactly
one stored pass, or another pass that no kill explains), webhooks missing, wrong words (word
error rate above 0.2 against the known text, as the tests hold), latency p50/p99 per priority
(from the submission to the stored transcript), /healthz outages (polled every 0.5 s: count,
total, longest) and each process's PSS over time, by program. JSON and a PNG plot go to --out
(var/soak/). It exits 1 if anything was lost, wrong, failed unexpectedly, ran the engine
wrongly or missed its webhook; and, on a run of at least --judge-minutes, if the stack's PSS
grew more than --max-growth after warm-up or /healthz was down longer than --max-outage at once.

    make soak SOAK_MINUTES=3        # the CI-size run (make bench-ci)
    make soak SOAK_MINUTES=60       # the full one
    python bench/soak.py --minutes 10 --rate 12 --out /tmp/soak
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
from kombu.exceptions import OperationalError
from sqlalchemy.exc import InterfaceError as DatabaseInterfaceError
from sqlalchemy.exc import OperationalError as DatabaseOperationalError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import CLIPS, word_error_rate  # noqa: E402
from service import free_port, stop  # noqa: E402
from soak_report import markdown  # noqa: E402
from soak_watch import Chaos, Health, Memory, memory_summary, plot  # noqa: E402

CAPACITY_CLIP = "report.opus"
GOOD_CLIPS = ("report.opus", "fox.flac")
PRIORITIES = {"high": 0.2, "normal": 0.5, "low": 0.3}
KINDS = {
    "upload": 0.35,
    "analysed": 0.05,
    "url": 0.15,
    "batch": 0.08,
    "delay": 0.15,
    "garbage": 0.08,
    "unsupported": 0.07,
    "bad_url": 0.07,
}
BAD = {"garbage", "unsupported", "bad_url"}
HOOKED = {"upload", "url"}  # the kinds a share of which ask for a webhook (--webhook-share)
WRONG = 0.2  # word error rate above which a transcript counts as wrong (the tests' bar)
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED")
RETRYABLE = (429, 503)
CUT_OFF, BROKER_DOWN, DELAY_REFUSED = 0, -1, -2  # the codes of submissions that got no HTTP answer
# (BROKER_DOWN: delay() raised for its broker or database being away; come back later)
FAILING = ("lost", "engine_problems", "webhooks_missing", "wrong_words", "failed_unexpectedly")
PDF = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj << /Type /Catalog >> endobj\n" + b"0" * 4000


def pct(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 2) if ordered else None


def pick(weights: dict[str, float], rng: random.Random) -> str:
    return rng.choices(list(weights), list(weights.values()))[0]


def serve(handler: type[BaseHTTPRequestHandler]) -> tuple[ThreadingHTTPServer, int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


class Files:
    """The audio_url origin: the clips, and garbage behind an audio-looking name."""

    def __init__(self, rng: random.Random):
        routes = {f"/{name}": CLIPS[name]["path"].read_bytes() for name in GOOD_CLIPS}
        routes["/noise.wav"] = rng.randbytes(64 * 1024)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # http.server's name
                body = routes.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

            def log_message(self, *_args):
                pass

        self.server, self.port = serve(Handler)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"


class Hooks:
    """The webhook receiver: every POST's job id (data.job_id of the Standard Webhooks body),
    how many times each came. Signatures are not checked: tests/ hold those."""

    def __init__(self):
        self.received: dict[str, int] = {}
        self.posts = 0
        lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    data = json.loads(body)["data"]
                    job_id = data.get("job_id") or data.get("batch_id")
                except (ValueError, KeyError, TypeError, AttributeError):
                    job_id = None
                with lock:
                    hooks.posts += 1
                    if job_id:
                        hooks.received[job_id] = hooks.received.get(job_id, 0) + 1
                self.send_response(204 if job_id else 400)
                self.end_headers()

            def log_message(self, *_args):
                pass

        self.server, self.port = serve(Handler)
        self.url = f"http://127.0.0.1:{self.port}/hook"


class Stack:
    """`whisperq run` in a fresh data dir (on the broker and database of the environment, if set)."""

    def __init__(self, out: Path, files: Files, hooks: Hooks):
        self.data = out / "data"  # this run's data dir (its logs, database, broker files): kept for a look after
        shutil.rmtree(self.data, ignore_errors=True)
        self.data.mkdir(mode=0o700)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k not in ("FLOWER_BASIC_AUTH", "WHISPERQ_INPUT_DIRS")}
        self.env.update(
            WHISPERQ_DATA_DIR=str(self.data),
            PORT=str(self.port),
            FLOWER_PORT=str(free_port()),
            WHISPERQ_GRPC_PORT=str(free_port()),
            WHISPERQ_FETCH_ALLOW=f"127.0.0.1:{files.port}",
            WHISPERQ_WEBHOOK_ALLOW=f"127.0.0.1:{hooks.port}",
        )
        self.embedded = not self.env.get("CELERY_BROKER_URL")
        self.log = self.data / "run.log"
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "whisperq"), "run"],
            env=self.env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 180
        while not self.healthy("/readyz"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                stop(self.proc)
                raise SystemExit(f"the stack did not get ready; see {self.log}")
            time.sleep(0.5)
        # A premium key: every priority is open to it (anonymous callers get normal at most).
        made = subprocess.run(
            [str(Path(sys.executable).parent / "whisperq"), "keys", "create", "--name", "soak", "--tier", "premium"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if made.returncode:
            stop(self.proc)
            raise SystemExit(f"could not make the soak's key: {made.stderr}")
        self.key = made.stdout.split()[0]
        self.session = requests.Session()
        self.session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=32))  # the submitting threads
        self.session.headers["Authorization"] = f"Bearer {self.key}"
        from config import Settings

        self.settings = Settings.from_env({**self.env, "CELERY_BROKER_URL": self.broker_url})
        from models.db import Database

        # Its connections are checked before use: PostgreSQL is killed under them.
        self.db = Database(self.settings.database_url)
        self.owner: str | None = None

    @property
    def broker_url(self) -> str:
        return self.env.get("CELERY_BROKER_URL") or (self.data / "broker.url").read_text().strip()

    def healthy(self, path: str = "/healthz") -> bool:
        try:
            return requests.get(self.base + path, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def pid(self, name: str) -> int:
        """The pid of a supervisord program (its name in the generated supervisord.conf), or 0."""
        out = subprocess.run(
            [
                str(Path(sys.executable).parent / "supervisorctl"),
                "-c",
                str(self.data / "supervisord.conf"),
                "pid",
                name,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        return int(out) if out.isdigit() else 0

    def rows(self, ids: list[str]) -> dict[str, dict]:
        from sqlalchemy import select

        from models.jobs.record import Job  # its column types read the times back as aware datetimes

        columns = (Job.id, Job.status, Job.priority, Job.attempts, Job.finished_at, Job.error)
        found = {}
        with self.db.session() as session:
            for start in range(0, len(ids), 500):
                for row in session.execute(select(*columns).where(Job.id.in_(ids[start : start + 500]))).mappings():
                    found[row["id"]] = dict(row)
        return found

    def made_under(self, namespace: str, key: str) -> str | None:
        """The id of what a submission under this Idempotency-Key made (a job; for a batch,
        the batch), from the idempotency table, or None."""
        from models.access.apikeys import Principal, digest
        from models.jobs.idempotency import IdempotencyKey
        from models.pipeline.door import scoped_key

        if self.owner is None:  # the soak key's id: the owner its keys are scoped to
            from sqlalchemy import select

            from models.access.apikeys import ApiKey

            with self.db.session() as session:
                self.owner = session.scalars(select(ApiKey.id).where(ApiKey.digest == digest(self.key))).one()
        scoped = scoped_key(Principal(owner=self.owner, tier="premium"), namespace, key)
        with self.db.session() as session:
            row = session.get(IdempotencyKey, scoped)
            return row.job_id if row is not None else None

    def batch_jobs(self, batch_id: str) -> list[tuple[str, str | None]]:
        """(job id, audio_url) of each job of a batch."""
        resp = self.session.get(f"{self.base}/v1/batches/{batch_id}", params={"limit": 100}, timeout=30)
        resp.raise_for_status()
        return [(job["job_id"], job.get("audio_url")) for job in resp.json()["jobs"]]

    def deliveries(self, job_ids: list[str]) -> dict[str, list[dict]]:
        """The webhook deliveries the database holds for these jobs: status and attempts."""
        from sqlalchemy import select

        from models.delivery.notify import WebhookDelivery

        found: dict[str, list[dict]] = {}
        with self.db.session() as session:
            for row in session.scalars(select(WebhookDelivery).where(WebhookDelivery.job_id.in_(job_ids))):
                found.setdefault(row.job_id, []).append(
                    {"event": row.event, "status": row.status, "attempts": (row.attempts or [])[-3:]}
                )
        return found

    def stop(self) -> None:
        stop(self.proc, timeout=300)
        if self.db._engine is not None:
            self.db._engine.dispose()


class Ledger:
    """Every submission and what the door said to it."""

    def __init__(self):
        self.items: list[dict] = []
        self.lock = threading.Lock()

    def add(self, **item) -> None:
        with self.lock:
            self.items.append(item)

    def accepted(self) -> list[dict]:
        return [i for i in self.items if i.get("job_id")]


def retry_later(item: dict) -> bool:
    """Whether a submission without a job was told to come back (or never heard back): it may
    have made a job all the same, which its Idempotency-Key (or task id) finds."""
    return not item.get("job_id") and (item["code"] in (*RETRYABLE, CUT_OFF, BROKER_DOWN) or item["code"] >= 500)


class Client:
    """The ways in, as users and services use them."""

    def __init__(self, stack: Stack, files: Files, hooks: Hooks, ledger: Ledger, rng: random.Random, share: float):
        self.stack, self.files, self.hooks, self.ledger, self.rng = stack, files, hooks, ledger, rng
        self.webhook_share = share
        inbox = stack.data / "inbox"
        for name in GOOD_CLIPS:
            shutil.copy(CLIPS[name]["path"], inbox / name)
        self.inbox = inbox
        os.environ.update(CELERY_BROKER_URL=stack.broker_url, WHISPERQ_DATA_DIR=str(stack.data))
        from tasks import transcribe  # the app reads the environment above

        self.transcribe = transcribe

    def post(self, path: str, key: str, **kwargs) -> requests.Response:
        return self.stack.session.post(
            f"{self.stack.base}{path}", headers={"Idempotency-Key": key}, timeout=60, **kwargs
        )

    def submit(self, kind: str, priority: str) -> None:
        name = self.rng.choice(GOOD_CLIPS)
        clip = name if kind not in BAD else None  # what its transcript must say
        at = time.time()
        key = uuid.uuid4().hex
        webhook = kind in HOOKED and self.rng.random() < self.webhook_share
        record: dict[str, Any] = dict(
            kind=kind, priority=priority, bad=kind in BAD, submitted=at, key=key, webhook=webhook
        )
        fields = {"priority": priority, "language": "en", **({"callback_url": self.hooks.url} if webhook else {})}
        try:
            if kind == "delay":
                # delay() with its task id chosen here (apply_async, which delay() calls), so a call
                # that raised can be looked up: a job's id is its task's, a lower-case UUID (a
                # message naming anything else is dropped unread).
                key = str(uuid.uuid4())
                record.update(key=None, task_id=key)
                result = self.transcribe.apply_async(
                    (str(self.inbox / name),),
                    {"language": "en", "priority": priority, "api_key": self.stack.key},
                    task_id=key,
                )
                return self.ledger.add(**record, clip=name, code=202, job_id=result.id)
            if kind == "batch":
                names = [self.rng.choice(GOOD_CLIPS) for _ in range(self.rng.randint(2, 3))]
                urls = {self.files.url(n): n for n in names}
                record.update(namespace="batch", urls=urls)
                resp = self.post(
                    "/v1/batches",
                    key,
                    json={"audio_urls": [self.files.url(n) for n in names], "priority": priority, "language": "en"},
                )
                if resp.status_code == 202:
                    for job in resp.json()["jobs"]:
                        self.ledger.add(**record, clip=urls[job["audio_url"]], code=202, job_id=job["job_id"])
                    return
                return self.ledger.add(**record, clip=None, code=resp.status_code, error=_error(resp))
            record["namespace"] = "api"
            if kind in ("upload", "analysed"):
                resp = self.post(
                    "/v1/jobs",
                    key,
                    data={**fields, "redact": "pii"} if kind == "analysed" else fields,
                    files={"file": (name, CLIPS[name]["path"].read_bytes())},
                )
            elif kind == "url":
                resp = self.post("/v1/jobs", key, json={**fields, "audio_url": self.files.url(name)})
            elif kind == "garbage":
                resp = self.post(
                    "/v1/jobs", key, data=fields, files={"file": ("noise.wav", self.rng.randbytes(32 * 1024))}
                )
            elif kind == "unsupported":
                resp = self.post("/v1/jobs", key, data=fields, files={"file": ("notes.pdf", PDF)})
            else:  # bad_url
                resp = self.post("/v1/jobs", key, json={**fields, "audio_url": self.files.url("noise.wav")})
            job_id = resp.json().get("job_id") if resp.status_code == 202 else None
            self.ledger.add(
                **record, clip=clip, code=resp.status_code, job_id=job_id, error=None if job_id else _error(resp)
            )
        except requests.RequestException as exc:  # a web worker killed under the request
            self.ledger.add(**record, clip=clip, code=CUT_OFF, error=_name(exc))
        except (OperationalError, DatabaseOperationalError, DatabaseInterfaceError, OSError) as exc:  # away
            self.ledger.add(**record, clip=name, code=BROKER_DOWN, error=_name(exc))
        except Exception as exc:  # delay() refused it: counted, unexpected
            self.ledger.add(**record, clip=name, code=DELAY_REFUSED, error=_name(exc))


def _name(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def _error(resp: requests.Response) -> str:
    try:
        return resp.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return resp.text[:100]


def look_up_refused(stack: Stack, ledger: Ledger) -> int:
    """For each submission told to come back (429/503), cut off, or answered 5xx: whether it
    made a job all the same, by its Idempotency-Key in the idempotency table (a delay() call:
    by its task id, the job's). Each job found joins the ledger as accepted after a refusal,
    to be judged as an accepted one; how many were found."""
    found = 0
    for item in [i for i in ledger.items if retry_later(i) and not i.get("made")]:
        made: list[tuple[str, str | None]] = []
        try:
            if item.get("task_id"):
                if stack.rows([item["task_id"]]):
                    made = [(item["task_id"], item["clip"])]
            elif item.get("key") and (made_id := stack.made_under(item["namespace"], item["key"])):
                if item["namespace"] == "batch":
                    made = [(job_id, item["urls"].get(url or "")) for job_id, url in stack.batch_jobs(made_id)]
                else:
                    made = [(made_id, item["clip"])]
        except Exception as exc:  # the database or the API still away: looked up again later
            print(f"  could not look up a refused {item['kind']}: {_name(exc)}", flush=True)
            continue
        if made:
            item["made"] = [job_id for job_id, _ in made]
            for job_id, clip in made:
                ledger.add(**{**item, "made": None, "job_id": job_id, "clip": clip, "after_refusal": True})
            found += len(made)
    return found


def wait_finished(stack: Stack, ids: list[str], deadline: float) -> dict[str, dict]:
    """The jobs' rows once all have finished, or at `deadline` (time.monotonic())."""
    rows: dict[str, dict] = {}
    while True:
        try:
            rows = stack.rows(ids)
        except Exception as exc:  # the database restarting: try again
            print(f"  reading the jobs failed ({_name(exc)}); again", flush=True)
        pending = [i for i in ids if rows.get(i, {}).get("status") not in FINISHED]
        if not pending or time.monotonic() > deadline:
            return rows
        time.sleep(2)


def wait_webhooks(hooks: Hooks, job_ids: set[str], deadline: float) -> set[str]:
    """Wait (to `deadline`) for a delivery of each job's webhook; the ids still without one."""
    while (missing := {j for j in job_ids if j not in hooks.received}) and time.monotonic() < deadline:
        time.sleep(2)
    return missing


def measure_capacity(stack: Stack, jobs: int) -> float:
    """Jobs of the capacity clip a minute: one to load the model, then `jobs` at once."""
    path = CLIPS[CAPACITY_CLIP]["path"]

    def upload(_n=0) -> str:
        resp = stack.session.post(
            f"{stack.base}/v1/jobs",
            files={"file": (CAPACITY_CLIP, path.read_bytes())},
            data={"language": "en"},
            timeout=60,
        )
        resp.raise_for_status()
        return resp.json()["job_id"]

    wait_finished(stack, [upload()], time.monotonic() + 300)
    start = time.time()
    with ThreadPoolExecutor(jobs) as pool:
        ids = list(pool.map(upload, range(jobs)))
    rows = wait_finished(stack, ids, time.monotonic() + 900)
    ends = [r["finished_at"].timestamp() for r in rows.values() if r.get("finished_at")]
    if len(ends) < jobs:
        raise SystemExit(f"the capacity burst did not finish: {len(ends)} of {jobs} jobs; see {stack.log}")
    return jobs / (max(ends) - start) * 60


def stream(
    client: Client,
    rate: float,
    seconds: float,
    burst_every: float,
    burst_size: int,
    rng: random.Random,
    pool: ThreadPoolExecutor,
) -> None:
    """Poisson arrivals at `rate` a minute, and a burst every `burst_every` seconds."""
    start = time.monotonic()
    next_burst = start + burst_every
    while (now := time.monotonic()) < start + seconds:
        if now >= next_burst:
            for _ in range(burst_size):
                pool.submit(client.submit, pick(KINDS, rng), pick(PRIORITIES, rng))
            next_burst += burst_every
        pool.submit(client.submit, pick(KINDS, rng), pick(PRIORITIES, rng))
        time.sleep(min(rng.expovariate(rate / 60), max(0.0, start + seconds - time.monotonic())))


def analysis_status(stack: Stack, job_id: str) -> str | None:
    """How the redact analysis of an upload that asked for it ended (DONE, FAILED), as its result says."""
    try:
        resp = stack.session.get(f"{stack.base}/v1/jobs/{job_id}", timeout=30)
        return ((resp.json().get("result") or {}).get("analyses") or {}).get("redact", {}).get("status")
    except (requests.RequestException, ValueError):
        return None


def transcript(stack: Stack, client: Client, job_id: str, kind: str) -> str | None:
    try:
        resp = stack.session.get(f"{stack.base}/v1/jobs/{job_id}", timeout=30)
        if resp.status_code == 200 and resp.json().get("result"):
            return resp.json()["result"]["text"]
    except requests.RequestException:
        pass
    if kind == "delay":  # its caller's way: the result backend
        try:
            return client.transcribe.AsyncResult(job_id).get(timeout=10)["text"]
        except Exception:  # counted as unread
            return None
    return None


def engine_ledger(stack: Stack, chaos: Chaos, completed: list[str]) -> tuple[dict, dict[str, str]]:
    """The engine's passes over the completed jobs (models/jobs/ledger.py): their figures, and
    each job whose passes break "the engine went through it once", with why. A pass that never
    ended is explained by a kill of its process (the pid of every process Chaos killed), or
    by PostgreSQL killed while it ran (its end could not be written: it started at most a
    pass's time limit before the kill and before PostgreSQL was back); one that ended
    `failed` only where the broker or PostgreSQL was killed during the run."""
    from datetime import UTC, datetime

    from models.jobs.ledger import Explained, passes, problems

    by_job = passes(stack.db, completed)
    failed_explained = bool(chaos.infra_killed)
    longest = stack.settings.time_limit(60.0)  # every clip of the stream is under a minute
    explained = Explained(
        killed=frozenset(chaos.killed),
        hosts=frozenset(),
        outcomes=frozenset({"failed"}) if failed_explained else frozenset(),
        unrecorded=tuple(
            (datetime.fromtimestamp(killed - longest, UTC), datetime.fromtimestamp(back or time.time(), UTC))
            for killed, back in chaos.db_away
        ),
    )
    found = problems(by_job, explained)
    every = [p for rows in by_job.values() for p in rows]
    outcomes: dict[str, int] = {}
    for p in every:
        outcomes[p.outcome or "unended"] = outcomes.get(p.outcome or "unended", 0) + 1
    figures = {
        "jobs": len(by_job),
        "passes": len(every),
        "by_outcome": outcomes,
        "unended": outcomes.get("unended", 0),
        "unended_in_killed_processes": sum(
            1 for p in every if p.outcome is None and explained.kill_explains(p.process)
        ),
        "unended_in_database_outages": sum(
            1
            for p in every
            if p.outcome is None and not explained.kill_explains(p.process) and explained.outage_explains(p.started_at)
        ),
        "killed_pids": len(chaos.killed),
        "failed_explained": failed_explained,
        "failed_explained_why": (
            f"{' and '.join(sorted(chaos.infra_killed))} killed during the run: a pass that ended failed "
            "while it was down is explained"
            if failed_explained
            else "neither the broker nor PostgreSQL was killed: a pass that ended failed is a problem"
        ),
    }
    return figures, found


def report(stack: Stack, client: Client, ledger: Ledger, rows: dict[str, dict], chaos: Chaos, hooks: Hooks) -> dict:
    counts = dict.fromkeys(
        (
            "submitted",
            "accepted",
            "accepted_after_refusal",
            "completed",
            "failed_as_expected",
            "failed_unexpectedly",
            "refused_for_now",
            "lost",
            "engine_problems",
            "webhooks_asked",
            "webhooks_missing",
            "wrong_words",
            "unread",
        ),
        0,
    )
    problems: dict[str, list] = {k: [] for k in (*FAILING, "unread")}
    latency: dict[str, list[float]] = {p: [] for p in PRIORITIES}
    completed: list[str] = []
    hooked: list[str] = []
    for item in ledger.items:
        if not item.get("job_id"):
            counts["submitted"] += 1
            if item["bad"] and 400 <= item["code"] < 500 and item["code"] not in RETRYABLE:
                counts["failed_as_expected"] += 1
            elif item["code"] >= 500 and item["code"] != 503:  # whether or not it made a job: not an answer
                counts["failed_unexpectedly"] += 1
                problems["failed_unexpectedly"].append(
                    {k: item.get(k) for k in ("kind", "code", "error", "made")} | {"at": item["submitted"]}
                )
            elif item.get("made"):
                pass  # counted as its jobs: accepted after the refusal
            elif retry_later(item):
                counts["refused_for_now"] += 1
            else:
                counts["failed_unexpectedly"] += 1
                problems["failed_unexpectedly"].append({k: item.get(k) for k in ("kind", "code", "error")})
            continue
        if item.get("after_refusal"):
            counts["accepted_after_refusal"] += 1
        else:
            counts["submitted"] += 1
            counts["accepted"] += 1
        row = rows.get(item["job_id"]) or {}
        status = row.get("status")
        if status not in FINISHED:
            counts["lost"] += 1
            problems["lost"].append(
                {
                    "job_id": item["job_id"],
                    "kind": item["kind"],
                    "status": status,
                    "after_refusal": "after_refusal" in item,
                }
            )
            continue
        if item["bad"]:
            ok = status == "FAILED"
            counts["failed_as_expected" if ok else "failed_unexpectedly"] += 1
            if not ok:
                problems["failed_unexpectedly"].append(
                    {"job_id": item["job_id"], "kind": item["kind"], "status": status}
                )
            continue
        if status != "COMPLETED":
            counts["failed_unexpectedly"] += 1
            problems["failed_unexpectedly"].append(
                {"job_id": item["job_id"], "kind": item["kind"], "status": status, "error": (row["error"] or "")[:300]}
            )
            continue
        completed.append(item["job_id"])
        if item.get("webhook"):
            hooked.append(item["job_id"])
        if item["kind"] == "analysed" and (ended := analysis_status(stack, item["job_id"])) != "DONE":
            counts["failed_unexpectedly"] += 1
            problems["failed_unexpectedly"].append(
                {"job_id": item["job_id"], "kind": item["kind"], "status": status, "error": f"redact: {ended}"}
            )
            continue
        counts["completed"] += 1
        latency[item["priority"]].append(row["finished_at"].timestamp() - item["submitted"])
        text = transcript(stack, client, item["job_id"], item["kind"])
        if text is None:
            counts["unread"] += 1
            problems["unread"].append({"job_id": item["job_id"], "kind": item["kind"]})
        elif word_error_rate(CLIPS[item["clip"]]["text"], text) > WRONG:
            counts["wrong_words"] += 1
            problems["wrong_words"].append({"job_id": item["job_id"], "clip": item["clip"], "text": text})
    figures, engine = engine_ledger(stack, chaos, completed)
    counts["engine_problems"] = len(engine)
    problems["engine_problems"] = [{"job_id": job_id, "why": why} for job_id, why in sorted(engine.items())]
    counts["webhooks_asked"] = len(hooked)
    missing = [j for j in hooked if j not in hooks.received]
    counts["webhooks_missing"] = len(missing)
    if missing:
        held = stack.deliveries(missing)
        problems["webhooks_missing"] = [{"job_id": j, "deliveries": held.get(j, [])} for j in missing]
    by_kind: dict[str, dict[str, int]] = {}
    for item in ledger.items:
        entry = by_kind.setdefault(item["kind"], {"submitted": 0, "accepted": 0, "accepted_after_refusal": 0})
        if item.get("after_refusal"):
            entry["accepted_after_refusal"] += 1
        else:
            entry["submitted"] += 1
            entry["accepted"] += bool(item.get("job_id"))
    return {
        "counts": counts,
        "by_kind": by_kind,
        "engine_ledger": figures,
        "webhooks": {
            "asked": len(hooked),
            "delivered": len(hooked) - len(missing),
            "missing": len(missing),
            "posts_received": hooks.posts,
            "jobs_delivered_more_than_once": sum(1 for j in hooked if hooks.received.get(j, 0) > 1),
        },
        "problems": problems,
        "latency_seconds": {
            p: {
                "n": len(v),
                "p50": pct(v, 0.5),
                "p99": pct(v, 0.99),
                "mean": round(statistics.fmean(v), 2) if v else None,
            }
            for p, v in latency.items()
        },
    }


def targets(results: dict, args: argparse.Namespace) -> dict:
    """The targets a long run is held to: the stack's PSS growth after warm-up and the longest
    /healthz outage. A run shorter than --judge-minutes is too short to judge them."""
    growth = (results.get("memory", {}).get("stack") or {}).get("growth_pct")
    longest = results.get("healthz", {}).get("longest_outage_seconds")
    judged = args.minutes >= args.judge_minutes
    out = {
        "judged": judged,
        "pss_growth_pct": growth,
        "max_pss_growth_pct": args.max_growth,
        "longest_outage_seconds": longest,
        "max_outage_seconds": args.max_outage,
    }
    if not judged:
        out["verdict"] = f"not judged (run too short: {args.minutes:g} min < {args.judge_minutes:g} min)"
        return out
    misses = []
    if growth is None or growth > args.max_growth:
        misses.append(f"stack PSS growth {growth} % > {args.max_growth:g} %" if growth is not None else "no PSS growth")
    if longest is None or longest > args.max_outage:
        misses.append(f"longest /healthz outage {longest} s > {args.max_outage:g} s")
    out["verdict"] = "met" if not misses else "missed: " + "; ".join(misses)
    out["misses"] = misses
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--minutes",
        type=float,
        default=float(os.environ.get("SOAK_MINUTES", "60")),
        help="length of the stream (default 60, or SOAK_MINUTES)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="jobs a minute in the steady stream (default: 2/3 of the capacity measured first)",
    )
    parser.add_argument("--capacity-jobs", type=int, default=8, help="the burst that measures capacity (default 8)")
    parser.add_argument("--burst-every", type=float, default=60.0, help="seconds between bursts (default 60)")
    parser.add_argument("--burst-size", type=int, default=6, help="jobs in a burst (default 6)")
    parser.add_argument(
        "--webhook-share",
        type=float,
        default=0.3,
        help="the share of uploads and audio_urls that ask for a webhook (default 0.3)",
    )
    parser.add_argument(
        "--chaos-every",
        type=float,
        default=None,
        help="seconds between kills (default: each target hit at least once, at most every 120 s)",
    )
    parser.add_argument(
        "--broker-restart",
        default=None,
        help="a command that restarts an external broker, run instead of killing it (SIGKILL, started again)",
    )
    parser.add_argument("--no-postgres-restart", action="store_true", help="on PostgreSQL, do not kill it")
    parser.add_argument(
        "--drain", type=float, default=900.0, help="most seconds to wait after the stream for the jobs and webhooks"
    )
    parser.add_argument(
        "--max-growth", type=float, default=10.0, help="most stack PSS growth after warm-up, in %% (default 10)"
    )
    parser.add_argument(
        "--max-outage", type=float, default=2.0, help="longest /healthz outage allowed, in seconds (default 2)"
    )
    parser.add_argument(
        "--judge-minutes",
        type=float,
        default=20.0,
        help="the shortest run the two targets above are judged on (default 20)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "soak", help="where the JSON and the plot go")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    if args.minutes <= 0 or (args.rate is not None and args.rate <= 0):
        parser.error("--minutes and --rate must be above 0")
    if not 0 <= args.webhook_share <= 1:
        parser.error("--webhook-share is a share: 0 to 1")
    args.out = args.out.resolve()  # transcribe.delay() is given paths under it, which must be absolute
    args.out.mkdir(parents=True, exist_ok=True)
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    rng = random.Random(seed)
    files = Files(rng)
    hooks = Hooks()
    stack = Stack(args.out, files, hooks)
    ledger = Ledger()
    memory = Memory(stack.proc.pid)
    memory.start()
    results: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seed": seed,
        "minutes": args.minutes,
        "cores": os.cpu_count(),
        "load_before": os.getloadavg(),
        "broker": "embedded redis" if stack.embedded else stack.broker_url.split("://")[0],
        "database": stack.settings.database_url.split(":")[0],
        "data_dir": str(stack.data),
    }
    chaos = health = None
    try:
        capacity = measure_capacity(stack, args.capacity_jobs)
        rate = args.rate or capacity * 2 / 3
        results.update(
            capacity_jobs_per_minute=round(capacity, 2),
            capacity_clip=CAPACITY_CLIP,
            rate_jobs_per_minute=round(rate, 2),
        )
        client = Client(stack, files, hooks, ledger, rng, args.webhook_share)
        seconds = args.minutes * 60
        chaos = Chaos(stack, args.broker_restart, postgres=not args.no_postgres_restart)
        chaos.every = args.chaos_every or min(120.0, seconds / (len(chaos.targets) + 1))  # each target once at least
        print(
            f"capacity {capacity:.1f} jobs/min of {CAPACITY_CLIP}; streaming {rate:.1f} jobs/min for "
            f"{args.minutes:g} min; a kill every {chaos.every:.0f} s, in turn: {', '.join(chaos.targets)}",
            flush=True,
        )
        health = Health(stack)
        health.start()
        chaos.start()
        with ThreadPoolExecutor(16) as pool:
            stream(client, rate, seconds, args.burst_every, args.burst_size, rng, pool)
        chaos.done.set()
        chaos.join(300)
        print(f"stream over: {len(ledger.items)} submissions; draining", flush=True)
        drain_start = time.monotonic()
        deadline = drain_start + args.drain
        look_up_refused(stack, ledger)
        rows = wait_finished(stack, [i["job_id"] for i in ledger.accepted()], deadline)
        # Looked up again: a delay() call's job is made only when a worker takes its message.
        if look_up_refused(stack, ledger):
            rows = wait_finished(stack, [i["job_id"] for i in ledger.accepted()], deadline)
        hooked = {
            i["job_id"] for i in ledger.accepted() if i.get("webhook") and rows.get(i["job_id"], {}).get("status")
        }
        wait_webhooks(hooks, {j for j in hooked if rows[j]["status"] == "COMPLETED"}, deadline)
        health.done.set()
        health.join(5)
        results["drain_seconds"] = round(time.monotonic() - drain_start, 1)
        results.update(report(stack, client, ledger, rows, chaos, hooks))
        results["healthz"] = {
            "probes": health.probes,
            "outages": len(health.outages),
            "down_seconds": round(sum(s for _, s in health.outages), 1),
            "longest_outage_seconds": max((s for _, s in health.outages), default=0.0),
            "each": health.outages,
        }
        results["chaos"] = chaos.events
    finally:
        memory.done.set()
        memory.join(10)
        results["pss_mib"] = memory.series
        # Warm-up: the capacity burst, the models loading, the first minutes of the stream.
        results["memory"] = memory_summary(memory.rounds, warmup=min(300.0, args.minutes * 60 / 4))
        stack.stop()
        results["load_after"] = os.getloadavg()
        results["targets"] = targets(results, args)
        (args.out / "soak.json").write_text(json.dumps(results, indent=1, default=str))
    if chaos is not None and health is not None:
        plot(args.out / "soak.png", memory, chaos, health)
    counts = results["counts"]
    print(f"capacity {results['capacity_jobs_per_minute']} jobs/min; stream {results['rate_jobs_per_minute']} jobs/min")
    print(markdown(results), flush=True)  # the tables of docs/soak.md
    goal = results["targets"]
    print(
        f"targets: stack PSS growth after warm-up {goal['pss_growth_pct']} % (at most {args.max_growth:g} %); "
        f"longest /healthz outage {goal['longest_outage_seconds']} s (at most {args.max_outage:g} s): "
        f"{goal['verdict']}",
        flush=True,
    )
    print(f"written: {args.out / 'soak.json'}, {args.out / 'soak.png'}", flush=True)
    bad = {k: counts[k] for k in FAILING if counts[k]}
    if bad:
        # The problems themselves on stdout too: CI keeps what the run printed, not var/soak/.
        problems = {k: v for k, v in results["problems"].items() if v}
        print(json.dumps({"problems": problems}, indent=1, default=str)[:20000], flush=True)
    if bad or goal.get("misses"):
        print(f"FAIL: {bad or ''}{' ' if bad else ''}{'; '.join(goal.get('misses', []))}", flush=True)
        print(f"see {args.out / 'soak.json'}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
