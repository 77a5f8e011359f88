"""Benchmark: load leveling. A burst of submissions from concurrent clients against the
whole service (`whisperq run`: embedded broker, gunicorn, the pools), and the same burst
against a synchronous baseline (bench/sync_baseline.py: the model run inside the request,
under the same gunicorn settings). Run with `make bench-load`; results go in the README.

Reported for each: how many requests were accepted (202 from the queue; 200 within the
client's time-out from the baseline), API latency p50/p99, the time until every accepted
job had its transcript, and the peak resident memory of each kind of process.

    BENCH_JOBS=1000 BENCH_CLIENTS=32 BENCH_TIMEOUT=60 python bench/load.py
"""
from __future__ import annotations

import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
CLIP = ROOT / "tests" / "fixtures" / "fox.flac"
JOBS = int(os.environ.get("BENCH_JOBS", "1000"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "32"))
TIMEOUT = float(os.environ.get("BENCH_TIMEOUT", "60"))  # a typical proxy or client time-out

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import free_port, running_service, stop  # noqa: E402


class MemoryWatch:
    """Peak RSS of every process below `root`, by kind, sampled every 0.5 s."""

    KINDS = (("redis-server", "broker"), ("prepare@", "prepare"), ("inference@", "inference"), ("notify@", "notify"),
             ("flower", "flower"), ("beat", "beat"), ("gunicorn", "web"), ("supervisord", "supervisord"), ("whisperq", "whisperq run"))

    def __init__(self, root: int):
        self.root, self.peak, self.stop = root, {}, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def kind(self, cmdline: str) -> str:
        return next((name for key, name in self.KINDS if key in cmdline), "other")

    def run(self) -> None:
        while not self.stop.wait(0.5):
            children: dict[int, list[int]] = {}
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    except (OSError, IndexError, ValueError):
                        continue
                    children.setdefault(ppid, []).append(int(entry.name))
            todo, usage = [self.root], {}
            while todo:
                pid = todo.pop()
                todo += children.get(pid, [])
                try:
                    cmd = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
                    rss = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                               if line.startswith("VmRSS:")) * 1024
                except (OSError, StopIteration):
                    continue
                kind = self.kind(cmd)
                usage[kind] = max(usage.get(kind, 0), rss)  # the largest process of each kind
            for kind, rss in usage.items():
                self.peak[kind] = max(self.peak.get(kind, 0), rss)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def burst(url: str, field: str = "file") -> tuple[list[int], list[float], float]:
    data = CLIP.read_bytes()
    local = threading.local()

    def one(n: int) -> tuple[int, float]:
        session = getattr(local, "session", None) or requests.Session()
        local.session = session
        started = time.perf_counter()
        try:
            resp = session.post(url, files={field: (f"burst-{n}.flac", data)}, timeout=TIMEOUT)
            status = resp.status_code
        except requests.RequestException:
            status = 0  # timed out or refused: the client gave up
        return status, time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(one, range(JOBS)))
    return [r[0] for r in results], [r[1] for r in results], time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def queued_service() -> dict:
    with running_service("whisperq-load-") as (proc, base, tmp):
        # One job first, so the model is loaded as in a running service.
        requests.post(f"{base}/v1/jobs", files={"file": ("warm.flac", CLIP.read_bytes())}, timeout=30)
        db = sqlite3.connect(tmp / "whisperq.db", timeout=30)

        def completed() -> int:
            return db.execute("select count(*) from jobs where status = 'COMPLETED'").fetchone()[0]

        while completed() < 1:
            time.sleep(0.2)
        with MemoryWatch(proc.pid) as memory:
            started = time.perf_counter()
            statuses, latencies, submit_seconds = burst(f"{base}/v1/jobs")
            accepted = statuses.count(202)
            while completed() < accepted + 1:
                time.sleep(0.5)
            drained = time.perf_counter() - started
        return {"accepted": accepted, "statuses": statuses, "latencies": latencies, "submit_seconds": submit_seconds,
                "drain_seconds": drained, "memory": memory.peak}


def synchronous_baseline() -> dict:
    port = free_port()
    bindir = Path(sys.executable).parent
    proc = subprocess.Popen(
        [str(bindir / "gunicorn"), "--bind", f"127.0.0.1:{port}", "--workers", "2", "--worker-class", "gthread",
         "--threads", "4", "--timeout", "300", "bench.sync_baseline:app"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/transcribe"
    try:
        deadline = time.monotonic() + 60
        while True:  # one request per gunicorn worker loads its model
            try:
                if requests.post(url, files={"file": ("warm.flac", CLIP.read_bytes())}, timeout=60).status_code == 200:
                    requests.post(url, files={"file": ("warm.flac", CLIP.read_bytes())}, timeout=60)
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the baseline did not start")
            time.sleep(0.5)
        with MemoryWatch(proc.pid) as memory:
            statuses, latencies, seconds = burst(url)
        # Requests the client gave up on still run to the end on the server.
        return {"accepted": statuses.count(200), "statuses": statuses, "latencies": latencies,
                "submit_seconds": seconds, "drain_seconds": seconds, "memory": memory.peak}
    finally:
        stop(proc)


def report(name: str, r: dict) -> None:
    lat = r["latencies"]
    others = {s: r["statuses"].count(s) for s in set(r["statuses"]) if s not in (200, 202)}
    print(f"{name}: {r['accepted']}/{JOBS} accepted ({r['accepted'] / JOBS:.0%}), others {others}; "
          f"API latency p50 {statistics.median(lat):.3f} s, p99 {percentile(lat, 0.99):.3f} s; "
          f"burst sent in {r['submit_seconds']:.1f} s; all accepted jobs transcribed after {r['drain_seconds']:.0f} s")
    print("  peak RSS: " + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(r["memory"].items())))


def main() -> None:
    print(f"{JOBS} submissions of the 4.3 s clip from {CLIENTS} client threads, client time-out {TIMEOUT:.0f} s")
    report("queued (whisperq run)", queued_service())
    report("synchronous baseline", synchronous_baseline())


if __name__ == "__main__":
    main()
