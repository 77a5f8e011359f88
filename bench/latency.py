"""Benchmark: upload-to-COMPLETED latency through the whole service, and the model's
real-time factor, on this machine. Run with `make bench` (or `make bench-latency`); results
go in docs/performance.md.

Each run loads the model and transcribes the 9.4 s fixture clip --jobs / BENCH_JOBS times
(default 10), then starts `whisperq run` (embedded broker, gunicorn, the pools, Flower) in a
fresh data dir and submits the same clip one job at a time, --jobs jobs after a first one that
loads the model, each followed with the long-poll (`?wait=30` with If-None-Match) until done.
Reported: the median over --runs / BENCH_RUNS runs (default 3) of each run's median.

    BENCH_JOBS=10 BENCH_RUNS=3 python bench/latency.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
CLIP = ROOT / "tests" / "fixtures" / "report.opus"

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import knobs  # noqa: E402
from service import running_service  # noqa: E402


def model_rtf(jobs: int) -> tuple[float, float, float]:
    """(load seconds, clip seconds, median seconds to transcribe the clip)."""
    from config import Settings
    from models.registry.catalog import model_path
    from models.speech import audio
    from models.speech.engines import FasterWhisperEngine

    settings = Settings.from_env({})
    started = time.perf_counter()
    engine = FasterWhisperEngine(model_path(settings), beam_size=settings.beam_size)
    load = time.perf_counter() - started
    samples = audio.decode(CLIP)
    times = []
    for _ in range(jobs):
        t = time.perf_counter()
        engine.transcribe(samples, language="en")
        times.append(time.perf_counter() - t)
    return load, len(samples) / audio.SAMPLE_RATE, statistics.median(times)


def follow(url: str) -> dict:
    """The job once finished, followed with the long-poll: the answer comes as the job changes."""
    tag = None
    while True:
        resp = requests.get(f"{url}?wait=30", headers={"If-None-Match": tag} if tag else {}, timeout=60)
        if resp.status_code == 200:
            tag = resp.headers["ETag"]
            if resp.json()["status"] in ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED"):
                return resp.json()
        elif resp.status_code != 304:
            raise RuntimeError(f"reading the job: {resp.status_code} {resp.text[:300]}")


def end_to_end(jobs: int) -> tuple[float, list[float]]:
    """(the first job's latency, the next `jobs` jobs' latencies)."""
    with running_service() as (_proc, base, _tmp):
        latencies = []
        for _ in range(jobs + 1):
            t = time.perf_counter()
            with CLIP.open("rb") as fh:
                url = requests.post(f"{base}/v1/jobs", files={"file": fh}, timeout=30).headers["Location"]
            job = follow(url)
            if job["status"] != "COMPLETED":
                raise RuntimeError(f"a job failed: {job}")
            latencies.append(time.perf_counter() - t)
        return latencies[0], latencies[1:]


def main() -> None:
    knob = knobs.read(__doc__, "10", runs=3)
    loads, models, colds, warms, warm_all = [], [], [], [], []
    for _ in range(knob.runs):
        load, seconds, median = model_rtf(knob.size)
        cold, warm = end_to_end(knob.size)
        loads.append(load)
        models.append(median)
        colds.append(cold)
        warms.append(statistics.median(warm))
        warm_all += warm
    median = statistics.median(models)
    print(f"median of {knob.runs} run(s), {knob.size} jobs each")
    print(
        f"model: load {statistics.median(loads):.2f} s; {seconds:.1f} s clip transcribed in {median:.2f} s; "
        f"real-time factor {median / seconds:.3f} ({seconds / median:.1f}x faster than real time)"
    )
    print(
        f"upload -> COMPLETED, {seconds:.1f} s clip: first job (loads the model) {statistics.median(colds):.2f} s; "
        f"then median {statistics.median(warms):.2f} s, min {min(warm_all):.2f} s, max {max(warm_all):.2f} s "
        f"over {len(warm_all)} jobs"
    )


if __name__ == "__main__":
    main()
