"""Benchmark: does the queue pay for itself? Four ways through the same burst, in one run,
on the same audio (BENCH_JOBS uploads of the 9.4 s clip):

  (a) faster-whisper called file by file (WhisperModel.transcribe: same model, beam, threads);
  (b) the engine's batched ceiling: all the burst's windows through the real batcher and
      engine in one process, every job waiting from the start;
  (c) the service as `make run` starts it (`whisperq run`), the uploads sent at once, each
      client then following its job with the long-poll (`?wait=30`), as the web page does;
  (d) the synchronous baseline (bench/sync_baseline.py: the model run inside the request,
      gunicorn 2 processes x 4 threads, as whisper services are commonly run), same burst.

Reported: audio-seconds per second and the ratios; for (c) accept p50/p99 as the clients
saw it and as the server timed it (its access log), status GET p50/p99 during the burst (a
prober reading a waiting job every 100 ms), the CPU each kind of
process used, and the batch sizes seen; prepare's CPU per audio-second. Run with
`make bench-load`; results go in the README.

    BENCH_JOBS=60 python bench/load.py
"""
from __future__ import annotations

import os
import re
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from service import free_port, running_service, stop  # noqa: E402

CLIP = ROOT / "tests" / "fixtures" / "report.opus"
JOBS = int(os.environ.get("BENCH_JOBS", "60"))
TIMEOUT = float(os.environ.get("BENCH_TIMEOUT", "120"))
KINDS = (("redis-server", "broker"), ("prepare@", "prepare"), ("inference@", "inference"), ("notify@", "notify"),
         ("flower", "flower"), ("beat", "beat"), ("gunicorn", "web"), ("supervisord", "supervisord"))
TICKS = os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def clip_seconds() -> float:
    from models.speech import audio

    return len(audio.decode(CLIP)) / audio.SAMPLE_RATE


# --- (a) and (b): in this process -----------------------------------------------------------

def direct() -> float:
    from faster_whisper import WhisperModel

    from config import Settings
    from models.speech import audio
    from models.speech.catalog import model_path
    from models.speech.engines import resolve_device, usable_cores

    settings = Settings.from_env()
    device, compute_type = resolve_device(settings.device, settings.compute_type)  # as the service resolves them
    # One file at a time gets every core, as someone running the model by hand would give it.
    model = WhisperModel(model_path(settings), device=device, compute_type=compute_type, cpu_threads=usable_cores())
    samples = audio.decode(CLIP)
    list(model.transcribe(samples, beam_size=settings.beam_size, language="en")[0])  # warm
    started = time.perf_counter()
    for _ in range(JOBS):
        list(model.transcribe(samples, beam_size=settings.beam_size, language="en")[0])
    return JOBS * len(samples) / audio.SAMPLE_RATE / (time.perf_counter() - started)


def ceiling() -> tuple[float, str]:
    from config import Settings
    from models.speech import audio
    from models.speech.batching import Batcher
    from models.speech.catalog import model_path
    from models.speech.engines import FasterWhisperEngine, batch_size, engine_threads, parallel_batches
    from models.speech.windows import split_windows

    settings = Settings.from_env()
    parallel = parallel_batches(settings)
    engine = FasterWhisperEngine(model_path(settings), device=settings.device, compute_type=settings.compute_type,
                                 cpu_threads=engine_threads(settings), beam_size=settings.beam_size, workers=parallel)
    samples = audio.decode(CLIP)
    chunks = [(w.samples(samples), w.time_map()) for w in split_windows(samples)]
    engine.transcribe_batch([c[0] for c in chunks], [c[1] for c in chunks], "en")  # warm
    size = batch_size(settings)
    batcher = Batcher(lambda key, ps: engine.transcribe_batch([p[0] for p in ps], [p[1] for p in ps], key),
                      max_batch=size, max_wait=0.05, parallel=parallel)
    started = time.perf_counter()
    futures = [f for _ in range(JOBS) for f in batcher.submit("en", chunks)]
    for f in futures:
        f.result()
    took = time.perf_counter() - started
    batcher.close()
    return JOBS * len(samples) / audio.SAMPLE_RATE / took, f"{parallel} x {size}"


# --- (c): the service -------------------------------------------------------------------------

