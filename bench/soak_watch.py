"""What bench/soak.py watches and does to the stack while it streams: /healthz every 0.5 s
(its outages), each process's proportional set size (PSS) by program, the kills on a
schedule (the stack's processes, the broker, PostgreSQL), and the plot of it all."""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

# How a process of the stack is named: the first key found in its command line. A process
# below one of the programs (a web worker, a prefork child) is counted as that program's.
LABELS = (
    ("redis-server", "broker"),
    ("prepare@", "prepare"),
    ("inference@", "inference"),
    ("analysis@", "analysis"),
    ("notify@", "notify"),
    ("flower", "flower"),
    (" beat", "beat"),
    ("gunicorn", "web"),
    ("supervisord", "supervisord"),
    ("whisperq run", "run"),
    ("whisperq grpc", "grpc"),
    ("whisperq mqtt", "mqtt"),
)
# The processes above the programs: each child of these is a program of its own.
SUPERVISORS = ("run", "supervisord")
# The supervisord programs killed in turn (their names in the generated supervisord.conf).
# supervisord itself is not among them: nothing starts it again (web/supervise.py:
# `whisperq run` exits when it dies, and every program with it; see docs/soak.md).
PROGRAMS = ("prepare", "inference", "analysis", "notify", "web", "beat", "flower", "grpc")


class Health(threading.Thread):
    """/healthz every 0.5 s: the outages (start, seconds)."""

    def __init__(self, stack):
        super().__init__(daemon=True)
        self.stack, self.done, self.outages, self.probes = stack, threading.Event(), [], 0
        self.t0 = time.time()

    def run(self) -> None:
        down_since = None
        while not self.done.wait(0.5):
            self.probes += 1
            ok = self.stack.healthy()
            now = time.time()
            if not ok and down_since is None:
                down_since = now
            elif ok and down_since is not None:
                self.outages.append((round(down_since - self.t0, 1), round(now - down_since, 1)))
                down_since = None
        if down_since is not None:
            self.outages.append((round(down_since - self.t0, 1), round(time.time() - down_since, 1)))


def _children() -> dict[int, list[int]]:
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return parents


