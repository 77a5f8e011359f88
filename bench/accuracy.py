"""Benchmark: accuracy on long recordings, the service beside faster-whisper's own pipelines.

For each recording of the evaluation set (bench/recordings/, made by bench/make_recordings.py
from texts of our own with flite and sox, plus the test clips and the test suite's long
recording), the word error rate of:

- (a) faster-whisper's `WhisperModel.transcribe` (sequential, beam 5, its defaults);
- (b) faster-whisper's `BatchedInferencePipeline.transcribe` (batch 8, beam 5);
- (c) the service: `whisperq run` as `make run` starts it, every recording uploaded at once
  through the API, so windows of several jobs share batches;

the same model (WHISPERQ_MODEL, else the bundled tiny.en) and samples in one run. Texts are
normalised the same way for all (OpenAI's English normaliser: case, punctuation, numbers,
spelling). For `pauses`, whose sentence start times are known, the table also gives the
worst distance between a sentence's start and the nearest cue start of (c), to show the
subtitles' timing.

--jobs / BENCH_JOBS takes the N shortest recordings (default 9: all of them). (a) and (b)
run once: the same call on the same samples in one process gives the same words. (c) runs
--runs / BENCH_RUNS times (default 3), each on a fresh service, and the table gives each
recording's median: which windows share a batch changes from run to run. Run with
`make bench-accuracy`; the table goes in docs/performance.md:

    BENCH_JOBS=9 BENCH_RUNS=3 python bench/accuracy.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = ROOT / "bench" / "recordings"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import knobs  # noqa: E402
from helpers import CLIPS, long_recording, word_error_rate, write_wav  # noqa: E402
from service import running_service, submit_recordings, wait_finished  # noqa: E402


def evaluation_set(tmp: Path, count: int | None = None) -> dict[str, dict]:
    """name -> {"path", "text", "seconds", optional "sentence_starts"}: the `count` shortest, or all."""
    from models.speech import audio

    made = json.loads((RECORDINGS / "recordings.json").read_text())
    items = {name: dict(meta, path=ROOT / meta["file"], seconds=meta["duration"]) for name, meta in made.items()}
    for name in ("fox.flac", "report.opus"):
        seconds = len(audio.decode(CLIPS[name]["path"])) / audio.SAMPLE_RATE
        items[name] = {"path": CLIPS[name]["path"], "text": CLIPS[name]["text"], "seconds": seconds}
    samples, text = long_recording(repeats=4)
    items["long_recording(4)"] = {
        "path": write_wav(tmp / "long4.wav", samples),
        "text": text,
        "seconds": len(samples) / audio.SAMPLE_RATE,
    }
    kept = sorted(items, key=lambda name: items[name]["seconds"])[:count]
    return {name: item for name, item in items.items() if name in kept}


def through_service(items: dict[str, dict]) -> dict[str, dict]:
    """Each recording's result from the running service, all submitted at once."""
    with running_service() as (_proc, base, _data):
        jobs = submit_recordings(base, items)
        finished = wait_finished(base, list(jobs.values()))
    failed = {
        name: finished[job_id].get("error")
        for name, job_id in jobs.items()
        if finished[job_id]["status"] != "COMPLETED"
    }
    if failed:
        raise RuntimeError(f"jobs that did not complete: {failed}")
    return {name: finished[job_id]["result"] for name, job_id in jobs.items()}


def worst_cue_offset(starts: list[float], segments: list[dict]) -> float:
    cues = [s["start"] for s in segments]
    return max(min(abs(c - t) for c in cues) for t in starts)


def main() -> None:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from config import Settings
    from models.registry.catalog import model_path
    from models.speech import audio
    from models.speech.engines import resolve_device

    knob = knobs.read(__doc__, "9", runs=3, what="recordings (the shortest)")
    settings = Settings.from_env()
    device, compute_type = resolve_device(settings.device, settings.compute_type)
    model = WhisperModel(
        model_path(settings), device=device, compute_type=compute_type, cpu_threads=settings.cpu_threads
    )
    pipeline = BatchedInferencePipeline(model)
    beam = settings.beam_size
    with tempfile.TemporaryDirectory() as tmpdir:
        items = evaluation_set(Path(tmpdir), knob.size)
        rows = {}
        for name, item in items.items():
            samples = audio.decode(item["path"])
            segments, _ = model.transcribe(samples, language="en", beam_size=beam)
            a = " ".join(s.text for s in segments)
            segments, _ = pipeline.transcribe(samples, language="en", beam_size=beam, batch_size=8)
            b = " ".join(s.text for s in segments)
            rows[name] = (
                len(samples) / audio.SAMPLE_RATE,
                word_error_rate(item["text"], a),
                word_error_rate(item["text"], b),
            )
            print(f"{name}: (a) {rows[name][1]:.3f} (b) {rows[name][2]:.3f}", file=sys.stderr)
        services = [through_service(items) for _ in range(knob.runs)]
    print(f"model {model_path(settings)} on {device} ({compute_type}), beam {beam}; (c) median of {knob.runs} run(s)")
    print(
        "| recording | length | (a) `WhisperModel.transcribe` | (b) `BatchedInferencePipeline` "
        "| (c) the service | (c) − (b) |"
    )
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for name, (seconds, a, b) in rows.items():
        c = statistics.median(word_error_rate(items[name]["text"], run[name]["text"]) for run in services)
        worst = max(worst, c - b)
        print(f"| {name} | {seconds:.0f} s | {a:.3f} | {b:.3f} | {c:.3f} | {c - b:+.3f} |")
    print(f"\nworst (c) − (b): {worst:+.3f}")
    for name, item in items.items():
        if item.get("sentence_starts"):
            offs = [worst_cue_offset(item["sentence_starts"], run[name]["segments"]) for run in services]
            print(
                f"{name}: every sentence starts within {statistics.median(offs):.2f} s of a cue's start (median; "
                f"{'/'.join(str(len(run[name]['segments'])) for run in services)} cues for "
                f"{len(item['sentence_starts'])} sentences)"
            )


if __name__ == "__main__":
    main()
