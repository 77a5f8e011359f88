"""Benchmark: faster-whisper vs openai-whisper, same model, same audio, same machine.

Both engines run the bundled tiny.en (faster-whisper from the CTranslate2 directory,
openai-whisper from it converted by `whisperq convert-model`), through their
`transcribe_batch`, as the inference pool's batcher calls them:

- clips: the two fixture clips, --jobs / BENCH_JOBS times each (default 4: 8 windows,
  54.8 s of audio);
- long: tests/helpers.long_recording (report, fox, pauses, one time fewer than the clips,
  at least once: 3 times over by default; cut into windows in silences, as a worker cuts it).

For each engine, batch size (BENCH_SIZES, default 1 and 8) and beam size (BENCH_BEAMS,
default 5 and 1): audio-seconds per wall-second, median of --runs / BENCH_RUNS runs (default
3), the configurations interleaved run by run so drift on a noisy machine hits them alike.
Device and compute type follow WHISPERQ_DEVICE / WHISPERQ_COMPUTE_TYPE (CPU: int8 for
faster-whisper, float32 for openai-whisper). Needs the openai-whisper extra (see .ci/run).
Run with `make bench-engines`:

    BENCH_JOBS=4 BENCH_RUNS=3 python bench/engines.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import knobs  # noqa: E402
from helpers import CLIPS, long_recording, word_error_rate  # noqa: E402

from config import Settings  # noqa: E402
from models.speech import audio  # noqa: E402
from models.speech.engines import FasterWhisperEngine, bundled_model_path  # noqa: E402
from models.speech.windows import split_windows  # noqa: E402

KNOBS = knobs.read(__doc__, "4", runs=3, what="times each clip")
RUNS = KNOBS.runs
SIZES = [int(s) for s in os.environ.get("BENCH_SIZES", "1,8").split(",")]
BEAMS = [int(s) for s in os.environ.get("BENCH_BEAMS", "5,1").split(",")]


def workloads() -> dict[str, tuple[list, str]]:
    """name -> ([(window samples, offset)], reference text)."""
    fox, report = (audio.decode(CLIPS[n]["path"]) for n in ("fox.flac", "report.opus"))
    clips = [(report, 0.0), (fox, 0.0)] * KNOBS.size
    clips_text = " ".join([CLIPS["report.opus"]["text"], CLIPS["fox.flac"]["text"]] * KNOBS.size)
    samples, long_text = long_recording(repeats=max(1, KNOBS.size - 1))
    long = [(w.samples(samples), w.time_map()) for w in split_windows(samples)]
    return {"clips": (clips, clips_text), "long": (long, long_text)}


def run(engine, windows, batch_size: int) -> tuple[float, str]:
    started = time.perf_counter()
    texts = []
    for i in range(0, len(windows), batch_size):
        group = windows[i : i + batch_size]
        for segments in engine.transcribe_batch([w for w, _ in group], [o for _, o in group], "en"):
            texts.extend(s.text for s in segments)
    return time.perf_counter() - started, " ".join(texts)


def main() -> None:
    from models.speech.convert import convert
    from models.speech.openai_engine import OpenAIWhisperEngine

    settings = Settings.from_env()
    checkpoint = Path(tempfile.mkdtemp(prefix="whisperq-bench-")) / "tiny.en.pt"
    convert(bundled_model_path(), checkpoint)
    engines = {}
    for beam in BEAMS:
        engines[("faster-whisper", beam)] = FasterWhisperEngine(
            bundled_model_path(),
            device=settings.device,
            compute_type=settings.compute_type,
            cpu_threads=settings.cpu_threads,
            beam_size=beam,
        )
        engines[("openai-whisper", beam)] = OpenAIWhisperEngine(
            str(checkpoint),
            device=settings.device,
            compute_type=settings.compute_type,
            cpu_threads=settings.cpu_threads,
            beam_size=beam,
        )
    loads = workloads()
    for engine in engines.values():  # warm up: first calls allocate and pick kernels
        run(engine, loads["clips"][0][:2], 2)
    times: dict[tuple, list[float]] = {}
    wers: dict[tuple, float] = {}
    for _ in range(RUNS):
        for load, (windows, text) in loads.items():
            for (name, beam), engine in engines.items():
                for size in SIZES:
                    elapsed, said = run(engine, windows, size)
                    times.setdefault((load, name, beam, size), []).append(elapsed)
                    wers[(load, name, beam, size)] = word_error_rate(text, said)
    some = next(iter(engines.values()))
    print(
        f"device {some.device}; faster-whisper {engines[('faster-whisper', BEAMS[0])].compute_type}, "
        f"openai-whisper {engines[('openai-whisper', BEAMS[0])].compute_type}; median of {RUNS} runs"
    )
    print(
        "| audio | beam | batch | faster-whisper: wall s | audio-s / wall-s | openai-whisper: wall s | "
        "audio-s / wall-s | faster ÷ openai | WER fw / ow |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for load, (windows, _text) in loads.items():
        seconds = sum(len(w) for w, _ in windows) / audio.SAMPLE_RATE
        for beam in BEAMS:
            for size in SIZES:
                fw = statistics.median(times[(load, "faster-whisper", beam, size)])
                ow = statistics.median(times[(load, "openai-whisper", beam, size)])
                print(
                    f"| {load} ({len(windows)} windows, {seconds:.1f} s) | {beam} | {size} | {fw:.2f} | "
                    f"{seconds / fw:.1f} | {ow:.2f} | {seconds / ow:.1f} | {ow / fw:.2f}x | "
                    f"{wers[(load, 'faster-whisper', beam, size)]:.2f} / "
                    f"{wers[(load, 'openai-whisper', beam, size)]:.2f} |"
                )


if __name__ == "__main__":
    main()
