"""Shadow agreement: how far base's transcripts are from tiny.en's on the evaluation set, as
`whisperq models compare` reports it, and each model's own word error rate against the text.

Starts `whisperq run` (one inference process serving both models) with every tiny.en job
shadowed by base (WHISPERQ_SHADOW="tiny.en=base:100"), submits the recordings of
bench/accuracy.py (--jobs / BENCH_JOBS: the N shortest, default 9: all), waits for the jobs
and their shadow transcripts, and prints both: per recording the median over --runs /
BENCH_RUNS runs (default 3), each on a fresh service, and the last run's `models compare`.
Needs the base-model extra. `make bench-shadow`:

    BENCH_JOBS=9 BENCH_RUNS=3 python bench/shadow.py
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parent / "tests"), str(HERE)]

import knobs  # noqa: E402
from accuracy import evaluation_set  # noqa: E402
from helpers import word_error_rate  # noqa: E402
from service import running_service, submit_recordings, wait_finished  # noqa: E402

ENV = {"WHISPERQ_MODELS": "tiny.en=bundled:tiny.en, base=bundled:base", "WHISPERQ_SHADOW": "tiny.en=base:100"}


def one_run(items: dict[str, dict]) -> tuple[dict[str, tuple[float, float, float]], str]:
    """recording -> (tiny.en's WER, base's WER, base vs tiny.en), and `whisperq models compare`."""
    with running_service("whisperq-shadow-", ENV) as (_proc, base, data):
        started = time.monotonic()
        jobs = submit_recordings(base, items)
        results = wait_finished(base, list(jobs.values()))
        # The shadows run at low priority, after the jobs; base decodes about 3x slower than tiny.en.
        deadline = time.monotonic() + max(120.0, 4 * (time.monotonic() - started))
        env = dict(os.environ, WHISPERQ_DATA_DIR=str(data), **ENV)
        env.pop("DATABASE_URL", None)
        while True:
            compare = subprocess.run(
                [str(Path(sys.executable).parent / "whisperq"), "models", "compare"],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            rows = [json.loads(line) for line in compare.splitlines() if line.startswith("{")]
            if sum(r.get("jobs", 0) for r in rows) >= len(jobs) and not any("waiting_for_primary" in r for r in rows):
                break
            if time.monotonic() > deadline:
                have = _shadows(env, jobs)
                missing = [name for name, job_id in jobs.items() if job_id not in have]
                why = f"no shadow transcript of {', '.join(missing)}" if missing else "not every shadow was compared"
                raise RuntimeError(f"{why} by the deadline after the jobs finished; see {data / 'run.log'}")
            time.sleep(2.0)
        shadows = _shadows(env, jobs)
    out = {}
    for name, job_id in jobs.items():
        text, job, shadow = items[name]["text"], results[job_id], shadows.get(job_id)
        tiny = word_error_rate(text, job["result"]["text"]) if job["status"] == "COMPLETED" else math.nan
        base_wer = word_error_rate(text, shadow[0]) if shadow else math.nan
        agreement = shadow[1] if shadow and shadow[1] is not None else math.nan
        out[name] = (tiny, base_wer, agreement)
    return out, compare


def main() -> None:
    knob = knobs.read(__doc__, "9", runs=3, what="recordings (the shortest)")
    with tempfile.TemporaryDirectory() as tmp:
        items = evaluation_set(Path(tmp), knob.size)
        runs = [one_run(items) for _ in range(knob.runs)]
    print(f"median of {knob.runs} run(s)")
    print(f"{'recording':24} {'tiny.en WER':>12} {'base WER':>9} {'base vs tiny.en':>16}")
    for name in items:
        tiny, base_wer, agreement = (statistics.median(run[name][i] for run, _ in runs) for i in range(3))
        print(f"{name:24} {tiny:12.3f} {base_wer:9.3f} {agreement:16.3f}")
    print("\nwhisperq models compare (the last run):\n" + runs[-1][1])


def _shadows(env: dict, jobs: dict[str, str]) -> dict[str, tuple[str, float | None]]:
    """job id -> (base's transcript, its WER against tiny.en's), read as an operator would."""
    code = (
        "import json, sys\n"
        "from models.runtime import get_runtime\n"
        "from models.jobs.shadows import ShadowResult\n"
        "rt = get_runtime()\n"
        "with rt.db.session() as s:\n"
        "    rows = s.query(ShadowResult).filter(ShadowResult.job_id.in_(json.loads(sys.argv[1]))).all()\n"
        "    print(json.dumps({r.job_id: [r.text, r.wer] for r in rows}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(jobs.values()))],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=HERE.parent,
    ).stdout
    return {k: tuple(v) for k, v in json.loads(out.strip().splitlines()[-1]).items()}


if __name__ == "__main__":
    main()
