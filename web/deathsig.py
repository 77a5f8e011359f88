"""Run a command that dies with its parent: `python -I deathsig.py SIGNAL PARENT_PID COMMAND...`.

`whisperq run` starts supervisord through it, and supervisord each process: where the
parent is killed outright (SIGKILL, the OOM killer) nothing of the stack stays behind
holding its ports, its broker's files or memory. On Linux the kernel sends SIGNAL to the
process when its parent dies (PR_SET_PDEATHSIG, which survives exec); elsewhere the command
runs as it is. PARENT_PID (or `-` for the parent found at start) closes the race where the
parent dies before the signal is armed: then the command is not started at all.

Run as a file, not as `-m web.deathsig`: importing the `web` package would load the whole app
before each process of the stack starts.
"""

from __future__ import annotations

import os
import signal
import sys


def arm(signum: int, parent: int) -> bool:
    """Ask for `signum` when the parent dies; False if it is gone already."""
    if sys.platform.startswith("linux"):
        from billiard.util import set_pdeathsig  # Celery's own prctl() wrapper (it arms its pool's children so)

        set_pdeathsig(signum)
    return os.getppid() == parent


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        sys.exit("usage: deathsig.py SIGNAL PARENT_PID|- COMMAND [ARGS...]")
    name, parent, command = argv[0], argv[1], argv[2:]
    signum = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    if not arm(signum, os.getppid() if parent == "-" else int(parent)):
        sys.exit(f"not starting {command[0]}: its parent exited before it began")
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
