"""Benchmark: the engine's throughput by batch size and by how many batches run at once.

The same workload — --jobs / BENCH_JOBS jobs of the 9.4 s clip (default 40), all waiting at once — goes through
the real Batcher and engine in one process, as the inference pool runs them: one batch at
a time on every core, or one batch per core side by side, each on one thread
(CTranslate2's workers). Reports audio-seconds per wall-second, the median of --runs /
BENCH_RUNS runs (default 3), configurations interleaved run by run so drift on a noisy machine
hits them alike. Run with `make bench` (or `make bench-batching`):

    BENCH_JOBS=40 BENCH_RUNS=3 python bench/batching.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import knobs  # noqa: E402

from config import Settings  # noqa: E402
from models.registry.catalog import model_path  # noqa: E402
from models.speech import audio  # noqa: E402
from models.speech.batching import Batcher  # noqa: E402
from models.speech.engines import FasterWhisperEngine, usable_cores  # noqa: E402
from models.speech.windows import split_windows  # noqa: E402

KNOBS = knobs.read(__doc__, "40", runs=3)
RUNS, JOBS = KNOBS.runs, KNOBS.size
CLIP = ROOT / "tests" / "fixtures" / "report.opus"


def main() -> None:
    settings = Settings.from_env({})
    cores = usable_cores()
    samples = audio.decode(CLIP)
    chunks = [(w.samples(samples), w.time_map()) for w in split_windows(samples)]
    seconds = JOBS * len(samples) / audio.SAMPLE_RATE
    # (threads per batch, batches at once, windows per batch)
    configs = [(cores, 1, size) for size in (1, 2, 4, 8)] + [(1, cores, size) for size in (1, 2, 4, 8)]
    engines = {}
    for threads, parallel, _size in configs:
        if (threads, parallel) not in engines:
            engine = FasterWhisperEngine(
                model_path(settings), cpu_threads=threads, beam_size=settings.beam_size, workers=parallel
            )
            engine.transcribe_batch([c[0] for c in chunks], [c[1] for c in chunks], "en")  # warm
            engines[threads, parallel] = engine
    rates: dict[tuple, list[float]] = {c: [] for c in configs}
    for _run in range(RUNS):
        for threads, parallel, size in configs:
            engine = engines[threads, parallel]
            batcher = Batcher(
                lambda key, ps, e=engine: e.transcribe_batch([p[0] for p in ps], [p[1] for p in ps], key),
                max_batch=size,
                max_wait=0.05,
                parallel=parallel,
            )
            started = time.perf_counter()
            futures = [f for _ in range(JOBS) for f in batcher.submit("en", chunks)]
            for f in futures:
                f.result()
            rates[threads, parallel, size].append(seconds / (time.perf_counter() - started))
            batcher.close()
    base = statistics.median(rates[cores, 1, 1])
    print(
        f"{JOBS} jobs of the {len(samples) / audio.SAMPLE_RATE:.1f} s clip, {cores} cores, "
        f"beam {settings.beam_size}, int8, median of {RUNS} runs\n"
    )
    print("| batches at once × threads each | windows per batch | audio-s per wall-s | vs one window on every core |")
    print("|---|---|---|---|")
    for threads, parallel, size in configs:
        rate = statistics.median(rates[threads, parallel, size])
        print(f"| {parallel} × {threads} | {size} | {rate:.1f} | {rate / base:.2f}× |")


if __name__ == "__main__":
    main()
