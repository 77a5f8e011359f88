"""`whisperq run`'s process manager: supervisord runs the Procfile's processes.

A process that dies (the OOM killer, a crash) is started again by itself while the others
keep running, web first of all; one that keeps failing to start is retried with a growing
delay (supervisord's backoff) and then left stopped, its log saying why. Ctrl-C or SIGTERM
stops everything gracefully: each process gets SIGTERM (Celery finishes the tasks it is
running) and up to STOP_WAIT seconds before it is killed.

Each process logs to `$WHISPERQ_DATA_DIR/logs/<name>.log` (rotated at 10 MB, 3 kept), and
`whisperq run` prints every line to its own output prefixed with the process's name, as a
Procfile runner does. `supervisorctl -c $WHISPERQ_DATA_DIR/supervisord.conf status` shows
the processes; `... restart inference` restarts one. An optional line (OPTIONAL: the MQTT
bridge) runs only where its setting is given, and is left out, saying so, elsewhere.

The embedded broker, where there is one, is supervised too (BROKER): started first and
stopped last, started again when it dies (SIGKILL, the OOM killer) on the same port, password
and append-only file, so queued jobs come back and the pools and the web reconnect by
themselves; one that keeps failing to start is retried with a growing delay, for longer.
Nothing outlives its supervisor: supervisord dies with `whisperq run`, and each process
with supervisord (web/deathsig.py), and a run that finds what a killed one left on its
data dir stops it before it starts.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from config.mqtt import URL_VARIABLE as MQTT_URL

STOP_WAIT = 60  # seconds a process gets to drain after SIGTERM
_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$")
# Procfile lines that run only where their setting is given: without a broker to connect to the
# MQTT bridge has nothing to do, and a process that exits at once is restarted until
# supervisord gives up on it (FATAL), which would look like a failure of the stack.
OPTIONAL = {"mqtt": MQTT_URL}

BROKER = "broker"
# Start order (lower first); supervisord stops in the reverse order, one after the other.
PRIORITY = {BROKER: 1, "web": 10}
# A broker that dies as it starts (its port taken, its disk full) is retried with a delay one
# second longer each time: about 80 minutes before supervisord gives up on it, not 55 s.
BROKER_START_RETRIES = 100
DEATHSIG = Path(__file__).with_name("deathsig.py")


def dies_with_parent(argv: list[str], parent: int | str = "-") -> list[str]:
    """`argv`, run so that it gets SIGTERM when its parent dies (web/deathsig.py)."""
    return [sys.executable, "-I", str(DEATHSIG), "TERM", str(parent), *argv]


def procfile_processes(procfile: Path) -> list[tuple[str, str]]:
    """(name, command) for each line of a Procfile."""
    out = []
    for line in Path(procfile).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            match = _LINE.match(line.strip())
            if not match:
                raise ValueError(f"{procfile}: {line!r} is not NAME: COMMAND")
            out.append((match.group(1), match.group(2)))
    return out


# Procfile lines that need the broker's broadcast and events, which SQS does not carry.
BROADCAST = ("flower",)


def wanted(processes: list[tuple[str, str]], env: dict) -> tuple[list[tuple[str, str]], list[str]]:
    """The processes to run with this environment, and the optional ones left out (OPTIONAL;
    BROADCAST's on SQS)."""
    run: list[tuple[str, str]] = []
    left_out: list[tuple[str, str]] = []
    sqs = (env.get("CELERY_BROKER_URL") or "").strip().lower().startswith("sqs://")
    for name, command in processes:
        setting = OPTIONAL.get(name)
        skip = (setting is not None and not (env.get(setting) or "").strip()) or (sqs and name in BROADCAST)
        (left_out if skip else run).append((name, command))
    return run, [name for name, _ in left_out]


# A Unix socket's path has room for 107 bytes (sun_path); a deep data dir would leave none.
SOCKET_PATH_MAX = 100


def socket_path(data_dir: Path) -> Path:
    """supervisord's control socket: in the data dir, or where its path is too long for a
    socket, in a directory of the owner's alone named after the data dir (so supervisorctl,
    reading the configuration, finds it there too)."""
    import hashlib
    import os
    import stat
    import tempfile

    path = Path(data_dir) / "supervisor.sock"
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return path
    short = Path(tempfile.gettempdir()) / f"whisperq-{hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:12]}"
    try:
        short.mkdir(mode=0o700)
    except FileExistsError:
        st = short.lstat()
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise RuntimeError(
                f"{short} is not a private directory of this user's; remove it, or use a shorter WHISPERQ_DATA_DIR"
            ) from None
    return short / "supervisor.sock"


def config_text(processes: list[tuple[str, str]], root: Path, data_dir: Path) -> str:
    """supervisord's configuration for these processes, all state under the data dir (its
    control socket too, unless that path is too long for a socket: socket_path)."""
    logs = data_dir / "logs"
    sock = socket_path(data_dir)

    def esc(value) -> str:  # supervisord expands %(name)s in values
        return str(value).replace("%", "%%")

    sections = [
        "[supervisord]",
        "nodaemon=true",
        "silent=true",
        f"logfile={esc(logs / 'supervisord.log')}",
        "logfile_maxbytes=10MB",
        f"pidfile={esc(data_dir / 'supervisord.pid')}",
        f"childlogdir={esc(logs)}",
        "",
        "[unix_http_server]",
        f"file={esc(sock)}",
        "chmod=0700",
        "",
        "[rpcinterface:supervisor]",
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface",
        "",
        "[supervisorctl]",
        f"serverurl=unix://{esc(sock)}",
        "",
    ]
    for name, command in processes:
        sections += [
            f"[program:{name}]",
            f"command={esc(shlex.join(dies_with_parent(['/bin/sh', '-c', 'exec ' + command])))}",
            f"directory={esc(root)}",
            # The web starts first and stops last (after it, the broker): it answers (503 on
            # /readyz) while pools come and go.
            f"priority={PRIORITY.get(name, 100)}",
            "autostart=true",
            "autorestart=true",
            f"startsecs={1 if name == BROKER else 3}",
            f"startretries={BROKER_START_RETRIES if name == BROKER else 10}",
            "stopsignal=TERM",
            f"stopwaitsecs={STOP_WAIT}",
            "stopasgroup=true",
            "killasgroup=true",
            "redirect_stderr=true",
            f"stdout_logfile={esc(logs / (name + '.log'))}",
            "stdout_logfile_maxbytes=10MB",
            "stdout_logfile_backups=3",
            "",
        ]
    return "\n".join(sections)


class Follower(threading.Thread):
    """Prints what each log file gains, line by line, prefixed with its name."""

    def __init__(self, files: dict[str, Path], out=sys.stdout):
        super().__init__(daemon=True)
        self.files, self.out, self.done = files, out, threading.Event()
        self.offsets = {name: 0 for name in files}
        self.partial = {name: b"" for name in files}
        self.width = max(len(n) for n in files)

    def poll(self) -> None:
        for name, path in self.files.items():
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size < self.offsets[name]:  # rotated
                self.offsets[name] = 0
            if size == self.offsets[name]:
                continue
            with path.open("rb") as fh:
                fh.seek(self.offsets[name])
                data = self.partial[name] + fh.read(size - self.offsets[name])
            self.offsets[name] = size
            *lines, self.partial[name] = data.split(b"\n")
            for line in lines:
                self.out.write(f"{name:<{self.width}} | {line.decode('utf-8', 'replace')}\n")
            self.out.flush()

    def run(self) -> None:
        while not self.done.wait(0.2):
            self.poll()
        self.poll()

    def stop(self) -> None:
        self.done.set()
        self.join(5)


def claim(data_dir: Path):
    """Hold the data dir for this run (an open file, locked until it is closed or the run
    dies), after stopping what a killed run left on it; RuntimeError if another runs."""
    lock = open(Path(data_dir) / "run.lock", "w")  # noqa: SIM115 - held for the run: it is the lock
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise RuntimeError(
            f"another `whisperq run` is running on the data dir {data_dir}; stop it first, or set "
            "WHISPERQ_DATA_DIR to another directory"
        ) from None
    _stop_orphan(Path(data_dir))
    return lock


def _orphan_pid(data_dir: Path) -> int:
    """The pid of a supervisord a killed run left on this data dir, or 0: its pid file is
    here and the process is a supervisord of this data dir's configuration."""
    try:
        pid = int((data_dir / "supervisord.pid").read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):  # gone, or no /proc: nothing known to be ours
        return 0
    ours = any(a.endswith(b"supervisord") for a in argv) and os.fsencode(data_dir / "supervisord.conf") in argv
    return pid if ours else 0


def _stop_orphan(data_dir: Path) -> None:
    pid = _orphan_pid(data_dir)
    if not pid:
        return
    # SIGTERM: it stops its processes as it would on Ctrl-C (they may be doing so already,
    # told by the death signal), the broker last.
    print(
        f"stopping the processes an earlier, killed `whisperq run` left on {data_dir} (supervisord pid {pid})",
        flush=True,
    )
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_WAIT * 3
    while _orphan_pid(data_dir) == pid:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the supervisord (pid {pid}) an earlier `whisperq run` left on {data_dir} is still "
                "stopping its processes; wait for it, or stop it"
            )
        time.sleep(0.2)


