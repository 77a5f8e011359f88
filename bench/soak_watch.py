"""What bench/soak.py watches and does to the stack while it streams: /healthz every 0.5 s
(its outages), each process's resident memory (psutil where installed, else /proc), the
kills on a schedule, and the plot of it all."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

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
)


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


def processes(root: int) -> dict[int, str]:
    """Every process below `root` (and itself), labelled by what it runs."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found[pid] = next((label for key, label in LABELS if key in cmd), cmd.split(" ")[0].rsplit("/", 1)[-1])
        todo.extend(parents.get(pid, []))
    return found


def rss(pid: int) -> int | None:
    try:
        import psutil

        return psutil.Process(pid).memory_info().rss
    except ImportError:
        try:
            kb = re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
            return int(kb.group(1)) * 1024 if kb else None
        except OSError:
            return None
    except Exception:  # gone between the listing and the read
        return None


class Memory(threading.Thread):
    """Each process's RSS every `every` seconds: {"label pid": [(t, MB), ...]}."""

    def __init__(self, root: int, every: float = 5.0):
        super().__init__(daemon=True)
        self.root, self.every, self.done, self.series = root, every, threading.Event(), {}
        self.t0 = time.time()

    def run(self) -> None:
        while True:
            now = round(time.time() - self.t0, 1)
            for pid, label in processes(self.root).items():
                value = rss(pid)
                if value is not None:
                    self.series.setdefault(f"{label} {pid}", []).append((now, round(value / 2**20, 1)))
            if self.done.wait(self.every):
                return


def memory_summary(series: dict[str, list[tuple[float, float]]], warmup: float) -> dict:
    """Whether memory stayed flat: for the whole stack and for each kind of process (the sum
    over its processes, so a killed one's successor counts as the same), the median resident
    MiB over the first window after `warmup` seconds against the median over the last window
    (a tenth of what remains, at least 30 s), and the growth between them in per cent."""
    totals: dict[str, dict[float, float]] = {}
    for name, points in series.items():
        label = name.rsplit(" ", 1)[0]
        for t, mib in points:
            for key in ("stack", label):
                totals.setdefault(key, {}).setdefault(t, 0.0)
                totals[key][t] += mib
    out: dict[str, dict] = {}
    for key, by_time in totals.items():
        times = sorted(by_time)
        after = [t for t in times if t >= warmup]
        if len(after) < 4:
            continue
        window = max(30.0, (after[-1] - after[0]) / 10)
        first = [by_time[t] for t in after if t <= after[0] + window]
        last = [by_time[t] for t in after if t >= after[-1] - window]
        start, end = sorted(first)[len(first) // 2], sorted(last)[len(last) // 2]
        out[key] = {
            "after_warmup_mib": round(start, 1),
            "end_mib": round(end, 1),
            "growth_pct": round(100 * (end - start) / start, 1) if start else None,
        }
    return out


class Chaos(threading.Thread):
    """Kills the stack's processes in turn, one every `every` seconds."""

    def __init__(self, stack, every: float, broker_restart: str | None, postgres_restart: bool):
        super().__init__(daemon=True)
        self.stack, self.every, self.done, self.events = stack, every, threading.Event(), []
        self.broker_restart = broker_restart
        self.targets = ["prepare", "inference", "web worker", "broker", "analysis", "notify"]
        if postgres_restart and self.stack.settings.database_url.startswith("postgresql"):
            self.targets.append("postgresql")
        self.t0 = time.time()

    def run(self) -> None:
        turn = 0
        while not self.done.wait(self.every):
            target = self.targets[turn % len(self.targets)]
            turn += 1
            try:
                what = self.hit(target)
            except Exception as exc:  # reported, the soak goes on
                what = f"failed: {type(exc).__name__}: {exc}"
            self.events.append({"t": round(time.time() - self.t0, 1), "target": target, "what": what})
            print(f"  chaos t={self.events[-1]['t']:.0f}s {target}: {what}", flush=True)

    def hit(self, target: str) -> str:
        if target in ("prepare", "inference", "analysis", "notify"):
            return self.kill(self.stack.pid(target))
        if target == "web worker":
            master = self.stack.pid("web")
            workers = [p for p, _ in processes(master).items() if p != master]
            return self.kill(random.choice(workers)) if workers else "no web worker found"
        if target == "broker":
            if self.stack.embedded:
                return self.kill(self.stack.pid("broker"))
            if not self.broker_restart:
                return "skipped: an external broker is restarted only with --broker-restart"
            return self.run_command(self.broker_restart)
        cluster = sorted(os.listdir("/etc/postgresql"))[-1]  # the version installed (the newest, if several)
        return self.run_command(f"pg_ctlcluster --skip-systemctl-redirect {cluster} main restart")

    @staticmethod
    def kill(pid: int) -> str:
        if not pid:
            return "not running"
        os.kill(pid, signal.SIGKILL)
        return f"SIGKILL pid {pid}"

    @staticmethod
    def run_command(command: str) -> str:
        out = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120)
        return f"`{command}` exit {out.returncode}"


def plot(path: Path, memory: Memory, chaos: Chaos, health: Health) -> None:
    try:
        import matplotlib
    except ImportError:  # `make soak` installs it (the bench extra); the JSON has the same numbers
        print(f"no plot: matplotlib is not installed (pip install -e '.[bench]'); {path} not written", flush=True)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(13, 7))
    for label, points in sorted(memory.series.items()):
        if len(points) > 1:
            ax.plot([t / 60 for t, _ in points], [mb for _, mb in points], label=label, linewidth=1)
    offset = chaos.t0 - memory.t0
    for event in chaos.events:
        ax.axvline((event["t"] + offset) / 60, color="red", alpha=0.3, linestyle="--")
        ax.annotate(
            event["target"],
            ((event["t"] + offset) / 60, ax.get_ylim()[1]),
            rotation=90,
            fontsize=7,
            va="top",
            color="red",
        )
    for start, seconds in health.outages:
        at = (start + health.t0 - memory.t0) / 60
        ax.axvspan(at, at + seconds / 60, color="grey", alpha=0.3)
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("whisperq soak: resident memory per process (red: kills, grey: /healthz down)")
    ax.legend(fontsize=6, ncol=3, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
