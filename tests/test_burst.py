"""Load leveling under fire: a burst of 500 submissions as fast as the client can send
them, drained by the real pools while the inference worker is killed (kill -9) twice."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from api import submit_id
from helpers import CLIPS
from sqlalchemy import func, select

pytestmark = [
    pytest.mark.integration,
    pytest.mark.burst,
    pytest.mark.timeout(2400),
]  # the drain alone may take 1800 s (its own deadline)

BURST = 500


def test_a_burst_of_500_with_two_worker_kills_completes_each_job_exactly_once(app, worker, database):
    from models.jobs.record import Job

    audio = CLIPS["fox.flac"]["path"].read_bytes()

    def submit(n: int) -> str:
        return submit_id(app.test_client(), f"burst-{n}.flac", data=audio)

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        job_ids = list(pool.map(submit, range(BURST)))
    submitted_in = time.monotonic() - started
    assert len(set(job_ids)) == BURST

    def count(*statuses) -> int:
        with database.session() as s:
            return s.scalar(select(func.count()).select_from(Job).where(Job.id.in_(job_ids), Job.status.in_(statuses)))

    kills_at, kills, reports, killed = (BURST // 5, BURST // 2), [], [], set()
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        done = count("COMPLETED", "FAILED", "EXPIRED")
        if done == BURST:
            break
        if len(kills) < len(kills_at) and done >= kills_at[len(kills)]:
            killed.add(worker.inference.proc.pid)
            worker.kill_inference()
            kills.append(done)
            worker.restart_inference()
        reports.append(worker.sweep())  # beat's pass, without the start-up grace
        time.sleep(5)
    drained_in = time.monotonic() - started
    requeued = set(job_ids) & {i for r in reports for i in r.requeued}
    print(
        f"\nburst: {BURST} submitted in {submitted_in:.1f} s, drained in {drained_in:.0f} s, "
        f"kills after {kills} jobs, put back by the sweeper: {len(requeued)}"
    )

    assert len(kills) == 2, "the drain ended before both kills"
    assert count("COMPLETED") == BURST, {s: count(s) for s in ("PENDING", "PROCESSING", "FAILED", "EXPIRED")}
    with database.session() as s:
        assert s.scalar(select(func.count()).select_from(Job).where(Job.id.in_(job_ids))) == BURST
        rows = list(s.scalars(select(Job).where(Job.id.in_(job_ids))))
    assert all("fox" in job.result_text.lower() for job in rows)
    # The engine went through each job once, as the row counts it under the job's claim
    # (models.jobs.claims): a killed run never finished; a run whose claim was taken over is not
    # counted, and its transcript was not stored.
    runs = {job.id: job.engine_runs for job in rows}
    assert all(n == 1 for n in runs.values()), {job_id: n for job_id, n in runs.items() if n != 1}
    # And as the engine ledger has it, written where the engine ran: one stored pass per job,
    # any other one a pass of a killed worker that never ended (models.jobs.ledger).
    from models.jobs.ledger import Explained, passes, problems

    ledger = passes(database, job_ids)
    assert problems(ledger, Explained(killed=frozenset(killed))) == {}
    print(
        f"burst: engine passes {sum(map(len, ledger.values()))} for {BURST} jobs, killed mid-pass: "
        f"{sum(p.outcome is None for rows in ledger.values() for p in rows)}"
    )