def run_supervised(procfile: Path, root: Path, data_dir: Path, env: dict, broker: list[str] | None = None) -> int:
    """Run the Procfile (and `broker`, the embedded broker's command, where given) under
    supervisord until it is stopped; its exit status."""
    processes, left_out = wanted(procfile_processes(procfile), env)
    if broker:
        processes = [(BROKER, shlex.join(broker)), *processes]
    for name in left_out:
        why = f"{OPTIONAL[name]} is not set" if name in OPTIONAL else "SQS carries no broadcast or events to show"
        print(f"{name}: not started ({why})", flush=True)
    logs = data_dir / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    for stale in logs.glob("*.log"):  # this run's lines only (rotated backups stay)
        stale.unlink()
    conf = data_dir / "supervisord.conf"
    conf.write_text(config_text(processes, root, data_dir))
    follower = Follower({"supervisor": logs / "supervisord.log", **{n: logs / f"{n}.log" for n, _ in processes}})
    follower.start()
    bindir = Path(sys.executable).parent
    proc = subprocess.Popen(dies_with_parent([str(bindir / "supervisord"), "-c", str(conf)], os.getpid()), env=env)

    def forward(signum, _frame):
        proc.send_signal(signal.SIGTERM)  # supervisord stops every process, gracefully

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        time.sleep(0.3)
        follower.stop()
