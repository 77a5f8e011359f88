"""Benchmark: does a second inference host add capacity? One inference host against two, the
same burst, in one run, side by side.

  host 1 (this machine's root namespace): the web (the Procfile's gunicorn line), a private
      broker (an embedded redis-server on a free loopback port), PostgreSQL (a database of
      this benchmark's own, dropped and made again at each run), the prepare and notify pools
      (their Procfile lines);
  inference host A and inference host B: each a real second host (tests/hosts.py: a network,
      mount and UTS namespace of its own, host 1's services through TCP forwarders, no shared
      disk), running the Procfile's inference line pinned to one core (A on core 0, B on
      core 1) with WHISPERQ_CPU_THREADS=1.

Audio and prepared samples live in PostgreSQL large objects (WHISPERQ_STORAGE=postgres), so
the inference hosts read them over the wire; every host has the same encryption keys.

  (1) host A consumes alone: --jobs / BENCH_JOBS uploads (default 32) of the 9.4 s clip
      (bench/load.py's) sent at once over HTTP, then wait until every job has finished (read from the database);
  (2) hosts A and B both consume: the same burst.

Both inference workers run throughout: the one left out of (1) has its consumer of the
inference queue cancelled (Celery's cancel_consumer) and added back for (2); each host has
loaded its model on two warm-up jobs of its own before anything is timed.

Throughput = audio seconds transcribed / (last finish - first accept), both from the job rows
(created_at, finished_at). The pair (1), (2) runs --runs / BENCH_RUNS times (default 3),
interleaved; reported:
the median of each way, each pair's ratio, which host ran each job (the job's `worker` is
the inference worker's Celery hostname, inference@<the host's hostname>), the CPU each host
used, and how busy the whole machine was (what was not this benchmark's is other work on
the machine: the cores are shared). The table is printed in Markdown and the results
written to var/bench-scale.json; every process's log is kept in var/bench-scale-logs/.
BENCH_INFERENCE_NICE sets the inference hosts' WHISPERQ_POOL_NICE (default: the Procfile's).
Needs root (network namespaces), two cores, and PostgreSQL on 127.0.0.1:5432 (user
postgres, trust). Run with `make bench-scale`:

    BENCH_JOBS=32 BENCH_RUNS=3 python bench/scale.py
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

import knobs  # noqa: E402
from hosts import HostUnavailable, SecondHost  # noqa: E402
from service import TICKS, below, free_port, process_cpu  # noqa: E402

CLIP = ROOT / "tests" / "fixtures" / "report.opus"  # bench/load.py's clip
KNOBS = knobs.read(__doc__, "32", runs=3, what="uploads per burst")
JOBS, PAIRS = KNOBS.size, KNOBS.runs
TIMEOUT = float(os.environ.get("BENCH_TIMEOUT", "240"))  # seconds for one burst to finish
PG = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432")
DB_NAME = os.environ.get("BENCH_DB", "whisperq_bench")
# The inference hosts' WHISPERQ_POOL_NICE (empty: the Procfile's default, 10).
INFERENCE_NICE = os.environ.get("BENCH_INFERENCE_NICE", "")
RESULTS = ROOT / "var" / "bench-scale.json"
LOGS = ROOT / "var" / "bench-scale-logs"  # every process's log of the latest run, kept
BIN = Path(sys.executable).parent
PROCFILE = ROOT / "Procfile"
FINISHED = ("COMPLETED", "FAILED", "EXPIRED", "CANCELLED")
# What the benchmark sets itself: whatever the calling shell has for these is dropped.
OWN = (
    "CELERY_BROKER_URL",
    "CELERY_RESULT_BACKEND",
    "DATABASE_URL",
    "WHISPERQ_REDIS_URL",
    "WHISPERQ_DATA_DIR",
    "WHISPERQ_STORAGE",
    "WHISPERQ_MODELS",
    "WHISPERQ_DEFAULT_MODEL",
    "WHISPERQ_ALIASES",
    "WHISPERQ_SHADOW",
    "WHISPERQ_INFERENCE_QUEUES",
    "WHISPERQ_ENCRYPTION_KEYS",
    "WHISPERQ_SECRET_KEY",
    "WHISPERQ_WEBHOOK_SECRET",
    "WHISPERQ_CPU_THREADS",
    "HOST",
    "PORT",
    "WHISPERQ_PUBLIC_URL",
    "WHISPERQ_METRICS_PORT",
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def procfile_argv(name: str, env: dict[str, str]) -> list[str]:
    """The Procfile's `name` line as argv: ${VAR:-default} from `env`, this venv's tools."""
    line = next(ln for ln in PROCFILE.read_text().splitlines() if ln.startswith(f"{name}:"))
    command = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), line.split(":", 1)[1])
    argv = shlex.split(command)
    return [str(BIN / word) if word in ("gunicorn", "celery") and (BIN / word).exists() else word for word in argv]


def cpu_seconds(root: int) -> float:
    """CPU seconds used so far by `root` and every process below it."""
    children, used = process_cpu()
    return sum((used.get(pid, 0.0) for pid in below(root, children)), 0.0)


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every core, not idle or iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICKS  # user..steal, less idle and iowait


def postgres_backends() -> dict[int, float]:
    """CPU seconds of each PostgreSQL backend serving the benchmark's database."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                if cmd.startswith("postgres: ") and f" {DB_NAME} " in cmd:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    out[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICKS
            except OSError:
                continue
    return out


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM (a warm shutdown for Celery, graceful for gunicorn), then its group killed."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet, a session of its own: the group is ours
        proc.wait()


