"""`whisperq run` as a test drives it: the whole service (supervisord, web under gunicorn's gevent
worker, the pools, beat, the gRPC door, the MQTT bridge where its broker is named, Flower
where the broker broadcasts) in its own process group, on a data dir and ports of its own,
with none of the machine's services named unless the test names them.

tests/test_run.py and tests/test_conformance.py start it; `Stack.ready()` waits until the web
answers /readyz and every model has a live inference worker (the start-up grace of /readyz
answers 200 before any worker is up)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from helpers import free_port

WHISPERQ = Path(sys.executable).parent / "whisperq"
# The machine's services, left out unless a test names them (then the embedded broker and SQLite).
MACHINE = ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL", "FLOWER_BASIC_AUTH", "WHISPERQ_INPUT_DIRS")


def run_env(tmp_path: Path, port: int, drop: tuple[str, ...] = (), **settings: str) -> dict[str, str]:
    """The environment of a `whisperq run` on a data dir of its own and free ports, with none
    of the machine's services named (so the embedded broker and SQLite), `drop` left out too."""
    env = {k: v for k, v in os.environ.items() if k not in (*MACHINE, *drop)}
    # The tests poll each job in a loop (WHISPERQ_POLL_LIMIT would answer it 429).
    env.update(
        WHISPERQ_DATA_DIR=str(tmp_path / "var"),
        PORT=str(port),
        FLOWER_PORT=str(free_port()),
        WHISPERQ_GRPC_PORT=str(free_port()),
        WHISPERQ_POLL_LIMIT="false",
    )
    env.update(settings)
    return env


def wait_for_stack(check, timeout: float, what: str, proc: subprocess.Popen, log: Path):
    """`check()`'s first true value, looked for every 0.3 s while `whisperq run` (`proc`) is
    alive, a request that fails counting as not yet; AssertionError with the end of its log
    after `timeout` seconds, or at once if it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"whisperq run exited early:\n{log.read_text()}"
        try:
            value = check()
            if value:
                return value
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} not ready within {timeout} s:\n{log.read_text()[-4000:]}")


@dataclass
class Stack:
    """One `whisperq run` and what reaches it."""

    tmp: Path
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.tmp / "run.log"

    @classmethod
    def start(cls, tmp: Path, drop: tuple[str, ...] = (), **settings: str) -> Stack:
        stack = cls(tmp, run_env(tmp, free_port(), drop, **settings))
        stack.proc = subprocess.Popen(
            [str(WHISPERQ), "run"], env=stack.env, stdout=stack.log.open("w"), stderr=subprocess.STDOUT
        )
        return stack

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.env['PORT']}"

    @property
    def data_dir(self) -> Path:
        return Path(self.env["WHISPERQ_DATA_DIR"])

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.env['WHISPERQ_GRPC_PORT']}"

    def wait(self, check, timeout: float, what: str):
        assert self.proc is not None
        return wait_for_stack(check, timeout, what, self.proc, self.log)

    def ready(self, timeout: float = 180) -> dict:
        """/readyz's body once the web is ready and every model has a live inference worker."""

        def serving():
            resp = requests.get(f"{self.base}/readyz", timeout=5)
            body = resp.json()
            return resp.status_code == 200 and body["models"] and all(body["models"].values()) and body

        return self.wait(serving, timeout, "the service")

    def output(self) -> str:
        return self.log.read_text()

    def command(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """A `whisperq` command beside the stack, on its data dir and settings."""
        return subprocess.run(
            [str(WHISPERQ), *argv], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def stop(self, timeout: float = 90) -> int:
        """SIGTERM, as Ctrl-C: everything finishes or hands back its work; the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc is not None else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
