"""Where a benchmark's raw results go: a JSON file with the commit, the date and the machine
beside the numbers, so a table can be traced to what produced it.

A run at the size a benchmark's table in the docs is measured at (`kept=True`) writes
bench/results/<name>.json, which is kept in the repository; any other run (CI's tiny ones)
writes var/bench/<name>.json. `python bench/results.py` lists what is kept, with its commit
and date.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEPT = ROOT / "bench" / "results"
SCRATCH = ROOT / "var" / "bench"


def commit() -> str:
    """The commit the run measured, `+dirty` when the working tree had changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine() -> dict[str, Any]:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = None
    with contextlib.suppress(ValueError, OSError):
        memory = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": memory,
        "system": platform.platform(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
    }


def save(name: str, data: dict[str, Any], kept: bool) -> Path:
    """Write `data` with its provenance; the path written."""
    path = (KEPT if kept else SCRATCH) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": name,
        "commit": commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        **data,
    }
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return path


def main() -> None:
    for path in sorted(KEPT.glob("*.json")):
        record = json.loads(path.read_text())
        print(f"{path.relative_to(ROOT)}: commit {record.get('commit')}, {record.get('date')}, {record.get('command')}")


if __name__ == "__main__":
    main()
