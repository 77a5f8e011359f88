#!/usr/bin/env python3
"""How many inference workers the queue needs, from the web app's /metrics.

A plain alternative to KEDA (deploy/k8s/keda-scaledobject.yaml) for hosts without Kubernetes:
it reads /metrics, prints the decision as one JSON line, and with --exec runs a command
with the count (`systemctl`, `docker compose up --scale`, `kubectl scale`, ...) when it
differs from the workers alive. Once by default, or every --interval seconds.

    python deploy/autoscale.py --url http://127.0.0.1:8000/metrics --max 6 \\
        --exec 'docker compose up -d --no-recreate --scale inference={workers}'

The decision (`desired_workers`): every job running now needs a slot, and so does the
backlog waiting in whisperq.inference, where a slot may carry more waiting jobs the
lower their priority (by default 1 high, 2 normal, 4 low job per slot: high jobs should
not wait behind a batch, low ones may). Slots over WHISPERQ_INFERENCE_SLOTS per worker,
rounded up, within --min and --max; it grows at once and shrinks one worker a step.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping

INFERENCE_QUEUE = "whisperq.inference"
TIERS = ("high", "normal", "low")
JOBS_PER_SLOT = {"high": 1.0, "normal": 2.0, "low": 4.0}


def desired_workers(
    depth: Mapping[str, float],
    running: float,
    slots: int,
    current: int | None = None,
    *,
    min_workers: int = 1,
    max_workers: int = 10,
    jobs_per_slot: Mapping[str, float] = JOBS_PER_SLOT,
    max_step_down: int = 1,
) -> int:
    """Inference workers wanted for `depth` (waiting jobs per tier), `running` jobs and
    `slots` jobs per worker; `current` (alive now) limits how fast it shrinks."""
    if slots < 1:
        raise ValueError("slots must be at least 1 (WHISPERQ_INFERENCE_SLOTS)")
    if not 0 <= min_workers <= max_workers:
        raise ValueError("need 0 <= --min <= --max")
    needed = max(0.0, running) + sum(
        max(0.0, n) / jobs_per_slot.get(tier, jobs_per_slot["normal"]) for tier, n in depth.items()
    )
    want = math.ceil(needed / slots - 1e-9)
    if current is not None and want < current:
        want = max(want, current - max_step_down)
    return max(min_workers, min(max_workers, want))


def read_metrics(text: str) -> dict:
    """Depth per tier, running jobs, workers alive and their slots, from a /metrics page.

    On RabbitMQ the broker gives one count for the queue (priority="all"): it is split by
    tier in the proportions of the database's waiting jobs (whisperq_jobs_waiting)."""
    from prometheus_client.parser import text_string_to_metric_families

    broker: dict[str, float] = {}
    waiting: dict[str, float] = {}
    out = {"running": 0.0, "workers": 0, "slots": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "whisperq_queue_depth" and s.labels.get("queue") == INFERENCE_QUEUE:
                broker[s.labels["priority"]] = broker.get(s.labels["priority"], 0.0) + s.value
            elif s.name == "whisperq_jobs_waiting" and s.labels.get("stage") == "inference":
                waiting[s.labels["priority"]] = s.value
            elif s.name == "whisperq_jobs_running" and s.labels.get("stage") == "inference":
                out["running"] = s.value
            elif s.name == "whisperq_workers_alive" and s.labels.get("pool") == "inference":
                out["workers"] = int(s.value)
            elif s.name == "whisperq_worker_slots" and s.labels.get("pool") == "inference":
                out["slots"] = s.value
    if "all" in broker:
        total, known = broker.pop("all"), sum(waiting.values())
        for tier in TIERS:
            share = waiting.get(tier, 0.0) / known if known else (1.0 if tier == "normal" else 0.0)
            broker[tier] = broker.get(tier, 0.0) + total * share
    out["depth"] = {tier: broker.get(tier, 0.0) for tier in TIERS}
    return out


def decide(text: str, args) -> dict:
    figures = read_metrics(text)
    slots = args.slots or (round(figures["slots"] / figures["workers"]) if figures["workers"] else 8)
    workers = desired_workers(
        figures["depth"], figures["running"], slots, figures["workers"], min_workers=args.min, max_workers=args.max
    )
    return {
        "workers": workers,
        "alive": figures["workers"],
        "slots": slots,
        "running": figures["running"],
        "depth": figures["depth"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000/metrics")
    parser.add_argument("--min", type=int, default=1)
    parser.add_argument("--max", type=int, default=10)
    parser.add_argument("--slots", type=int, default=0, help="jobs per worker (default: from the heartbeats, else 8)")
    parser.add_argument("--exec", dest="command", help="run this with {workers} replaced when the count changes")
    parser.add_argument("--interval", type=float, default=0, help="repeat every N seconds (default: once)")
    args = parser.parse_args(argv)
    while True:
        try:
            with urllib.request.urlopen(args.url, timeout=10) as resp:
                decision = decide(resp.read().decode(), args)
        except OSError as exc:
            print(json.dumps({"error": f"could not read {args.url}: {exc}"}), file=sys.stderr, flush=True)
            if not args.interval:
                return 1
        else:
            print(json.dumps(decision), flush=True)
            if args.command and decision["workers"] != decision["alive"]:
                subprocess.run(shlex.split(args.command.format(workers=decision["workers"])), check=False)
        if not args.interval:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