def cpu_by_kind(root: int) -> dict[str, float]:
    """CPU seconds used so far by every process below `root`, by kind."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    todo, out = [root], {}
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        kind = next((name for key, name in KINDS if key in cmd), None)
        if kind and pid in stats:
            out[kind] = out.get(kind, 0.0) + (int(stats[pid][11]) + int(stats[pid][12])) / TICKS
    return out


def service() -> dict:
    with running_service("whisperq-load-") as (proc, base, tmp):
        data = CLIP.read_bytes()
        warm = requests.post(f"{base}/v1/jobs", files={"file": ("warm.opus", data)}, timeout=30).headers["Location"]
        while requests.get(warm, timeout=10).json()["status"] != "COMPLETED":
            time.sleep(0.2)
        log = tmp / "logs" / "inference.log"
        skip = log.read_text().count("batch:")
        db = sqlite3.connect(tmp / "whisperq.db", timeout=30)
        accept, status_reads, finished = [], [], []
        done = threading.Event()
        probe_url: list[str] = []

        def prober():  # a client reading a waiting job the plain way, every 100 ms
            while not done.wait(0.1):
                if probe_url:
                    started = time.perf_counter()
                    requests.get(probe_url[0], timeout=10)
                    status_reads.append(time.perf_counter() - started)

        def client(n: int) -> None:
            started = time.perf_counter()
            resp = requests.post(f"{base}/v1/jobs", files={"file": (f"burst-{n}.opus", data)}, timeout=60)
            accept.append(time.perf_counter() - started)
            url, tag = resp.headers["Location"], None
            if not probe_url:
                probe_url.append(url)
            while True:
                answer = requests.get(f"{url}?wait=30", headers={"If-None-Match": tag} if tag else {}, timeout=60)
                if answer.status_code == 200:
                    tag = answer.headers["ETag"]
                    if answer.json()["status"] in ("COMPLETED", "FAILED"):
                        finished.append(time.perf_counter())
                        return

        before = cpu_by_kind(proc.pid)
        thread = threading.Thread(target=prober, daemon=True)
        thread.start()
        started = time.perf_counter()
        with ThreadPoolExecutor(JOBS) as pool:
            list(pool.map(client, range(JOBS)))
        drained = max(finished) - started
        done.set()
        after = cpu_by_kind(proc.pid)
        sizes = [int(m) for m in re.findall(r"batch: (\d+) windows", log.read_text())][skip:]
        # The same uploads as the server timed them (gunicorn's access log): from the request
        # read to the answer sent, without the clients' own time on these cores.
        posts = [float(m) for m in re.findall(r'"POST /v1/jobs HTTP[^\n]*?"duration_ms": ([\d.]+)',
                                              (tmp / "logs" / "web.log").read_text())][1:]
        prepared = db.execute("select sum(audio_duration) from jobs").fetchone()[0]
    used = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    return {"drained": drained, "accept": accept, "accept_server_ms": posts, "status": status_reads, "cpu": used, "sizes": sizes,
            "prepare_cpu_per_audio_s": used.get("prepare", 0.0) / max(prepared or 1.0, 1.0)}


# --- (d): the synchronous baseline --------------------------------------------------------------

def baseline() -> dict:
    port = free_port()
    bindir = Path(sys.executable).parent
    proc = subprocess.Popen(
        [str(bindir / "gunicorn"), "--bind", f"127.0.0.1:{port}", "--workers", "2", "--worker-class", "gthread",
         "--threads", "4", "--timeout", "600", "bench.sync_baseline:app"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/transcribe"
    data = CLIP.read_bytes()
    try:
        deadline = time.monotonic() + 120
        warmed = 0
        while warmed < 4:  # both processes load their model
            try:
                warmed += requests.post(url, files={"file": ("warm.opus", data)}, timeout=60).status_code == 200
            except requests.RequestException:
                if time.monotonic() > deadline:
                    raise RuntimeError("the baseline did not start") from None
                time.sleep(0.5)

        def one(n: int) -> tuple[int, float]:
            started = time.perf_counter()
            try:
                return requests.post(url, files={"file": (f"b{n}.opus", data)}, timeout=TIMEOUT).status_code, \
                    time.perf_counter() - started
            except requests.RequestException:
                return 0, time.perf_counter() - started

        started = time.perf_counter()
        with ThreadPoolExecutor(JOBS) as pool:
            answers = list(pool.map(one, range(JOBS)))
        return {"drained": time.perf_counter() - started, "ok": sum(1 for s, _ in answers if s == 200),
                "latency": [t for _, t in answers]}
    finally:
        stop(proc)


def main() -> None:
    seconds = clip_seconds()
    audio_total = JOBS * seconds
    a = direct()
    b, size = ceiling()
    c = service()
    d = baseline()
    c_rate = audio_total / c["drained"]
    d_rate = d["ok"] * seconds / d["drained"]
    print(f"{JOBS} uploads of the {seconds:.1f} s clip ({audio_total:.0f} s of audio), sent at once; "
          f"{os.cpu_count()} cores, batches of {size.split(' x ')[1]}, {size.split(' x ')[0]} at once\n")
    print("| way through the burst | audio-s per s | vs (a) |")
    print("|---|---|---|")
    for name, rate in (("(a) faster-whisper file by file", a), (f"(b) the engine in one process, {size} windows at once", b),
                       ("(c) the service (`whisperq run`)", c_rate), ("(d) synchronous baseline", d_rate)):
        print(f"| {name} | {rate:.1f} | {rate / a:.2f}x |")
    print(f"\n(c) / (b) = {c_rate / b:.2f}, (c) / (d) = {c_rate / d_rate:.2f}")
    print(f"(c) accept p50 {statistics.median(c['accept']) * 1000:.0f} ms, p99 {pct(c['accept'], 0.99) * 1000:.0f} ms; "
          f"status GET during the burst p50 {statistics.median(c['status']) * 1000:.1f} ms, "
          f"p99 {pct(c['status'], 0.99) * 1000:.1f} ms ({len(c['status'])} reads)")
    if c["accept_server_ms"]:
        print(f"(c) accept as the server timed it: p50 {statistics.median(c['accept_server_ms']):.0f} ms, "
              f"p99 {pct(c['accept_server_ms'], 0.99):.0f} ms")
    total = sum(c["cpu"].values()) or 1.0
    print("(c) CPU by process: " + ", ".join(f"{k} {v:.1f} s ({v / total:.0%})"
                                            for k, v in sorted(c["cpu"].items(), key=lambda kv: -kv[1])))
    print(f"(c) batch sizes: {c['sizes']} (mean {statistics.mean(c['sizes']):.2f})")
    print(f"(c) prepare: {c['prepare_cpu_per_audio_s'] * 1000:.1f} ms of CPU per audio-second")
    print(f"(d) {d['ok']}/{JOBS} answered within {TIMEOUT:.0f} s; latency p50 {statistics.median(d['latency']):.1f} s, "
          f"p99 {pct(d['latency'], 0.99):.1f} s")


if __name__ == "__main__":
    main()