def _cmdline(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def _label(cmd: str) -> str:
    return next((label for key, label in LABELS if key in cmd), cmd.split(" ")[0].rsplit("/", 1)[-1])


def processes(root: int) -> dict[int, str]:
    """Every process below `root` (and itself), each with the program it belongs to: a child
    of `whisperq run` or of supervisord is a program (named by LABELS), and every process
    below a program is that program's."""
    children = _children()
    found: dict[int, str] = {}
    todo: list[tuple[int, str | None]] = [(root, None)]
    while todo:
        pid, inherited = todo.pop()
        cmd = _cmdline(pid)
        if cmd is None:
            continue
        label = inherited or _label(cmd)
        found[pid] = label
        below = None if label in SUPERVISORS else label
        todo.extend((child, below) for child in children.get(pid, []))
    return found


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (not itself)."""
    children, out, todo = _children(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def pss_kib(pid: int) -> int | None:
    """The process's proportional set size (its private pages, and its share of the pages it
    shares), in KiB: /proc/PID/smaps_rollup's Pss line. None when it is gone."""
    try:
        found = re.search(r"^Pss:\s+(\d+) kB", Path(f"/proc/{pid}/smaps_rollup").read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(found.group(1)) if found else None


class Memory(threading.Thread):
    """Each process's PSS every `every` seconds. `rounds`: [(t, {pid: (program, MiB)})];
    `series`: {"program pid": [(t, MiB), ...]}, one per process (so one per life)."""

    def __init__(self, root: int, every: float = 5.0):
        super().__init__(daemon=True)
        self.root, self.every, self.done = root, every, threading.Event()
        self.rounds: list[tuple[float, dict[int, tuple[str, float]]]] = []
        self.series: dict[str, list[tuple[float, float]]] = {}
        self.t0 = time.time()

    def run(self) -> None:
        while True:
            now = round(time.time() - self.t0, 1)
            sample = {}
            for pid, program in processes(self.root).items():
                kib = pss_kib(pid)
                if kib is not None:
                    sample[pid] = (program, round(kib / 1024, 1))
                    self.series.setdefault(f"{program} {pid}", []).append((now, sample[pid][1]))
            if sample:
                self.rounds.append((now, sample))
            if self.done.wait(self.every):
                return

    def by_program(self) -> dict[str, list[tuple[float, float]]]:
        """Each program's PSS (the sum over its processes) at each round."""
        out: dict[str, list[tuple[float, float]]] = {}
        for t, sample in self.rounds:
            sums: dict[str, float] = {}
            for program, mib in sample.values():
                sums[program] = sums.get(program, 0.0) + mib
            for program, mib in sums.items():
                out.setdefault(program, []).append((t, round(mib, 1)))
        return out


def growth(points: list[tuple[float, float]]) -> dict | None:
    """The median over the first window of `points` against the median over the last (a
    tenth of the span, at least 30 s), and the growth between them in per cent; None with
    fewer than 4 points or a span under 60 s."""
    if len(points) < 4 or points[-1][0] - points[0][0] < 60:
        return None
    window = max(30.0, (points[-1][0] - points[0][0]) / 10)
    first = sorted(v for t, v in points if t <= points[0][0] + window)
    last = sorted(v for t, v in points if t >= points[-1][0] - window)
    start, end = first[len(first) // 2], last[len(last) // 2]
    return {
        "from_s": points[0][0],
        "to_s": points[-1][0],
        "start_mib": round(start, 1),
        "end_mib": round(end, 1),
        "growth_pct": round(100 * (end - start) / start, 1) if start else None,
    }


def memory_summary(
    rounds: list[tuple[float, dict[int, tuple[str, float]]]], warmup: float, settle: float = 60.0
) -> dict:
    """Whether memory stayed flat, on PSS.

    The stack: the sum over all its processes, the first window after `warmup` seconds
    against the last (`growth`). Each program: only like with like. Its processes' PSS is
    summed over each stretch in which they stay the same processes (a kill, a restart or a
    replaced child starts a new stretch: a fresh process starts small), from `settle`
    seconds into the stretch (and not before `warmup`); each stretch long enough is judged on
    its own (`growth`). `growth_pct` is the longest stretch's, `worst_growth_pct` the
    largest of any, and `settled_mib` each stretch's first window: how big each life settles."""
    stack = [(t, sum(mib for _, mib in sample.values())) for t, sample in rounds]
    out: dict[str, dict] = {}
    judged = growth([(t, v) for t, v in stack if t >= warmup])
    if judged:
        out["stack"] = {
            "after_warmup_mib": judged["start_mib"],
            "end_mib": judged["end_mib"],
            "growth_pct": judged["growth_pct"],
        }
    stretches: dict[str, list[dict]] = {}
    current: dict[str, dict] = {}
    for t, sample in rounds:
        members: dict[str, set[int]] = {}
        sums: dict[str, float] = {}
        for pid, (program, mib) in sample.items():
            members.setdefault(program, set()).add(pid)
            sums[program] = sums.get(program, 0.0) + mib
        for program, pids in members.items():
            stretch = current.get(program)
            if stretch is None or stretch["pids"] != pids:
                stretch = current[program] = {"start": t, "pids": pids, "points": []}
                stretches.setdefault(program, []).append(stretch)
            if t >= max(stretch["start"] + settle, warmup):
                stretch["points"].append((t, sums[program]))
        for program in [p for p in current if p not in members]:
            del current[program]  # not running this round: whatever comes next is a new life
    for program, each in sorted(stretches.items()):
        judged_each = [g for s in each if (g := growth(s["points"])) is not None]
        entry: dict = {"stretches": len(each), "judged": len(judged_each)}
        if judged_each:
            longest = max(judged_each, key=lambda g: g["to_s"] - g["from_s"])
            entry.update(
                growth_pct=longest["growth_pct"],
                longest=longest,
                worst_growth_pct=max(g["growth_pct"] for g in judged_each if g["growth_pct"] is not None),
                settled_mib=[g["start_mib"] for g in judged_each],
            )
        out[program] = entry
    return out


class Chaos(threading.Thread):
    """Kills the stack's processes in turn, one every `every` seconds, with SIGKILL: each
    supervisord program (PROGRAMS), a web worker, the broker and, on PostgreSQL, PostgreSQL.
    `killed`: the pid of every process killed, and of the processes below it (which go down
    with it). `infra_killed`: which of the broker and PostgreSQL went down at least once."""

    def __init__(self, stack, broker_restart: str | None, postgres: bool, every: float = 120.0):
        super().__init__(daemon=True)
        self.stack, self.every, self.done = stack, every, threading.Event()
        self.events: list[dict] = []
        self.broker_restart = broker_restart
        self.targets = ["prepare", "inference", "web worker", "broker", "analysis", "notify", "web", "beat"]
        self.targets += ["flower", "grpc"]
        if postgres and self.stack.settings.database_url.startswith("postgresql"):
            self.targets.append("postgresql")
        self.killed: set[int] = set()
        self.infra_killed: set[str] = set()
        # each PostgreSQL outage: (killed, listening again or None), as time.time()
        self.db_away: list[tuple[float, float | None]] = []
        self.t0 = time.time()

    def run(self) -> None:
        turn = 0
        while not self.done.wait(self.every):
            target = self.targets[turn % len(self.targets)]
            turn += 1
            started = time.time()
            try:
                what = self.hit(target)
            except Exception as exc:  # reported, the soak goes on
                what = f"failed: {type(exc).__name__}: {exc}"
            event = {"t": round(started - self.t0, 1), "target": target, "what": what}
            event["seconds"] = round(time.time() - started, 1)
            self.events.append(event)
            print(f"  chaos t={event['t']:.0f}s {target}: {what} ({event['seconds']} s)", flush=True)

    def hit(self, target: str) -> str:
        if target in PROGRAMS:
            return self.kill(self.stack.pid(target))
        if target == "web worker":
            master = self.stack.pid("web")
            workers = [p for p in processes(master) if p != master] if master else []
            return self.kill(random.choice(workers)) if workers else "no web worker found"
        if target == "broker":
            if self.stack.embedded:  # supervisord starts it again
                what = self.kill(self.stack.pid("broker"))
            elif self.broker_restart:
                what = run_command(self.broker_restart)
            else:
                what = self.kill_broker(self.stack.broker_url)
            if what.startswith(("SIGKILL", "`")):
                self.infra_killed.add("broker")
            return what
        what = self.kill_postgresql(self.stack.settings.database_url)
        if what.startswith("SIGKILL"):
            self.infra_killed.add("postgresql")
        return what

    def kill(self, pid: int) -> str:
        if not pid:
            return "not running"
        below = descendants(pid)
        self.killed.update([pid, *below])
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL pid {pid}" + (f" (and the {len(below)} processes below it)" if below else "")

    def kill_broker(self, url: str) -> str:
        """SIGKILL an external Redis or RabbitMQ on this machine, and start it again."""
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        if host not in ("127.0.0.1", "localhost", "::1"):
            return f"skipped: the broker is on {host}, not this machine (give --broker-restart)"
        if parts.scheme.startswith("redis"):
            port = parts.port or 6379
            pid = redis_pid(port, parts.password)
            if not pid:
                return f"skipped: no redis-server answers on port {port}"
            what = self.kill(pid)
            gone(pid, port)
            start = f'redis-server --daemonize yes --bind 127.0.0.1 --port {port} --save "" --appendonly no'
            started = run_command(start)
            up = wait_for(lambda: redis_pid(port, parts.password) != 0, 60)
            return f"{what}; {started}" + ("" if up else "; it did not answer in 60 s")
        if parts.scheme.startswith(("amqp", "pyamqp")):
            pid = rabbit_pid()
            if not pid:
                return "skipped: no RabbitMQ node found (beam.smp)"
            what = self.kill(pid)
            gone(pid, parts.port or 5672)
            started = run_command("rabbitmq-server -detached")
            up = wait_for(lambda: _quiet("rabbitmqctl -q await_startup --timeout 30") == 0, 180)
            return f"{what}; {started}" + ("; up" if up else "; not up after 180 s")
        return f"skipped: no way to kill a {parts.scheme} broker here (give --broker-restart)"

    def kill_postgresql(self, url: str) -> str:
        """SIGKILL the postmaster of the cluster on the database's port and its children,
        and start the cluster again (pg_ctlcluster); it recovers from its WAL."""
        port = urlsplit(url.replace("+psycopg", "").replace("+psycopg2", "")).port or 5432
        cluster = postgres_cluster(port)
        if cluster is None:
            return f"skipped: no PostgreSQL cluster of this machine listens on port {port} (pg_lsclusters)"
        version, name, data = cluster
        pid = int((Path(data) / "postmaster.pid").read_text().split()[0])
        below = descendants(pid)
        killed_at = time.time()
        what = self.kill(pid)
        for child in below:  # they would exit on their own once they see the postmaster gone
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        gone(pid, port, *below)
        # PostgreSQL refuses to start while the pid in its lock file exists, and a killed
        # postmaster is a zombie until its parent reaps it: start again until it listens.
        start = f"pg_ctlcluster --skip-systemctl-redirect {version} {name} start"
        tries: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            wait_for(lambda: not Path(f"/proc/{pid}").exists(), 5)
            tries.append(run_command(start))
            if wait_for(lambda: _listening(port), 10):
                self.db_away.append((killed_at, time.time()))
                return f"{what}; {tries[-1]}" + (f" (try {len(tries)})" if len(tries) > 1 else "")
        self.db_away.append((killed_at, None))
        return f"{what}; {tries[-1] if tries else start}; not listening after 120 s ({len(tries)} tries)"


def run_command(command: str) -> str:
    out = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=180)
    return f"`{command}` exit {out.returncode}"


def _quiet(command: str, timeout: float = 60) -> int:
    try:
        return subprocess.run(shlex.split(command), capture_output=True, timeout=timeout).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1


def wait_for(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie holds nothing: its parent has yet to reap it


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def gone(pid: int, port: int, *others: int, seconds: float = 60) -> bool:
    """Wait until the killed processes are gone and nothing listens on `port`."""
    return wait_for(lambda: not any(_alive(p) for p in (pid, *others)) and not _listening(port), seconds)


def redis_pid(port: int, password: str | None = None) -> int:
    """The pid of the redis-server on `port` (`redis-cli info server`: process_id), or 0."""
    argv = ["redis-cli", "-p", str(port), *(["--no-auth-warning", "-a", password] if password else [])]
    try:
        out = subprocess.run([*argv, "info", "server"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    found = re.search(r"^process_id:(\d+)", out, re.MULTILINE)
    return int(found.group(1)) if found else 0


def rabbit_pid() -> int:
    """The pid of the RabbitMQ node's beam.smp: as the node says, else by its command line."""
    try:
        out = subprocess.run(
            ["rabbitmqctl", "-q", "eval", "os:getpid()."], capture_output=True, text=True, timeout=60
        ).stdout
        if (said := out.strip().strip('"')).isdigit():
            return int(said)
    except (OSError, subprocess.TimeoutExpired):
        pass
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"beam.smp") and any(b"rabbit" in a for a in argv):
            return int(cmdline.parent.name)
    return 0


def postgres_cluster(port: int) -> tuple[str, str, str] | None:
    """(version, name, data directory) of this machine's cluster on `port` (pg_lsclusters)."""
    try:
        out = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[2] == str(port):
            return fields[0], fields[1], fields[5]
    for pidfile in sorted(Path("/var/lib/postgresql").glob("*/main/postmaster.pid")):  # without postgresql-common
        lines = pidfile.read_text().splitlines()
        if len(lines) > 3 and lines[3].strip() == str(port):
            return pidfile.parent.parent.name, "main", str(pidfile.parent)
    return None


def plot(path: Path, memory: Memory, chaos: Chaos, health: Health) -> None:
    try:
        import matplotlib
    except ImportError:  # `make soak` installs it (the bench extra); the JSON has the same numbers
        print(f"no plot: matplotlib is not installed (pip install -e '.[bench]'); {path} not written", flush=True)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 9), sharex=True, height_ratios=(1, 2))
    top.plot(
        [t / 60 for t, _ in memory.rounds],
        [sum(mib for _, mib in sample.values()) for _, sample in memory.rounds],
        color="black",
        linewidth=1,
    )
    top.set_ylabel("stack PSS (MiB)")
    for program, points in sorted(memory.by_program().items()):
        bottom.plot([t / 60 for t, _ in points], [mib for _, mib in points], label=program, linewidth=1)
    offset = chaos.t0 - memory.t0
    for ax in (top, bottom):
        for event in chaos.events:
            ax.axvline((event["t"] + offset) / 60, color="red", alpha=0.3, linestyle="--")
        for start, seconds in health.outages:
            at = (start + health.t0 - memory.t0) / 60
            ax.axvspan(at, at + seconds / 60, color="grey", alpha=0.3)
    for event in chaos.events:
        bottom.annotate(
            event["target"],
            ((event["t"] + offset) / 60, bottom.get_ylim()[1]),
            rotation=90,
            fontsize=7,
            va="top",
            color="red",
        )
    bottom.set_xlabel("minutes")
    bottom.set_ylabel("PSS per program (MiB)")
    top.set_title("whisperq soak: proportional set size (red: kills, grey: /healthz down)")
    bottom.legend(fontsize=7, ncol=4, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
