"""Benchmark: does the queue pay for itself? The same burst of uploads of the 9.4 s clip, sent
at once, through every way a user could have it transcribed on this machine, side by side:

  (a)  faster-whisper file by file: one `WhisperModel` on every core, `transcribe(path)` in a loop;
  (a′) the fastest file-by-file script on this machine: as many loops as cores, each file on one
       thread. Both ways a user could write it are measured and the faster one is (a′):
       one `WhisperModel(cpu_threads=1)` per loop, or one `WhisperModel(cpu_threads=1,
       num_workers=<cores>)` shared by the loops. This, not (a), is what the service must beat:
       (a) leaves the parallelism a user could script to the service;
  (a″) the same fastest script (as many loops as cores, one thread each) decoding as the service
       does: this project's engine (speech windows packed by VAD, no timestamp tokens, one
       temperature, no conditioning on earlier text) one file at a time, no batching. (a′) to
       (a″) is what the decoder gains; (a″) to (b) and (c) what batching and the queue gain;
  (b)  the engine's batched ceiling: all the burst's windows through the real batcher and engine
       in one process, every job waiting from the start;
  (c)  the service as `make run` starts it (`whisperq run`), the uploads sent at once, each client
       then following its job one of two ways (BENCH_MODES, default both):
         poll      GET /v1/jobs/<id> every 0.5 s, ignoring Retry-After (a 429 too waits 0.5 s),
                   as a naive client does;
         longpoll  GET /v1/jobs/<id>?wait=30 with If-None-Match, as docs/api.md says (and the web
                   page does); a 429 waits its Retry-After;
  (d)  a synchronous server (bench/sync_baseline.py: the model run inside the request, gunicorn 2
       processes x 4 threads, as whisper services are commonly run), each client giving up after
       60 s as a gateway would; this project's engine inside the request;
  (d′) a synchronous server as whisper-asr-webservice's faster-whisper engine runs: one process,
       faster-whisper's own `WhisperModel.transcribe(path)` on every core, one request at a time
       behind a lock.

Same model, beam and language everywhere. A job's latency is from its upload (for (a), (a′) and
(b): from the burst's start, every file there at once) to its transcript in the client's hands;
"answered within 60 s" counts those that took 60 s or less. Throughput is the audio answered per
second, from the burst's start to the last answer (for (d), to the last client answered or gone).
The clients of (c) and (d), one thread each, run in this process, on the cores they measure.

Every burst size (--jobs / BENCH_JOBS, a list, default 60,200) runs in each of --runs / BENCH_RUNS
runs (default 3), the ways interleaved run by run so drift on a shared machine hits them alike;
the table gives each column's median over the runs. For (c) it also gives accept p50/p99 as the
clients saw it and as the server timed it (its access log), the web's CPU per upload (each
answer's `Server-Timing: cpu;dur=`), status reads during the burst (a prober reading the job
accepted last every 100 ms, its Retry-After after a 429, until it is finished), the requests
the web answered, the CPU each kind of process used, the batch sizes seen, and prepare's CPU per
audio-second; with both client modes, the share of the long-poll's throughput that naive
polling keeps. The table is printed in Markdown; every run's numbers, with the commit, date and machine,
go to bench/results/load.json at the full size (kept in the repository), else var/bench/load.json
(bench/results.py). `make bench-load`:

    BENCH_JOBS=60,200 BENCH_RUNS=3 python bench/load.py
"""

from __future__ import annotations

import os
import queue
import re
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import knobs  # noqa: E402
import results  # noqa: E402
from service import below, free_port, process_cpu, running_service, stop  # noqa: E402

KNOBS = knobs.read(__doc__, "60,200", runs=3, many_jobs=True, what="uploads per burst")
MODES = tuple(m.strip() for m in os.environ.get("BENCH_MODES", "poll,longpoll").split(",") if m.strip())
if not MODES or set(MODES) - {"poll", "longpoll"}:
    sys.exit(f"BENCH_MODES must be poll, longpoll or both, comma separated; got {os.environ['BENCH_MODES']!r}")
