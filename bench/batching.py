"""Benchmark: throughput of cross-job batching, batch size 1 vs 4 vs 8.

The same workload — 16 jobs (8 × the 9.4 s clip, 8 × the 4.3 s clip) all waiting at
once — goes through the real Batcher and engine, one thread per job as in the inference
pool. Sizes are interleaved run by run so drift on a noisy machine hits them alike.
Reports audio-seconds per wall-second, median of BENCH_RUNS runs, and the ratio to
batch size 1. Run with `make bench`.
"""
from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from config import Settings  # noqa: E402
from models import audio  # noqa: E402
from models.batching import Batcher  # noqa: E402
from models.speech import FasterWhisperEngine, model_path  # noqa: E402
from models.windows import split_windows  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
SIZES = [int(s) for s in os.environ.get("BENCH_SIZES", "1,4,8").split(",")]
FIXTURES = ROOT / "tests" / "fixtures"


def workload():
    clips = [audio.decode(FIXTURES / "report.opus"), audio.decode(FIXTURES / "fox.flac")]
    return [clips[i % 2] for i in range(16)]


def drain(engine: FasterWhisperEngine, jobs, batch_size: int, wait_ms: int = 50) -> tuple[float, list[int]]:
    batcher = Batcher(lambda key, ps: engine.transcribe_batch([p[0] for p in ps], [p[1] for p in ps], key),
                      max_batch=batch_size, max_wait=wait_ms / 1000)
    results: list = []

    def one_job(samples):
        futures = batcher.submit("en", [(w.samples(samples), w.time_map()) for w in split_windows(samples)])
        results.append([f.result() for f in futures])

    threads = [threading.Thread(target=one_job, args=(j,)) for j in jobs]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    sizes = [r.size for r in batcher.records]
    batcher.close()
    assert len(results) == len(jobs)
    return elapsed, sizes


def main() -> None:
    settings = Settings.from_env()  # WHISPERQ_BEAM_SIZE, WHISPERQ_DEVICE, ... apply
    engine = FasterWhisperEngine(model_path(settings), device=settings.device, compute_type=settings.compute_type,
                                 beam_size=settings.beam_size)
    jobs = workload()
    seconds = sum(len(j) for j in jobs) / audio.SAMPLE_RATE
    drain(engine, jobs[:2], 2)  # warm up
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    seen: dict[int, list[int]] = {n: [] for n in SIZES}
    for _ in range(RUNS):
        for n in SIZES:
            elapsed, sizes = drain(engine, jobs, n)
            times[n].append(elapsed)
            seen[n] = sizes
    base = seconds / statistics.median(times[SIZES[0]])
    print(f"device {engine.device} ({engine.compute_type}), beam {engine.beam_size}, {len(jobs)} jobs, {seconds:.1f} s of audio, "
          f"median of {RUNS} runs")
    print("| batch size | wall time (s) | audio-s per wall-s | vs batch 1 | batch sizes seen |")
    print("|---|---|---|---|---|")
    for n in SIZES:
        wall = statistics.median(times[n])
        print(f"| {n} | {wall:.2f} | {seconds / wall:.1f} | {seconds / wall / base:.2f}x | {sorted(seen[n], reverse=True)} |")


if __name__ == "__main__":
    main()
