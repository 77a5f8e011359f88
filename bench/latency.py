"""Benchmark: upload-to-COMPLETED latency through the whole service, and the model's
real-time factor, on this machine. Run with `make bench`; results go in the README.

It starts `whisperq run` (embedded broker, gunicorn, one prefork worker, Flower) in a
temporary data dir, submits the 9.4 s fixture clip one job at a time, and reports medians.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
CLIP = ROOT / "tests" / "fixtures" / "report.opus"
RUNS = int(os.environ.get("BENCH_RUNS", "10"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import running_service  # noqa: E402


def model_rtf() -> tuple[float, float, float]:
    sys.path.insert(0, str(ROOT))
    from config import Settings
    from models.speech import audio
    from models.speech.catalog import model_path
    from models.speech.engines import FasterWhisperEngine

    settings = Settings.from_env({})
    started = time.perf_counter()
    engine = FasterWhisperEngine(model_path(settings), beam_size=settings.beam_size)
    load = time.perf_counter() - started
    samples = audio.decode(CLIP)
    seconds = len(samples) / audio.SAMPLE_RATE
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        engine.transcribe(samples, language="en")
        times.append(time.perf_counter() - t)
    return load, seconds, statistics.median(times)


def end_to_end() -> tuple[float, list[float]]:
    with running_service() as (_proc, base, _tmp):
        latencies = []
        for _ in range(RUNS + 1):
            t = time.perf_counter()
            with CLIP.open("rb") as fh:
                url = requests.post(f"{base}/v1/jobs", files={"file": fh}, timeout=30).headers["Location"]
            while (job := requests.get(url, timeout=5).json())["status"] not in ("COMPLETED", "FAILED"):
                time.sleep(0.05)
            assert job["status"] == "COMPLETED", job
            latencies.append(time.perf_counter() - t)
        return latencies[0], latencies[1:]


if __name__ == "__main__":
    load, seconds, median = model_rtf()
    print(f"model: load {load:.2f} s; {seconds:.1f} s clip transcribed in {median:.2f} s (median of {RUNS}); "
          f"real-time factor {median / seconds:.3f} ({seconds / median:.1f}x faster than real time)")
    cold, warm = end_to_end()
    print(f"upload -> COMPLETED, {seconds:.1f} s clip: first job (loads the model) {cold:.2f} s; "
          f"then median {statistics.median(warm):.2f} s, min {min(warm):.2f} s, max {max(warm):.2f} s over {len(warm)} jobs")