def psql(sql: str, database: str = "postgres") -> None:
    subprocess.run(
        ["psql", f"{PG}/{database}", "-v", "ON_ERROR_STOP=1", "-qAtc", sql],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )


class Bench:
    def __init__(self, stack: ExitStack):
        self.stack = stack
        self.tmp = Path(tempfile.mkdtemp(prefix="whisperq-scale-"))
        stack.callback(shutil.rmtree, self.tmp, ignore_errors=True)
        shutil.rmtree(LOGS, ignore_errors=True)
        LOGS.mkdir(parents=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.data = CLIP.read_bytes()

    # -- host 1 ----------------------------------------------------------------------------
    def start_host1(self) -> None:
        from config.embedded import EmbeddedRedis

        psql(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        psql(f'CREATE DATABASE "{DB_NAME}"')
        self.stack.callback(psql, f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        broker = EmbeddedRedis(self.tmp / "redis")
        broker_url = broker.start()
        self.stack.callback(broker.stop)
        self.broker_pid = broker.process.pid
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in OWN}
        env.update(
            CELERY_BROKER_URL=broker_url,
            DATABASE_URL=f"{PG.replace('postgresql://', 'postgresql+psycopg://', 1)}/{DB_NAME}",
            WHISPERQ_STORAGE="postgres",
            WHISPERQ_DATA_DIR=str(self.tmp / "data"),
            # The same on every host: what one host sealed, the others open.
            WHISPERQ_ENCRYPTION_KEYS="bench:" + base64.b64encode(os.urandom(32)).decode(),
            WHISPERQ_SECRET_KEY=base64.b64encode(os.urandom(32)).decode(),
            WHISPERQ_WEBHOOK_SECRET="whsec_" + base64.b64encode(os.urandom(32)).decode(),
            WHISPERQ_ALLOW_ANONYMOUS="true",
            WHISPERQ_CPU_THREADS="1",  # one engine thread per batch: each inference host has one core
            WHISPERQ_LOG_FORMAT=os.environ.get("WHISPERQ_LOG_FORMAT", "text"),
            PORT=str(self.port),
            PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        )
        (self.tmp / "data").mkdir(mode=0o700)
        self.env = env
        os.environ.update(env)  # this process reads the same settings (its control commands, its checks)
        for key in OWN:
            if key not in env:
                os.environ.pop(key, None)
        from config import Settings
        from models.db import Database
        from tasks.app import celery_for

        self.settings = Settings.from_env(env)
        Database(self.settings.database_url).upgrade()  # once, before the processes race for it (as `whisperq run`)
        self.celery = celery_for(self.settings)
        for name in ("web", "prepare", "notify"):
            self.procs[name] = self._start(name, procfile_argv(name, env), env)
        self._wait_web()

    def _start(
        self, name: str, argv: list[str], env: dict[str, str], host: SecondHost | None = None, cpus: str | None = None
    ) -> subprocess.Popen:
        out = (LOGS / f"{name}.log").open("w")  # opened on host 1, handed to the process
        if host is None:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        else:
            proc = host.popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cpus=cpus)
        out.close()
        self.stack.callback(stop, proc)
        return proc

    def _wait_web(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            try:
                if requests.get(f"{self.base}/readyz", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the web did not get ready; see {LOGS / 'web.log'}")
            time.sleep(0.3)

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (LOGS / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    # -- the inference hosts ---------------------------------------------------------------
    def start_inference_hosts(self) -> None:
        self.hosts: dict[str, SecondHost] = {}
        self.nodes: dict[str, str] = {}
        for label, cpus in (("A", "0"), ("B", "1")):
            # Host 1's temp dirs (its data dir among them) are not there for host 2.
            host = self.stack.enter_context(SecondHost(hide=[self.tmp]))
            self.hosts[label] = host
            env = host.env(self.env)  # broker and database through the forwarders, its own data dir
            if INFERENCE_NICE:
                env["WHISPERQ_POOL_NICE"] = INFERENCE_NICE
            self.procs[f"inference-{label}"] = self._start(
                f"inference-{label}", procfile_argv("inference", env), env, host=host, cpus=cpus
            )
            self.nodes[label] = f"inference@{host.hostname}"
        self.cpus = {"A": "0", "B": "1"}
        wanted = {"prepare@", "notify@", *self.nodes.values()}
        deadline = time.monotonic() + 120
        while True:
            self._check_alive()
            seen = {node for reply in self.celery.control.ping(timeout=1.0) for node in reply}
            if all(any(node.startswith(w) if w.endswith("@") else node == w for node in seen) for w in wanted):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not answering within 120 s: want {sorted(wanted)}, seen {sorted(seen)}")

    def consuming(self, labels: tuple[str, ...]) -> None:
        """Only these inference hosts take jobs from the inference queue."""
        from config import INFERENCE_QUEUE

        for label, node in self.nodes.items():
            if label in labels:
                self.celery.control.add_consumer(INFERENCE_QUEUE, destination=[node], reply=True, timeout=5)
            else:
                self.celery.control.cancel_consumer(INFERENCE_QUEUE, destination=[node], reply=True, timeout=5)
        time.sleep(1.2)  # a BRPOP already waiting (1 s at most) may still take one message

    # -- bursts ----------------------------------------------------------------------------
    def post(self, name: str) -> str:
        resp = requests.post(f"{self.base}/v1/jobs", files={"file": (name, self.data)}, timeout=120)
        resp.raise_for_status()
        return resp.json()["job_id"]

    def wait(self, ids: list[str], timeout: float = TIMEOUT) -> list[dict]:
        import psycopg

        deadline = time.monotonic() + timeout
        with psycopg.connect(f"{PG}/{DB_NAME}", autocommit=True) as conn:
            while True:
                rows = conn.execute(
                    "SELECT id, status, worker, created_at, finished_at, audio_duration, error FROM jobs "
                    "WHERE id = ANY(%s)",
                    (ids,),
                ).fetchall()
                if len(rows) == len(ids) and all(r[1] in FINISHED for r in rows):
                    break
                self._check_alive()
                if time.monotonic() > deadline:
                    states = statistics.multimode([r[1] for r in rows]) if rows else []
                    raise RuntimeError(
                        f"{sum(r[1] not in FINISHED for r in rows)} of {len(ids)} jobs not finished "
                        f"after {timeout:.0f} s (most are {states}); logs in {LOGS}"
                    )
                time.sleep(0.2)
        keys = ("id", "status", "worker", "created_at", "finished_at", "audio_duration", "error")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def warm(self) -> None:
        """Each inference host loads its model on a job of its own, before anything is timed."""
        for label in self.nodes:
            self.consuming((label,))
            rows = self.wait([self.post(f"warm-{label}-{n}.opus") for n in range(2)], timeout=120)
            bad = [r for r in rows if r["status"] != "COMPLETED" or r["worker"] != self.nodes[label]]
            if bad:
                raise RuntimeError(f"warm-up on host {label} went wrong: {bad}")

    def host_of(self, worker: str | None) -> str:
        for label, host in self.hosts.items():
            if worker and worker.endswith(f"@{host.hostname}"):
                return label
        return worker or "none"

    def burst(self, way: int, labels: tuple[str, ...]) -> dict:
        self.consuming(labels)
        tree = {name: proc.pid for name, proc in self.procs.items()}
        tree["broker"] = self.broker_pid
        cpu_before = {name: cpu_seconds(pid) for name, pid in tree.items()}
        pg_before, busy_before = postgres_backends(), machine_busy()
        own_before = os.times()
        started = time.time()
        with ThreadPoolExecutor(JOBS) as pool:
            ids = list(pool.map(lambda n: self.post(f"burst-{way}-{n}.opus"), range(JOBS)))
        accepted = time.time()
        rows = self.wait(ids)
        seen_done = time.time()
        own_after = os.times()
        cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in tree.items()}
        cpu["this process (clients, forwarders)"] = (own_after.user - own_before.user) + (
            own_after.system - own_before.system
        )
        # PostgreSQL's backends for this database (one that ended during the burst is missed).
        cpu["postgres"] = sum(used - pg_before.get(pid, 0.0) for pid, used in postgres_backends().items())
        busy = machine_busy() - busy_before
        done = [r for r in rows if r["status"] == "COMPLETED"]
        first = min(r["created_at"] for r in rows)
        last = max(r["finished_at"] for r in rows if r["finished_at"] is not None)
        wall = (last - first).total_seconds()
        audio_s = sum(r["audio_duration"] or 0.0 for r in done)
        split: dict[str, int] = {}
        for r in done:
            split[self.host_of(r["worker"])] = split.get(self.host_of(r["worker"]), 0) + 1
        return {
            "way": way,
            "inference_hosts": list(labels),
            "jobs": len(ids),
            "completed": len(done),
            "failed": [
                {"id": r["id"], "status": r["status"], "error": r["error"]} for r in rows if r["status"] != "COMPLETED"
            ],
            "audio_seconds": round(audio_s, 2),
            "wall_seconds": round(wall, 3),
            "audio_s_per_s": audio_s / wall if wall > 0 else 0.0,
            "client": {
                "upload_seconds": round(accepted - started, 3),
                "audio_s_per_s": audio_s / (seen_done - started),
            },
            "split": dict(sorted(split.items())),
            "cpu_seconds": {k: round(v, 2) for k, v in cpu.items()},
            # From the first upload sent to the last finish seen: the machine's busy cores, and
            # what of it was not this benchmark's (other work on the machine, the kernel's share).
            "machine_busy_cores": round(busy / (seen_done - started), 2),
            "other_busy_cores": round(max(0.0, busy - sum(cpu.values())) / (seen_done - started), 2),
            "core_use": {label: round(cpu[f"inference-{label}"] / wall, 2) for label in labels},
            # Audio-seconds per CPU-second the inference hosts used: what the work costs, whatever
            # share of their cores the rest of the machine left them.
            "audio_s_per_inference_cpu_s": round(
                audio_s / max(sum(cpu[f"inference-{label}"] for label in labels), 1e-9), 2
            ),
        }


def main() -> None:
    if (os.cpu_count() or 1) < 2 or len(os.sched_getaffinity(0)) < 2:
        sys.exit("bench/scale.py pins its two inference hosts to cores 0 and 1: it needs two cores")
    began = time.monotonic()
    runs: list[dict] = []
    with ExitStack() as stack:
        bench = Bench(stack)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleaned up as on Ctrl-C
        log(f"host 1: web, broker, prepare, notify; database {DB_NAME}; logs in {LOGS.relative_to(ROOT)}")
        bench.start_host1()
        log("inference hosts A (core 0) and B (core 1)")
        try:
            bench.start_inference_hosts()
        except HostUnavailable as exc:
            sys.exit(f"bench/scale.py needs a second host (tests/hosts.py): {exc}")
        log(f"up: {', '.join(bench.nodes.values())}; warming each")
        bench.warm()
        from models.speech import audio
        from models.speech.engines import batch_size, resolve_device

        clip_s = len(audio.decode(CLIP)) / audio.SAMPLE_RATE
        device, compute = resolve_device(bench.settings.device, bench.settings.compute_type)
        setup_s = time.monotonic() - began
        for pair in range(PAIRS):
            for way, labels in ((1, ("A",)), (2, ("A", "B"))):
                log(f"pair {pair + 1}/{PAIRS}, ({way}) {' + '.join(labels)}: {JOBS} uploads")
                run = bench.burst(way, labels)
                run["pair"] = pair + 1
                runs.append(run)
                log(
                    f"  {run['audio_s_per_s']:.1f} audio-s/s, {run['completed']}/{run['jobs']} completed, "
                    f"split {run['split']}, core use {run['core_use']}"
                )
        hostnames = {label: host.hostname for label, host in bench.hosts.items()}
        slots = bench.settings.inference_slots
        log("stopping")
    total_s = time.monotonic() - began

    rates = {way: [r["audio_s_per_s"] for r in runs if r["way"] == way] for way in (1, 2)}
    medians = {way: statistics.median(v) for way, v in rates.items()}
    pair_ratios = [b["audio_s_per_s"] / a["audio_s_per_s"] for a, b in zip(runs[0::2], runs[1::2], strict=False)]
    ratio = medians[2] / medians[1]
    summary = {
        "clip": CLIP.name,
        "clip_seconds": round(clip_s, 2),
        "jobs": JOBS,
        "pairs": PAIRS,
        "model": f"{bench.settings.default_model} {compute} on {device}",
        "cores": os.cpu_count(),
        "inference": {
            "cpus": bench.cpus,
            "hostnames": hostnames,
            "slots": slots,
            "cpu_threads": 1,
            "batch_size": batch_size(bench.settings),
        },
        "storage": "postgres",
        "broker": "embedded redis (private, loopback)",
        "median_audio_s_per_s": {"1 host": round(medians[1], 2), "2 hosts": round(medians[2], 2)},
        "ratio": round(ratio, 3),
        "pair_ratios": [round(r, 3) for r in pair_ratios],
        "setup_seconds": round(setup_s, 1),
        "total_seconds": round(total_s, 1),
        "runs": runs,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2, default=str) + "\n")

    print(
        f"{JOBS} uploads of the {clip_s:.1f} s clip ({JOBS * clip_s:.0f} s of audio), sent at once over HTTP; "
        f"{summary['model']}; each inference host on one core (WHISPERQ_CPU_THREADS=1, {slots} slots); "
        f"{PAIRS} pair(s) of runs, interleaved, median\n"
    )
    print("| way | inference hosts | audio-s/s | vs 1 host |")
    print("|---|---|---|---|")
    print(f"| (1) one inference host | A (core 0) | {medians[1]:.1f} | 1.00× |")
    print(f"| (2) two inference hosts | A (core 0) + B (core 1) | {medians[2]:.1f} | {ratio:.2f}× |")
    print()
    for a, b, r in zip(runs[0::2], runs[1::2], pair_ratios, strict=False):
        print(
            f"- pair {a['pair']}: (1) {a['audio_s_per_s']:.1f}, (2) {b['audio_s_per_s']:.1f} audio-s/s: {r:.2f}×; "
            f"jobs by host in (2): "
            + ", ".join(f"{k} {v}" for k, v in b["split"].items())
            + " (in (1): "
            + ", ".join(f"{k} {v}" for k, v in a["split"].items())
            + ")"
        )
    for r in runs:
        if r["failed"]:
            print(f"- pair {r['pair']} ({r['way']}): {len(r['failed'])} jobs did not complete: {r['failed'][:3]}")
    print(
        "- share of its core each inference host used, (1) / (2): "
        + "; ".join(
            f"pair {a['pair']}: A {a['core_use']['A']:.2f} / A {b['core_use']['A']:.2f}, B {b['core_use']['B']:.2f}"
            for a, b in zip(runs[0::2], runs[1::2], strict=False)
        )
    )
    print(
        "- audio-s per CPU-second of the inference hosts, by run: "
        + ", ".join(f"{r['audio_s_per_inference_cpu_s']:.1f}" for r in runs)
    )
    host1 = [
        (sum(v for k, v in r["cpu_seconds"].items() if not k.startswith("inference")), r["wall_seconds"]) for r in runs
    ]
    print(
        "- host 1 (web, prepare, notify, broker, PostgreSQL, this process) in cores busy, by run: "
        + ", ".join(f"{c / w:.2f}" for c, w in host1)
    )
    print(
        "- the machine's busy cores, by run: "
        + ", ".join(f"{r['machine_busy_cores']:.2f}" for r in runs)
        + "; of which not this benchmark's: "
        + ", ".join(f"{r['other_busy_cores']:.2f}" for r in runs)
    )
    print(
        f"\nratio (2) / (1) = {ratio:.2f}; setup {setup_s:.0f} s, whole run {total_s:.0f} s; results in "
        f"{RESULTS.relative_to(ROOT)}"
    )


if __name__ == "__main__":
    main()
