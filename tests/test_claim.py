"""The inference claim (models.jobs.claims): one run of the engine per job across processes.

The operations themselves against the suite's database (take, renew, the fence at commit, a
lapsed lease taken over); then two real inference worker processes handed the same job's
inference message, a holder killed with SIGKILL whose job the other worker takes over, and a
live holder stalled (SIGSTOP) past its lease, whose pass the engine ledger shows discarded:
the check the burst, scale-out, SQS and soak runs make (models.jobs.ledger.problems) fails on it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import uuid
from datetime import timedelta

import pytest
from conftest import start_worker, stop_worker
from helpers import CLIPS, make_job, wait_until

LEASE = 10.0  # the workers' WHISPERQ_CLAIM_LEASE_SECONDS here: a deferred message is back in 11 s
DATA = {"text": "The quick brown fox.", "language": "en", "segments": [], "duration": 4.2}


@pytest.fixture()
def worker_rt(settings, database):
    from models.runtime import Runtime

    return Runtime(settings)


def row(rt, job_id: str):
    from models.jobs.record import Job

    with rt.db.session() as session:
        job = session.get(Job, job_id)
        session.expunge(job)
        return job


def test_a_claim_is_taken_once_renewed_fenced_and_taken_over_when_its_lease_lapses(worker_rt):
    from models.errors import ClaimHeld, ClaimLost
    from models.jobs.claims import release_claim, renew_claim, take_claim
    from models.jobs.operations import complete_job
    from models.jobs.record import utcnow

    job_id = make_job(worker_rt).id
    now = utcnow()
    first = take_claim(worker_rt, job_id, "host-a:1", 60, now=now)
    held = row(worker_rt, job_id)
    assert (first.token, held.claim_token, held.claim_holder) == (1, 1, "host-a:1")
    assert held.claim_expires_at == now + timedelta(seconds=60)

    with pytest.raises(ClaimHeld, match="host-a:1") as refused:  # live: another worker runs nothing
        take_claim(worker_rt, job_id, "host-b:2", 60, now=now + timedelta(seconds=20))
    assert refused.value.retry_in == pytest.approx(41.0)  # until the lease could have lapsed, and a second

    assert renew_claim(worker_rt, first, now=now + timedelta(seconds=50))  # the holder lives on: to now + 110 s
    with pytest.raises(ClaimHeld):
        take_claim(worker_rt, job_id, "host-b:2", 60, now=now + timedelta(seconds=100))

    second = take_claim(worker_rt, job_id, "host-b:2", 60, now=now + timedelta(seconds=111))  # lapsed: taken over
    assert second.token == 2 and row(worker_rt, job_id).claim_holder == "host-b:2"
    assert not renew_claim(worker_rt, first)
    release_claim(worker_rt, first)  # a stale holder's release leaves the new holder's claim alone
    assert row(worker_rt, job_id).claim_expires_at is not None

    with pytest.raises(ClaimLost):  # the fence: the stale holder's transcript is discarded
        complete_job(worker_rt, job_id, DATA, first)
    stale = row(worker_rt, job_id)
    assert stale.status != "COMPLETED" and stale.result_text is None and not stale.engine_runs

    result, stored = complete_job(worker_rt, job_id, DATA, second)
    done = row(worker_rt, job_id)
    assert stored and result["text"] == DATA["text"]
    assert (done.status, done.engine_runs) == ("COMPLETED", 1)

    # A finished job's claim can always be taken (its duplicate is answered and dropped);
    # a released one at once.
    third = take_claim(worker_rt, job_id, "host-c:3", 60)
    release_claim(worker_rt, third)
    assert row(worker_rt, job_id).claim_expires_at is None
    assert take_claim(worker_rt, job_id, "host-c:3", 60).token == 4


def test_a_claim_on_no_job_says_so(worker_rt):
    from models.errors import PermanentJobError
    from models.jobs.claims import take_claim

    with pytest.raises(PermanentJobError, match="does not exist"):
        take_claim(worker_rt, str(uuid.uuid4()), "host-a:1", 60)


def test_a_held_claim_is_renewed_while_its_run_goes_on_and_knows_when_it_is_taken_over(worker_rt):
    from models.jobs.claims import kept, take_claim
    from models.jobs.record import utcnow

    job_id = make_job(worker_rt).id
    claim = take_claim(worker_rt, job_id, "host-a:1", 0.6)
    first_end = row(worker_rt, job_id).claim_expires_at
    with kept(worker_rt, claim, seconds=60):
        wait_until(lambda: row(worker_rt, job_id).claim_expires_at > first_end, 30, "the lease was never renewed")
        take_claim(worker_rt, job_id, "host-b:2", 60, now=utcnow() + timedelta(hours=1))  # a clock far ahead
        wait_until(claim.lost.is_set, 30, "the renewal never found the claim taken over")
    assert row(worker_rt, job_id).claim_holder == "host-b:2"


def test_an_inference_run_takes_the_claim_and_counts_its_attempt_in_one_transaction(worker_rt):
    """A worker killed at any moment after it took a job's claim has had its attempt counted:
    the claim, the stage and the attempt commit together (they were two transactions, and a
    kill between them cost the job no attempt), and a refused claim records nothing."""
    from models.errors import ClaimHeld
    from models.jobs.operations import begin_inference
    from models.jobs.record import Job, utcnow

    job_id = _prepared(worker_rt, "fox.flac").job_id
    first, done = begin_inference(worker_rt, job_id, "a@test", "wa", "host-a:1", 60)
    job = row(worker_rt, job_id)
    assert done is None and (job.claim_holder, job.claim_token, job.stage, job.attempts) == (
        "host-a:1",
        first.token,
        "infer",
        1,
    )

    with pytest.raises(ClaimHeld, match="host-a:1"):  # held live: nothing of this delivery is recorded
        begin_inference(worker_rt, job_id, "b@test", "wb", "host-b:2", 60)
    job = row(worker_rt, job_id)
    assert (job.claim_holder, job.claim_token, job.attempts, job.worker) == ("host-a:1", first.token, 1, "a@test")

    with worker_rt.db.session() as session:  # host-a was killed: its lease lapses unrenewed
        session.get(Job, job_id).claim_expires_at = utcnow() - timedelta(seconds=1)
    second, done = begin_inference(worker_rt, job_id, "b@test", "wb", "host-b:2", 60)
    job = row(worker_rt, job_id)
    assert done is None and second.token == first.token + 1
    assert (job.claim_holder, job.attempts, job.worker) == ("host-b:2", 2, "b@test")  # the killed run cost one


# Two real inference worker processes on a queue of this module's own.


def _queue() -> str:
    return f"whisperq.inference.claims-{uuid.uuid4().hex[:8]}"


def _publish(celery_app, message: dict, queue: str) -> None:
    from config.celeryconfig import broker_priority
    from tasks.transcription import infer

    infer.apply_async(
        (message,),
        task_id=message["job_id"],
        queue=queue,
        ignore_result=True,
        priority=broker_priority("normal", celery_app.conf.broker_url),
    )


def ledger_of(rt, job_id: str):
    from models.jobs.ledger import passes

    return passes(rt.db, [job_id])[job_id]


def ledger_problems(rt, job_ids, killed=()) -> dict[str, str]:
    from models.jobs.ledger import Explained, passes, problems

    return problems(passes(rt.db, job_ids), Explained(killed=frozenset(killed)))


def _drop(celery_app, *queues: str) -> None:
    """Delete this module's queues from the broker (the killed worker's message is left in one)."""
    with celery_app.connection_for_write() as conn:
        for queue in queues:
            conn.default_channel.queue_delete(queue)


def _settled(logs: str, job_id: str, deliveries: int) -> bool:
    """Whether `deliveries` of the job's inference message have ended (a deferred one is
    published again and ends later) and every one these logs took has ended, by Celery's own
    line for each start and end."""
    tag = rf"Task whisperq\.infer\[{re.escape(job_id)}\] "
    ends = re.findall(tag + r"(succeeded|raised|ignored|rejected|retry)", logs)
    received = len(re.findall(tag + "received", logs))
    return sum(end != "retry" for end in ends) >= deliveries and received == len(ends)


def _prepared(rt, clip: str):
    from models.jobs.record import new_job_id
    from models.pipeline.preparation import prepare_job

    return prepare_job(rt, new_job_id(), str(CLIPS[clip]["path"]), {"language": "en"})


def _two_workers(celery_app, tmp_path, queue: str):
    env = {"WHISPERQ_CLAIM_LEASE_SECONDS": str(LEASE)}
    first = start_worker(celery_app, tmp_path, "claims-a", queue, pool="threads", concurrency=1, extra_env=env)
    try:
        second = start_worker(celery_app, tmp_path, "claims-b", queue, pool="threads", concurrency=1, extra_env=env)
    except BaseException:
        stop_worker(first)
        raise
    return first, second


@pytest.mark.integration
@pytest.mark.brokers
def test_two_worker_processes_given_the_same_job_run_the_engine_once(worker_rt, celery_app, tmp_path):
    prepared = _prepared(worker_rt, "fox.flac")
    job_id, queue = prepared.job_id, _queue()
    workers = _two_workers(celery_app, tmp_path, queue)  # one slot each: each takes one of the two messages
    try:
        for _ in range(2):  # the broker delivers it twice
            _publish(celery_app, prepared.to_message(), queue)
        logs = lambda: "".join(w.output() for w in workers)  # noqa: E731
        wait_until(lambda: _settled(logs(), job_id, 2), 240, "the two deliveries never both ended")
    finally:
        for w in workers:
            stop_worker(w)
        _drop(celery_app, queue)
    job = row(worker_rt, job_id)
    assert job.status == "COMPLETED" and "fox" in job.result_text.lower(), (job.status, job.error)
    assert job.engine_runs == 1
    assert ledger_problems(worker_rt, [job_id]) == {}
    passes = ledger_of(worker_rt, job_id)
    assert len(passes) == 1 and passes[0].outcome == "stored" and passes[0].windows >= 1  # the engine ran once
    text = logs()
    assert text.count(f"job {job_id}: transcript stored") == 1
    # No second run went through the engine, stored or not (a run whose claim was taken over
    # says so, whether it found out at a window boundary or at the commit's fence).
    assert "transcript is discarded" not in text
    # Both were taken while the first ran: the second found the claim live and came back later.
    assert f"job {job_id}: job {job_id} is being transcribed by" in text, text[-3000:]


@pytest.mark.integration
@pytest.mark.brokers
def test_a_holder_killed_mid_run_is_taken_over_once_its_lease_lapses(worker_rt, celery_app, tmp_path):
    env = {"WHISPERQ_CLAIM_LEASE_SECONDS": str(LEASE)}
    prepared = _prepared(worker_rt, "bilingual.opus")  # about a minute of speech: killed long before its end
    job_id, first_queue, second_queue = prepared.job_id, _queue(), _queue()
    # Each worker on a queue of its own, both started before the kill: the redelivery reaches
    # the second while the dead holder's lease still runs.
    taker = start_worker(
        celery_app, tmp_path, "claims-taker", second_queue, pool="threads", concurrency=1, extra_env=env
    )
    try:
        holder = start_worker(
            celery_app, tmp_path, "claims-killed", first_queue, pool="threads", concurrency=1, extra_env=env
        )
        try:
            _publish(celery_app, prepared.to_message(), first_queue)
            mine = f"{socket.gethostname()}:{holder.proc.pid}"
            wait_until(
                lambda: (job := row(worker_rt, job_id)).claim_holder == mine and job.stage == "infer",
                120,
                "the first worker never claimed the job",
            )
        finally:
            holder.proc.kill()  # SIGKILL: no release, no ack
            holder.proc.wait()
        _publish(
            celery_app, prepared.to_message(), second_queue
        )  # the redelivery, as the broker or the sweeper sends it
        wait_until(
            lambda: row(worker_rt, job_id).status == "COMPLETED" and _settled(taker.output(), job_id, 1),
            240,
            "the job was never taken over",
        )
    finally:
        stop_worker(taker)
        _drop(celery_app, first_queue, second_queue)
    job = row(worker_rt, job_id)
    assert job.worker.startswith("claims-taker@") and job.engine_runs == 1 and job.attempts == 2
    # the engine ledger: the killed holder's pass never ended, the taker's was stored
    passes = ledger_of(worker_rt, job_id)
    assert [(p.process, p.outcome) for p in passes] == [
        (mine, None),
        (f"{socket.gethostname()}:{taker.proc.pid}", "stored"),
    ]
    assert ledger_problems(worker_rt, [job_id], killed={holder.proc.pid}) == {}
    assert job_id in ledger_problems(worker_rt, [job_id])  # a pass without an end and no kill to explain it
    assert "fishing boats" in job.result_text.lower()
    # It found the dead holder's claim live, came back once its lease had lapsed, and ran once.
    assert f"job {job_id} is being transcribed by {mine}" in taker.output()
    assert taker.output().count(f"job {job_id}: transcript stored") == 1


@pytest.mark.integration  # the ledger and the claim are the database's: one setup is enough
def test_a_live_holder_stalled_past_its_lease_leaves_a_discarded_pass_that_the_check_finds(
    worker_rt, celery_app, tmp_path
):
    """Duplicate engine work the stored transcript cannot show: a holder that is alive but
    stalled (SIGSTOP: a process starved on a busy machine) past its lease is taken over; when it
    runs again its pass ends discarded. engine_runs stays 1; the ledger's check does not pass."""
    env = {"WHISPERQ_CLAIM_LEASE_SECONDS": str(LEASE)}
    prepared = _prepared(worker_rt, "bilingual.opus")
    job_id, first_queue, second_queue = prepared.job_id, _queue(), _queue()
    taker = start_worker(
        celery_app, tmp_path, "stall-taker", second_queue, pool="threads", concurrency=1, extra_env=env
    )
    holder = None
    try:
        holder = start_worker(
            celery_app, tmp_path, "stall-holder", first_queue, pool="threads", concurrency=1, extra_env=env
        )
        _publish(celery_app, prepared.to_message(), first_queue)
        mine = f"{socket.gethostname()}:{holder.proc.pid}"
        wait_until(lambda: ledger_of(worker_rt, job_id), 120, "the holder's engine pass never started")
        os.kill(holder.proc.pid, signal.SIGSTOP)  # alive, holding its claim, renewing nothing
        try:
            _publish(celery_app, prepared.to_message(), second_queue)
            wait_until(lambda: row(worker_rt, job_id).status == "COMPLETED", 240, "the taker never stored the job")
        finally:
            os.kill(holder.proc.pid, signal.SIGCONT)
        wait_until(
            lambda: all(p.outcome for p in ledger_of(worker_rt, job_id)), 240, "the stalled holder's pass never ended"
        )
    finally:
        if holder is not None:
            stop_worker(holder)
        stop_worker(taker)
        _drop(celery_app, first_queue, second_queue)
    job = row(worker_rt, job_id)
    assert job.engine_runs == 1 and "fishing boats" in job.result_text.lower()  # what was stored looks fine
    passes = {p.process: p for p in ledger_of(worker_rt, job_id)}
    assert passes[mine].outcome == "discarded" and "taken over" in passes[mine].detail
    assert passes[f"{socket.gethostname()}:{taker.proc.pid}"].outcome == "stored"
    found = ledger_problems(worker_rt, [job_id], killed={holder.proc.pid})
    assert found and "ended discarded" in found[job_id], found