CLIP = ROOT / "tests" / "fixtures" / "report.opus"
WITHIN = 60.0  # an answer later than this is one a gateway (and most users) gave up on
GIVE_UP = float(os.environ.get("BENCH_TIMEOUT", "900"))  # a (c) client stops following its job after this
POLL_EVERY = 0.5
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED")
KINDS = (
    ("redis-server", "broker"),
    ("prepare@", "prepare"),
    ("inference@", "inference"),
    ("notify@", "notify"),
    ("analysis@", "analysis"),
    ("whisperq grpc", "grpc"),
    ("flower", "flower"),
    ("beat", "beat"),
    ("gunicorn", "web"),
    ("supervisord", "supervisord"),
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def clip_seconds() -> float:
    from models.speech import audio

    return len(audio.decode(CLIP)) / audio.SAMPLE_RATE


def outcome(answered: list[float], seconds: float, span: float, **extra) -> dict:
    """One way's burst: `answered` the latencies of the jobs answered, `span` the burst's time."""
    return {
        "answered": len(answered),
        "within": sum(1 for t in answered if t <= WITHIN),
        "rate": len(answered) * seconds / span if span > 0 else 0.0,
        "span": span,
        "p50": pct(answered, 0.5),
        "p99": pct(answered, 0.99),
        "latency": answered,
        **extra,
    }


# --- (a), (a′), (b): in this process -------------------------------------------------------------


class Scripts:
    """The file-by-file scripts a user could write with the same model, loaded once."""

    def __init__(self) -> None:
        from faster_whisper import WhisperModel

        from config import Settings
        from models.registry.catalog import model_path
        from models.speech.engines import resolve_device, usable_cores

        settings = Settings.from_env()
        device, compute = resolve_device(settings.device, settings.compute_type)  # as the service resolves them
        path, self.beam, self.cores = model_path(settings), settings.beam_size, usable_cores()

        def model(threads: int, workers: int = 1):
            return WhisperModel(path, device=device, compute_type=compute, cpu_threads=threads, num_workers=workers)

        def own(threads: int):  # the service's engine and decoding, as the inference pool builds it
            from models.speech.engines import FasterWhisperEngine

            return FasterWhisperEngine(
                path,
                device=settings.device,
                compute_type=settings.compute_type,
                cpu_threads=threads,
                beam_size=settings.beam_size,
            )

        shared = model(1, self.cores)
        # name -> the model each of its loops uses
        self.ways: dict[str, list] = {
            "(a) one model on every core, one loop": [model(self.cores)],
            f"{self.cores} models x 1 thread, {self.cores} loops": [model(1) for _ in range(self.cores)],
            f"1 model x 1 thread, num_workers={self.cores}, {self.cores} loops": [shared] * self.cores,
        }
        # (a″): not a candidate for (a′); the service's decoder in the same loops
        self.own = f"(a″) {self.cores} loops x 1 thread, the service's decoding, file by file"
        self.ways[self.own] = [own(1) for _ in range(self.cores)]
        for models in self.ways.values():
            for m in set(models):
                self._one(m)  # warm: the first call allocates

    def _one(self, model) -> None:
        if hasattr(model, "transcribe_batch"):  # the service's engine: decode the file, then its windows
            from models.speech import audio

            model.transcribe(audio.decode(CLIP), language="en")
            return
        segments, _info = model.transcribe(str(CLIP), beam_size=self.beam, language="en")
        list(segments)

    def burst(self, name: str, jobs: int, seconds: float) -> dict:
        """`jobs` files, all there at the start, shared by the way's loops (one thread each)."""
        todo: queue.Queue[int] = queue.Queue()
        for n in range(jobs):
            todo.put(n)
        done: list[float] = []
        started = time.perf_counter()

        def loop(model) -> None:
            while True:
                try:
                    todo.get_nowait()
                except queue.Empty:
                    return
                self._one(model)
                done.append(time.perf_counter() - started)

        threads = [threading.Thread(target=loop, args=(m,)) for m in self.ways[name]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return outcome(done, seconds, max(done))


class Ceiling:
    """(b): the real batcher and engine in one process, as the inference pool runs them."""

    def __init__(self) -> None:
        from config import Settings
        from models.registry.catalog import model_path
        from models.speech import audio
        from models.speech.engines import FasterWhisperEngine, batch_size, engine_threads, parallel_batches
        from models.speech.windows import split_windows

        settings = Settings.from_env()
        self.parallel, self.size = parallel_batches(settings), batch_size(settings)
        self.engine = FasterWhisperEngine(
            model_path(settings),
            device=settings.device,
            compute_type=settings.compute_type,
            cpu_threads=engine_threads(settings),
            beam_size=settings.beam_size,
            workers=self.parallel,
        )
        samples = audio.decode(CLIP)
        self.chunks = [(w.samples(samples), w.time_map()) for w in split_windows(samples)]
        self.engine.transcribe_batch([c[0] for c in self.chunks], [c[1] for c in self.chunks], "en")  # warm

    def burst(self, jobs: int, seconds: float) -> dict:
        from models.speech.batching import Batcher

        batcher = Batcher(
            lambda key, ps: self.engine.transcribe_batch([p[0] for p in ps], [p[1] for p in ps], key),
            max_batch=self.size,
            max_wait=0.05,
            parallel=self.parallel,
        )
        started = time.perf_counter()
        per_job = [batcher.submit("en", self.chunks) for _ in range(jobs)]
        for futures in per_job:
            for f in futures:
                f.add_done_callback(lambda f: setattr(f, "done_at", time.perf_counter()))
        for futures in per_job:
            for f in futures:
                f.result()
        batcher.close()  # its threads joined: every callback has run
        done = [max(f.done_at for f in futures) - started for futures in per_job]
        return outcome(done, seconds, max(done))


# --- (c): the service -----------------------------------------------------------------------------


def cpu_by_kind(root: int) -> dict[str, float]:
    """CPU seconds used so far by every process below `root`, by kind."""
    children, used = process_cpu()
    out: dict[str, float] = {}
    for pid in below(root, children):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        kind = next((name for key, name in KINDS if key in cmd), None)
        if kind and pid in used:
            out[kind] = out.get(kind, 0.0) + used[pid]
    return out


def cores_busy() -> tuple[float, float]:
    """The machine's CPU time so far (/proc/stat, every core): busy and total, in ticks."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def retry_after(resp: requests.Response) -> float:
    try:
        return max(0.0, float(resp.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0


def server_cpu_ms(resp: requests.Response) -> float | None:
    """The CPU the web spent on a request, as its `Server-Timing: cpu;dur=MS` says."""
    match = re.search(r"cpu;dur=([\d.]+)", resp.headers.get("Server-Timing", ""))
    return float(match.group(1)) if match else None


def upload(base: str, name: str, data: bytes, mode: str, cpu: list[float] | None = None) -> str:
    """POST the clip until accepted (429/503: again after 0.5 s, or Retry-After for longpoll); its
    status URL. The accepted request's web CPU (ms) is appended to `cpu`."""
    while True:
        resp = requests.post(f"{base}/v1/jobs", files={"file": (name, data)}, timeout=120)
        if resp.status_code in (200, 202):
            if cpu is not None and (used := server_cpu_ms(resp)) is not None:
                cpu.append(used)
            return resp.headers["Location"]
        if resp.status_code not in (429, 503):
            raise RuntimeError(f"upload refused: {resp.status_code} {resp.text[:300]}")
        time.sleep(POLL_EVERY if mode == "poll" else retry_after(resp))


def follow(url: str, mode: str, deadline: float) -> str | None:
    """Follow a job until it is finished (its status) or `deadline` passes (None)."""
    tag = None
    while time.monotonic() < deadline:
        try:
            if mode == "poll":
                resp = requests.get(url, timeout=30)
            else:
                resp = requests.get(f"{url}?wait=30", headers={"If-None-Match": tag} if tag else {}, timeout=60)
        except requests.RequestException:
            time.sleep(POLL_EVERY if mode == "poll" else 1.0)
            continue
        if resp.status_code == 200:
            tag = resp.headers.get("ETag")
            if resp.json()["status"] in FINISHED:
                return resp.json()["status"]
        if mode == "poll":
            time.sleep(POLL_EVERY)  # whatever came back, a 429 included
        elif resp.status_code not in (200, 304):
            time.sleep(retry_after(resp))
    return None


class Service:
    """`whisperq run` in a fresh data dir, warm, taking one burst after another."""

    def __init__(self, proc, base: str, tmp: Path) -> None:
        self.proc, self.base, self.tmp = proc, base, tmp
        self.data = CLIP.read_bytes()
        url = upload(base, "warm.opus", self.data, "longpoll")
        if follow(url, "longpoll", time.monotonic() + 180) != "COMPLETED":
            raise RuntimeError(f"the warm-up job did not complete; see {tmp / 'logs'}")
        self.db = sqlite3.connect(tmp / "whisperq.db", timeout=30)

    def _log(self, name: str) -> str:
        """A process's log with its rotated parts before it, oldest first: supervisord rotates
        each at 10 MB (web.supervise), which a burst of naive pollers' access lines passes."""
        logs = self.tmp / "logs"
        parts = [logs / f"{name}.log.{n}" for n in (3, 2, 1)] + [logs / f"{name}.log"]
        return "".join(p.read_text(errors="replace") for p in parts if p.exists())

    def _web_since(self, marker: str) -> str:
        """The web's access log from the line of the request for `marker` on (the burst's own
        lines, however the log rotated meanwhile); empty if it rotated away."""
        text = self._log("web")
        at = text.rfind(marker)
        if at < 0:
            print(f"note: the web log rotated past the burst's start ({marker}): no server timings", flush=True)
            return ""
        return text[at:]

    def serial_uploads(self, count: int = 10) -> list[float]:
        """The web's CPU (ms) for an upload alone: `count` uploads one at a time. Under the gevent
        worker a request's `Server-Timing` counts the process's CPU while the request was in it,
        other requests' interleaved with it too: in a burst, an upper bound."""
        cpu: list[float] = []
        for n in range(count):
            upload(self.base, f"serial-{n}.opus", self.data, "longpoll", cpu)
        return cpu

    def burst(self, jobs: int, mode: str, seconds: float) -> dict:
        inference_before = self._log("inference")
        marker = f"/v1/jobs/bench-burst-{time.monotonic_ns()}"
        requests.get(self.base + marker, timeout=30)  # a 404 whose access line marks the burst's start
        audio_before = self.db.execute("select coalesce(sum(audio_duration), 0) from jobs").fetchone()[0]
        accept: list[float] = []
        accept_cpu: list[float] = []
        status_reads: list[float] = []
        answered: list[float] = []
        done = threading.Event()
        probe: list[str] = []
        deadline = time.monotonic() + GIVE_UP

        def prober() -> None:  # a client reading a waiting job the plain way, every 100 ms
            pause = 0.1
            while not done.wait(pause):
                if probe:  # the job accepted last: the one that waits longest
                    t = time.perf_counter()
                    resp = requests.get(probe[-1], timeout=30)
                    pause = 0.1
                    if resp.status_code == 429:  # paced (web.pollrate): a held 429 times no read
                        pause = retry_after(resp)
                        continue
                    status_reads.append(time.perf_counter() - t)
                    if resp.status_code == 200 and resp.json()["status"] in FINISHED:
                        return  # nothing waits any more

        def client(n: int) -> float | None:
            t = time.perf_counter()
            url = upload(self.base, f"burst-{n}.opus", self.data, mode, accept_cpu)
            accept.append(time.perf_counter() - t)
            probe.append(url)
            if follow(url, mode, deadline) == "COMPLETED":
                answered.append(time.perf_counter() - t)
                return time.perf_counter()
            return None

        before, busy_before, clients_before = cpu_by_kind(self.proc.pid), cores_busy(), os.times()
        watcher = threading.Thread(target=prober, daemon=True)
        watcher.start()
        started = time.perf_counter()
        with ThreadPoolExecutor(jobs) as pool:
            ends = [e for e in pool.map(client, range(jobs)) if e is not None]
        done.set()
        watcher.join()
        after, busy_after, clients_after = cpu_by_kind(self.proc.pid), cores_busy(), os.times()
        inference_log, web_log = self._log("inference"), self._web_since(marker)
        sizes = [int(m) for m in re.findall(r"batch: (\d+) windows", inference_log[len(inference_before) :])]
        # The uploads as the server timed them (gunicorn's access log): from the request read to
        # the answer sent, without the clients' own time on these cores.
        posts = [float(m) for m in re.findall(r'"POST /v1/jobs HTTP[^\n]*?"duration_ms": ([\d.]+)', web_log)]
        prepared = self.db.execute("select coalesce(sum(audio_duration), 0) from jobs").fetchone()[0] - audio_before
        used = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        return outcome(
            answered,
            seconds,
            (max(ends) - started) if ends else 0.0,
            accept=accept,
            accept_server_ms=posts,
            accept_cpu_ms=accept_cpu,
            web_requests=web_log.count('"duration_ms"'),
            status=status_reads,
            cpu=used,
            # the clients (this process's threads) and the machine, over the burst: what the
            # service's own CPU leaves out
            clients_cpu=(clients_after.user + clients_after.system) - (clients_before.user + clients_before.system),
            cores_busy=(busy_after[0] - busy_before[0]) / max(busy_after[1] - busy_before[1], 1.0),
            sizes=sizes,
            prepare_cpu_per_audio_s=used.get("prepare", 0.0) / max(prepared, 1.0),
        )


# --- (d): the synchronous server ------------------------------------------------------------------


def synchronous(jobs: int, seconds: float, engine: str = "whisperq") -> dict:
    """A burst against bench/sync_baseline.py running `engine` (its SYNC_ENGINE) in the request."""
    port = free_port()
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "1" if engine == "faster-whisper" else "2",
            "--worker-class",
            "gthread",
            "--threads",
            "4",
            "--timeout",
            "900",
            "bench.sync_baseline:app",
        ],
        cwd=ROOT,
        env=dict(os.environ, SYNC_ENGINE=engine),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/transcribe"
    data = CLIP.read_bytes()
    try:
        deadline = time.monotonic() + 120
        warmed = 0
        while warmed < 4:  # both processes load their model
            try:
                warmed += requests.post(url, files={"file": ("warm.opus", data)}, timeout=60).status_code == 200
            except requests.RequestException:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the synchronous server did not start") from None
                time.sleep(0.5)

        def one(n: int) -> tuple[float | None, float]:
            t = time.perf_counter()
            try:
                ok = requests.post(url, files={"file": (f"b{n}.opus", data)}, timeout=WITHIN).status_code == 200
            except requests.RequestException:  # the gateway's 60 s passed: the client has gone
                ok = False
            return (time.perf_counter() - t if ok else None), time.perf_counter()

        started = time.perf_counter()
        with ThreadPoolExecutor(jobs) as pool:
            answers = list(pool.map(one, range(jobs)))
        return outcome([t for t, _ in answers if t is not None], seconds, max(end for _, end in answers) - started)
    finally:
        stop(proc)


# --- the runs -------------------------------------------------------------------------------------


def main() -> None:
    seconds = clip_seconds()
    scripts, ceiling = Scripts(), Ceiling()
    script_ways = list(scripts.ways)
    ways: dict[str, Callable[[int], dict]] = {
        name: (lambda n, name=name: scripts.burst(name, n, seconds)) for name in script_ways
    }
    ceiling_way = f"(b) the engine in one process, {ceiling.parallel} x {ceiling.size} windows at once"
    ways[ceiling_way] = lambda n: ceiling.burst(n, seconds)
    service_ways = {mode: f"(c) the service (`whisperq run`), clients {mode}" for mode in MODES}
    sync_way = "(d) synchronous server, clients gone after 60 s"
    sync_fw_way = "(d′) synchronous server as whisper-asr-webservice runs faster-whisper, clients gone after 60 s"
    runs: list[dict] = []
    for run in range(KNOBS.runs):
        order = KNOBS.jobs if run % 2 == 0 else tuple(reversed(KNOBS.jobs))
        results: dict[str, dict[int, dict]] = {}
        local = list(ways.items()) if run % 2 == 0 else list(reversed(ways.items()))
        for jobs in order:
            for name, burst in local:
                results.setdefault(name, {})[jobs] = burst(jobs)
                print(
                    f"run {run + 1}/{KNOBS.runs}, {jobs} uploads: {name}: {results[name][jobs]['rate']:.1f} audio-s/s",
                    file=sys.stderr,
                    flush=True,
                )
        with running_service("whisperq-load-") as (proc, base, tmp):
            service = Service(proc, base, tmp)
            for jobs in order:
                for mode in MODES if run % 2 == 0 else tuple(reversed(MODES)):
                    results.setdefault(service_ways[mode], {})[jobs] = service.burst(jobs, mode, seconds)
                    print(
                        f"run {run + 1}/{KNOBS.runs}, {jobs} uploads: {service_ways[mode]}: "
                        f"{results[service_ways[mode]][jobs]['rate']:.1f} audio-s/s",
                        file=sys.stderr,
                        flush=True,
                    )
            results["door"] = {"serial_upload_cpu_ms": service.serial_uploads()}  # after the bursts
        for jobs in order:
            results.setdefault(sync_way, {})[jobs] = synchronous(jobs, seconds)
            results.setdefault(sync_fw_way, {})[jobs] = synchronous(jobs, seconds, "faster-whisper")
        runs.append(results)
    report(
        runs,
        seconds,
        [w for w in script_ways if w != scripts.own] + [scripts.own],
        [ceiling_way] + [service_ways[m] for m in MODES] + [sync_way, sync_fw_way],
        scripts.cores,
    )


def report(runs: list[dict], seconds: float, script_ways: list[str], other_ways: list[str], cores: int) -> None:
    def median(name: str, jobs: int, key: str) -> float:
        return statistics.median(r[name][jobs][key] for r in runs)

    table: list[dict] = []
    print(
        f"Bursts of {', '.join(map(str, KNOBS.jobs))} uploads of the {seconds:.1f} s clip, sent at once; "
        f"{cores} cores; median of {KNOBS.runs} run(s)\n"
    )
    print(
        "| way | uploads | audio-s/s | vs (a′) | vs (a″) | vs (b) | answered within 60 s | latency p50 | latency p99 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    own = script_ways[-1]  # (a″)
    for jobs in KNOBS.jobs:
        loops = script_ways[1:-1]
        fastest = max(loops, key=lambda name: median(name, jobs, "rate"))
        base, decoder = median(fastest, jobs, "rate"), median(own, jobs, "rate")
        ceiling = median(other_ways[0], jobs, "rate")  # (b)
        rows = [(script_ways[0], script_ways[0])] + [
            (name, f"(a′) {name}" if name == fastest else f"(also tried for (a′)) {name}") for name in loops
        ]
        rows += [(own, own)] + [(name, name) for name in other_ways]
        for name, label in rows:
            rate = median(name, jobs, "rate")
            row = {
                "way": label,
                "uploads": jobs,
                "audio_s_per_s": rate,
                "vs_a_prime": rate / base,
                "vs_a_second": rate / decoder,
                "vs_b": rate / ceiling,
                "answered_within_60s": median(name, jobs, "within"),
                "p50_s": median(name, jobs, "p50"),
                "p99_s": median(name, jobs, "p99"),
            }
            table.append(row)
            print(
                f"| {label} | {jobs} | {rate:.1f} | {rate / base:.2f}× | {rate / decoder:.2f}× | {rate / ceiling:.2f}× "
                f"| {row['answered_within_60s']:.0f}/{jobs} | "
                f"{row['p50_s']:.1f} s | {row['p99_s']:.1f} s |"
            )
    print()
    for jobs in KNOBS.jobs:
        for name in (w for w in other_ways if w.startswith("(c)")):
            last = runs[-1][name][jobs]
            total = sum(last["cpu"].values()) or 1.0
            print(
                f"- {name}, {jobs} uploads (last run): accept p50 {pct(last['accept'], 0.5) * 1000:.0f} ms, "
                f"p99 {pct(last['accept'], 0.99) * 1000:.0f} ms "
                f"(server: p50 {pct(last['accept_server_ms'], 0.5):.0f} ms, "
                f"p99 {pct(last['accept_server_ms'], 0.99):.0f} ms; web CPU per upload p50 "
                f"{pct(last['accept_cpu_ms'], 0.5):.1f} ms, p99 {pct(last['accept_cpu_ms'], 0.99):.1f} ms); "
                f"status reads p50 "
                f"{pct(last['status'], 0.5) * 1000:.1f} ms, p99 {pct(last['status'], 0.99) * 1000:.1f} ms "
                f"({len(last['status'])}); {last.get('web_requests', 0)} requests answered by the web; CPU "
                + ", ".join(
                    f"{k} {v:.1f} s ({v / total:.0%})" for k, v in sorted(last["cpu"].items(), key=lambda kv: -kv[1])
                )
                + f"; the clients {last['clients_cpu']:.1f} s; the cores {last['cores_busy']:.0%} busy"
                + f"; batch sizes mean {statistics.mean(last['sizes'] or [0]):.2f} ({len(last['sizes'])} batches); "
                f"prepare {last['prepare_cpu_per_audio_s'] * 1000:.1f} ms CPU per audio-s"
            )
    alone = [pct(r["door"]["serial_upload_cpu_ms"], 0.5) for r in runs if "door" in r]
    if alone:
        print(
            f"- an upload alone (10 one at a time after the bursts, the median run's p50): web CPU "
            f"{statistics.median(alone):.1f} ms (a burst's per-upload figures above count other requests' CPU too)"
        )
    if set(MODES) == {"poll", "longpoll"}:
        poll, longpoll = (next(w for w in other_ways if w.endswith(f"clients {m}")) for m in ("poll", "longpoll"))
        sync, sync_fw = other_ways[-2:]
        for jobs in KNOBS.jobs:
            within = {name: median(name, jobs, "within") for name in (poll, longpoll, sync, sync_fw)}
            print(
                f"- {jobs} uploads: naive polling keeps "
                f"{median(poll, jobs, 'rate') / max(median(longpoll, jobs, 'rate'), 1e-9):.0%} of the long-poll's "
                f"throughput; answered within 60 s: polling {within[poll]:.0f}, long-poll {within[longpoll]:.0f}, "
                f"the synchronous servers {within[sync]:.0f} (d) and {within[sync_fw]:.0f} (d′, as "
                f"whisper-asr-webservice runs faster-whisper; polling answers "
                f"{within[poll] / max(within[sync_fw], 1):.1f}x and "
                f"long-poll {within[longpoll] / max(within[sync_fw], 1):.1f}x its answers)"
            )
    path = results.save(
        "load",
        {
            "clip": CLIP.name,
            "clip_seconds": seconds,
            "cores": cores,
            "jobs": KNOBS.jobs,
            "runs": KNOBS.runs,
            "modes": MODES,
            "table": table,
            "every_run": runs,
        },
        kept=KNOBS.jobs == (60, 200) and KNOBS.runs >= 3 and set(MODES) == {"poll", "longpoll"},
    )
    print(f"\nevery run's numbers: {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
