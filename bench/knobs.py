"""The two knobs every benchmark has, read the same way everywhere: how big one run is and how
many runs the medians are taken over. `make bench-ci` turns both down to keep every benchmark
running; the defaults are the full size the tables of docs/performance.md were measured at.

    --jobs N  (or BENCH_JOBS)  the size of one run: uploads, jobs or recordings, as the benchmark says
    --runs N  (or BENCH_RUNS)  how many runs; the tables give the median of them

A flag wins over the environment; both must be whole numbers above zero (a list of them where
the benchmark says so).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Knobs:
    jobs: tuple[int, ...]
    runs: int

    @property
    def size(self) -> int:
        """The one size, for a benchmark that takes one."""
        return self.jobs[0]


def _counts(text: str, name: str, many: bool) -> tuple[int, ...]:
    parts = [p.strip() for p in str(text).split(",")] if many else [str(text).strip()]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        shape = "whole numbers above zero, comma separated (e.g. 60,200)" if many else "a whole number above zero"
        raise SystemExit(f"{name} must be {shape}; got {text!r}")
    return values


def read(doc: str | None, jobs: str, runs: int = 3, many_jobs: bool = False, what: str = "jobs") -> Knobs:
    """Parse --jobs/--runs (defaults from BENCH_JOBS/BENCH_RUNS, else `jobs`/`runs`)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--jobs",
        default=os.environ.get("BENCH_JOBS", jobs),
        help=f"{what} in one run{' (a list: one burst each)' if many_jobs else ''} [BENCH_JOBS, default {jobs}]",
    )
    parser.add_argument(
        "--runs",
        default=os.environ.get("BENCH_RUNS", str(runs)),
        help=f"runs to take the median of [BENCH_RUNS, default {runs}]",
    )
    args = parser.parse_args()
    flag_or_env = {"jobs": "--jobs / BENCH_JOBS", "runs": "--runs / BENCH_RUNS"}
    return Knobs(
        jobs=_counts(args.jobs, flag_or_env["jobs"], many_jobs), runs=_counts(args.runs, flag_or_env["runs"], False)[0]
    )
