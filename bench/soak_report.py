"""A soak's report (bench/soak.py's soak.json) as the tables of docs/soak.md, so the page is
written from the kept file, not by hand:

    python bench/soak_report.py docs/soak-pg-20.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path


def table(head: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown(d: dict) -> str:
    c = d["counts"]
    ledger, hooks, health, targets = d["engine_ledger"], d["webhooks"], d["healthz"], d["targets"]
    kills = Counter(k["target"] for k in d["chaos"])
    rows = [
        ["submitted", c["submitted"]],
        ["accepted (and after a refusal, found by its key)", f"{c['accepted']} (+{c['accepted_after_refusal']})"],
        ["completed", c["completed"]],
        ["failed as expected (bad input)", c["failed_as_expected"]],
        ["failed unexpectedly", c["failed_unexpectedly"]],
        ["refused for now (429/503, no job made)", c["refused_for_now"]],
        ["lost", c["lost"]],
        ["wrong words", c["wrong_words"]],
        ["unread", c["unread"]],
        [
            "engine passes: jobs / passes / stored",
            f"{ledger['jobs']} / {ledger['passes']} / {ledger['by_outcome'].get('stored', 0)}",
        ],
        [
            "passes without an end: in killed processes / in database outages",
            f"{ledger['unended_in_killed_processes']} / {ledger.get('unended_in_database_outages', 0)}",
        ],
        ["engine problems", c["engine_problems"]],
        ["webhooks asked / delivered / missing / twice", _hooks(hooks)],
    ]
    for priority, lat in d["latency_seconds"].items():
        if lat.get("n"):
            rows.append([f"latency {priority}, p50 / p99 (n)", f"{lat['p50']} s / {lat['p99']} s ({lat['n']})"])
    rows += [
        [
            "/healthz outages (longest)",
            f"{health['outages']} ({health['longest_outage_seconds']} s, {health['probes']} probes)",
        ],
        ["drain after the stream", f"{d['drain_seconds']} s"],
        ["kills", f"{len(d['chaos'])} ({', '.join(f'{t} {n}' for t, n in kills.items())})"],
        [
            f"targets (stack PSS growth ≤ {targets['max_pss_growth_pct']} %, "
            f"/healthz down ≤ {targets['max_outage_seconds']} s)",
            f"{targets['verdict']}: {targets['pss_growth_pct']} %, {targets['longest_outage_seconds']} s",
        ],
    ]
    out = [table(["measure", "result"], rows)]
    out.append(
        table(
            ["kind", "submitted", "accepted", "after a refusal"],
            [[k, v["submitted"], v["accepted"], v["accepted_after_refusal"]] for k, v in d["by_kind"].items()],
        )
    )
    memory = d["memory"]
    stack = memory["stack"]
    mem_rows = [["stack (all programs)", "—", stack["after_warmup_mib"], stack["end_mib"], f"{stack['growth_pct']} %"]]
    for name, m in sorted(memory.items()):
        if name == "stack" or not m.get("longest"):
            continue
        longest = m["longest"]
        mem_rows.append([name, m["stretches"], longest["start_mib"], longest["end_mib"], f"{m['worst_growth_pct']} %"])
    head = ["program", "lives (kills + 1)", "longest life: settled MiB", "its end MiB", "worst growth in a life"]
    out.append(table(head, mem_rows))
    return "\n\n".join(out) + "\n"


def _hooks(h: dict) -> str:
    return f"{h['asked']} / {h['delivered']} / {h['missing']} / {h['jobs_delivered_more_than_once']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="a soak.json")
    print(markdown(json.loads(parser.parse_args().report.read_text())), end="")


if __name__ == "__main__":
    main()
