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
subtitles' timing. Run with `make bench-accuracy`; the table goes in the README.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
RECORDINGS = ROOT / "bench" / "recordings"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from helpers import CLIPS, long_recording, word_error_rate, write_wav  # noqa: E402
from service import running_service  # noqa: E402


def evaluation_set(tmp: Path) -> dict[str, dict]:
    """name -> {"path", "text", optional "sentence_starts"}."""
    made = json.loads((RECORDINGS / "recordings.json").read_text())
    items = {name: dict(meta, path=ROOT / meta["file"]) for name, meta in made.items()}
    for name in ("fox.flac", "report.opus"):
        items[name] = {"path": CLIPS[name]["path"], "text": CLIPS[name]["text"]}
    samples, text = long_recording(repeats=4)
    items["long_recording(4)"] = {"path": write_wav(tmp / "long4.wav", samples), "text": text}
    return items


def through_service(items: dict[str, dict]) -> dict[str, dict]:
    """Each recording's result from the running service, all submitted at once."""
    results = {}
    with running_service() as (_proc, base, _data):
        jobs = {}
        for name, item in items.items():
            with open(item["path"], "rb") as fh:
                resp = requests.post(f"{base}/v1/jobs", files={"file": (Path(item["path"]).name, fh)},
                                     data={"language": "en"}, timeout=60)
            resp.raise_for_status()
            jobs[name] = resp.json()["job_id"]
        deadline = time.monotonic() + 1800
        while jobs and time.monotonic() < deadline:
            for name, job_id in list(jobs.items()):
                job = requests.get(f"{base}/v1/jobs/{job_id}", timeout=30).json()
                if job["status"] in ("COMPLETED", "FAILED"):
                    if job["status"] == "FAILED":
                        raise RuntimeError(f"{name}: {job['error']}")
                    results[name] = job["result"]
                    del jobs[name]
            time.sleep(1.0)
        if jobs:
            raise RuntimeError(f"not finished in time: {sorted(jobs)}")
    return results


def worst_cue_offset(starts: list[float], segments: list[dict]) -> float:
    cues = [s["start"] for s in segments]
    return max(min(abs(c - t) for c in cues) for t in starts)


def main() -> None:
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from config import Settings
    from models.speech import audio
    from models.speech.catalog import model_path
    from models.speech.engines import resolve_device

    settings = Settings.from_env()
    device, compute_type = resolve_device(settings.device, settings.compute_type)
    model = WhisperModel(model_path(settings), device=device, compute_type=compute_type,
                         cpu_threads=settings.cpu_threads)
    pipeline = BatchedInferencePipeline(model)
    beam = settings.beam_size
    with tempfile.TemporaryDirectory() as tmpdir:
        items = evaluation_set(Path(tmpdir))
        rows = {}
        for name, item in items.items():
            samples = audio.decode(item["path"])
            segments, _ = model.transcribe(samples, language="en", beam_size=beam)
            a = " ".join(s.text for s in segments)
            segments, _ = pipeline.transcribe(samples, language="en", beam_size=beam, batch_size=8)
            b = " ".join(s.text for s in segments)
            rows[name] = (len(samples) / audio.SAMPLE_RATE, word_error_rate(item["text"], a),
                          word_error_rate(item["text"], b))
            print(f"{name}: (a) {rows[name][1]:.3f} (b) {rows[name][2]:.3f}", file=sys.stderr)
        service = through_service(items)
    print(f"model {model_path(settings)} on {device} ({compute_type}), beam {beam}")
    print("| recording | length | (a) `WhisperModel.transcribe` | (b) `BatchedInferencePipeline` | (c) the service | (c) − (b) |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for name, (seconds, a, b) in rows.items():
        c = word_error_rate(items[name]["text"], service[name]["text"])
        worst = max(worst, c - b)
        print(f"| {name} | {seconds:.0f} s | {a:.3f} | {b:.3f} | {c:.3f} | {c - b:+.3f} |")
    print(f"\nworst (c) − (b): {worst:+.3f}")
    for name, item in items.items():
        if item.get("sentence_starts"):
            off = worst_cue_offset(item["sentence_starts"], service[name]["segments"])
            print(f"{name}: every sentence starts within {off:.2f} s of a cue's start "
                  f"({len(service[name]['segments'])} cues for {len(item['sentence_starts'])} sentences)")


if __name__ == "__main__":
    main()