def test_a_pass_without_an_end_is_explained_by_its_process_killed_or_the_database_away_as_it_ran():
    """The ledger's judge: a stored pass and a pass that never ended, in a process nobody killed,
    is a problem, unless the database was killed while that pass ran (its end could not be
    written); a pass that started after the database was back is not excused."""
    from datetime import UTC, datetime, timedelta

    from models.jobs.ledger import STORED, EnginePass, Explained, problems

    at = datetime(2026, 12, 6, 20, 11, 3, tzinfo=UTC)

    def ledger(started: datetime) -> dict[str, list[EnginePass]]:
        unended = EnginePass(id=1, job_id="j", process="vm:10", windows=1, started_at=started, outcome=None)
        stored = EnginePass(id=2, job_id="j", process="vm:10", windows=1, started_at=at + timedelta(minutes=10))
        stored.outcome = STORED
        return {"j": [unended, stored]}

    away = ((at - timedelta(minutes=7), at + timedelta(minutes=2)),)  # killed at +1 s less the longest pass
    assert problems(ledger(at)) == {"j": "pass 1 in vm:10 never ended, and that process was not killed"}
    assert problems(ledger(at), Explained(killed=frozenset({10}))) == {}
    assert problems(ledger(at), Explained(unrecorded=away)) == {}
    assert problems(ledger(at + timedelta(minutes=3)), Explained(unrecorded=away)) != {}  # after it was back
