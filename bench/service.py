"""Starting and stopping the whole service (`whisperq run`) for the benchmarks, and the CPU its
processes use."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu() -> tuple[dict[int, list[int]], dict[int, float]]:
    """Every process's children, and the CPU seconds each has used so far (/proc: its own,
    user and system, not its reaped children's)."""
    children: dict[int, list[int]] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            used[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    return children, used


def below(root: int, children: dict[int, list[int]]) -> Iterator[int]:
    """`root` and every process below it (`children` as process_cpu gives them)."""
    todo = [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        yield pid


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, timeout: float = 90) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def running_service(
    prefix: str = "whisperq-bench-", env_extra: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen, str, Path]]:
    """`whisperq run` on the embedded broker in a fresh data dir, ready: (process, base URL, data dir)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "DATABASE_URL")}
    env.update(
        WHISPERQ_DATA_DIR=str(tmp),
        PORT=str(port),
        FLOWER_PORT=str(free_port()),
        WHISPERQ_GRPC_PORT=str(free_port()),
        **(env_extra or {}),
    )
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "whisperq"), "run"],
        env=env,
        stdout=(tmp / "run.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _serving(base):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the service did not get ready; see {tmp / 'run.log'}")
            time.sleep(0.2)
        yield proc, base, tmp
    finally:
        stop(proc)


def _serving(base: str) -> bool:
    """Ready, and every model it serves has a live inference worker. /readyz answers 200 during
    the workers' start-up grace already; a job prepared before a model's first heartbeat is not
    shadowed (docs/models.md), and a benchmark measures the service running, not starting."""
    try:
        resp = requests.get(f"{base}/readyz", timeout=2)
    except requests.RequestException:
        return False
    return resp.status_code == 200 and all(n > 0 for n in resp.json().get("models", {"?": 0}).values())


FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "EXPIRED")


def submit_recordings(base: str, items: dict[str, dict]) -> dict[str, str]:
    """name -> job id: each recording (`{"path": ...}`) uploaded to the service, in English."""
    jobs = {}
    for name, item in items.items():
        with open(item["path"], "rb") as fh:
            resp = requests.post(
                f"{base}/v1/jobs", files={"file": (Path(item["path"]).name, fh)}, data={"language": "en"}, timeout=60
            )
        resp.raise_for_status()
        jobs[name] = resp.json()["job_id"]
    return jobs


def wait_finished(base: str, ids: list[str], timeout: float = 1800) -> dict[str, dict]:
    """job id -> the job (its whole body) once every one has finished. Watched through one
    listing a second, not a poll per job: polls would take the CPU being measured, and a job
    polled faster than its Retry-After answers 429."""
    deadline, done = time.monotonic() + timeout, set()
    while len(done) < len(ids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(ids) - len(done)} of {len(ids)} jobs not finished after {timeout:.0f} s")
        for job in requests.get(f"{base}/v1/jobs", params={"limit": 200}, timeout=30).json()["jobs"]:
            if job["job_id"] in ids and job["status"] in FINISHED:
                done.add(job["job_id"])
        time.sleep(1.0)
    return {job_id: requests.get(f"{base}/v1/jobs/{job_id}", timeout=30).json() for job_id in ids}
