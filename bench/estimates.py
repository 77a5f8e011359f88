"""Benchmark: how right the job estimates are. The whole service (`whisperq run`) is warmed
up, then takes a burst of uploads of different lengths at once; each job's
`estimated_finish_at` is read as the client first sees it (the 202) and once more when it
is halfway up the queue, and compared with when it really finished.

Reported: the median and 90th percentile of the error (estimate − actual, in seconds and
as a share of the job's real time in the service), and the share of jobs that finished
before their estimate. Run with `make bench-estimates`; results go in the README.

    BENCH_JOBS=40 python bench/estimates.py
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
CLIPS = [ROOT / "tests" / "fixtures" / name for name in ("fox.flac", "report.opus", "harbour.opus", "pauses.opus")]
JOBS = int(os.environ.get("BENCH_JOBS", "40"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service import running_service  # noqa: E402


def when(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def submit(base: str, clip: Path) -> tuple[float, dict]:
    with clip.open("rb") as fh:
        resp = requests.post(f"{base}/v1/jobs", files={"file": (clip.name, fh)}, timeout=60)
    resp.raise_for_status()
    return time.time(), resp.json()


def summary(name: str, errors: list[float], shares: list[float]) -> str:
    def q(values, p):
        values = sorted(values)
        return values[min(len(values) - 1, int(p * len(values)))]

    absolute = [abs(e) for e in errors]
    early = sum(1 for e in errors if e >= 0) / len(errors)
    return (f"{name:<22} n={len(errors):3d}  |error| median {statistics.median(absolute):6.1f} s, p90 {q(absolute, 0.9):6.1f} s;"
            f"  relative median {statistics.median(shares):5.0%}, p90 {q(shares, 0.9):5.0%};"
            f"  finished by the estimate {early:4.0%}")


def main() -> None:
    with running_service("whisperq-estimates-") as (_proc, base, _tmp):
        for clip in CLIPS:  # the service measures its speed from finished jobs
            _at, job = submit(base, clip)
            while requests.get(job["status_url"], timeout=10).json()["status"] not in ("COMPLETED", "FAILED"):
                time.sleep(0.3)
        with ThreadPoolExecutor(8) as pool:
            sent = list(pool.map(lambda n: submit(base, CLIPS[n % len(CLIPS)]), range(JOBS)))
        first = {job["job_id"]: (at, when(job.get("estimated_finish_at"))) for at, job in sent}
        halfway, finished = {}, {}
        while len(finished) < len(first):
            for job_id in [j for j in first if j not in finished]:
                job = requests.get(f"{base}/v1/jobs/{job_id}", timeout=10).json()
                if job["status"] in ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED"):
                    finished[job_id] = when(job["finished_at"])
                elif job_id not in halfway and job.get("queue_position") is not None \
                        and job["queue_position"] <= JOBS // 4 and job.get("estimated_finish_at"):
                    halfway[job_id] = (time.time(), when(job["estimated_finish_at"]))
            time.sleep(0.5)
    for name, estimates in (("at submission", first), ("a quarter from the head", halfway)):
        errors, shares = [], []
        for job_id, (at, estimate) in estimates.items():
            if estimate is None:
                continue
            actual = finished[job_id]
            errors.append(estimate - actual)
            shares.append(abs(estimate - actual) / max(actual - at, 1.0))
        if errors:
            print(summary(name, errors, shares))
    total = max(finished.values()) - min(at for at, _ in first.values())
    print(f"{JOBS} jobs ({', '.join(c.name for c in CLIPS)} in turn) drained in {total:.0f} s")


if __name__ == "__main__":
    main()
