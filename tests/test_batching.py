"""The batcher on its own, with a stand-in for the model: batch forming, priority,
failure isolation, withdrawal."""

import threading
import time

import pytest

from models.speech.batching import Batcher


class Recorder:
    def __init__(self, delay: float = 0.0, poison=None):
        self.delay, self.poison = delay, poison
        self.calls: list[tuple] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()  # a batch is in the stand-in model (held there while the gate is shut)

    def __call__(self, key, payloads):
        self.entered.set()
        self.gate.wait(10)
        self.calls.append((key, list(payloads)))
        if self.poison is not None and self.poison in payloads:
            raise ValueError(f"cannot run {self.poison}")
        time.sleep(self.delay)  # the stand-in model's run time
        return [f"{key}:{p}" for p in payloads]


def test_windows_of_many_jobs_share_a_batch():
    run = Recorder()
    b = Batcher(run, max_batch=4, max_wait=0.5)
    futures = []
    threads = [
        threading.Thread(target=lambda j=j: futures.extend(b.submit("en", [f"j{j}w0", f"j{j}w1"], job_id=f"j{j}")))
        for j in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(f.result(5) for f in futures) == sorted(f"en:j{j}w{w}" for j in range(4) for w in range(2))
    sizes = [len(p) for _, p in run.calls]
    assert sum(sizes) == 8 and max(sizes) == 4
    assert b.stats()["batches"] == len(run.calls)
    assert all(r.jobs >= 1 for r in b.records)
    b.close()


def test_a_lone_window_runs_after_the_wait_without_a_full_batch():
    b = Batcher(Recorder(), max_batch=8, max_wait=0.01)
    (fut,) = b.submit("en", ["only"])
    assert fut.result(5) == "en:only"
    assert b.stats()["recent_sizes"] == [1]
    b.close()


def test_higher_priority_windows_go_first():
    run = Recorder()
    run.gate.clear()  # hold the batcher busy on a first batch
    b = Batcher(run, max_batch=2, max_wait=0.0)
    first = b.submit("en", ["busy"], priority="normal")
    assert run.entered.wait(5), "the first batch never reached the model"
    lows = b.submit("en", ["low1", "low2", "low3", "low4"], priority="low")
    highs = b.submit("en", ["high1", "high2"], priority="high")
    run.gate.set()
    for f in first + lows + highs:
        f.result(5)
    order = [p for _, payloads in run.calls[1:] for p in payloads]
    assert order[:2] == ["high1", "high2"]
    assert order[2:] == ["low1", "low2", "low3", "low4"]
    b.close()


def test_windows_with_different_keys_never_share_a_batch():
    run = Recorder()
    b = Batcher(run, max_batch=8, max_wait=0.2)
    futures = b.submit(("en", "transcribe"), ["a", "b"]) + b.submit(("de", "translate"), ["c"])
    for f in futures:
        f.result(5)
    for key, payloads in run.calls:
        assert {p for p in payloads} <= ({"a", "b"} if key == ("en", "transcribe") else {"c"})
    b.close()


def test_one_bad_window_fails_alone():
    run = Recorder(poison="bad")
    b = Batcher(run, max_batch=8, max_wait=0.2)
    good = b.submit("en", ["g1", "g2"], job_id="good")
    bad = b.submit("en", ["bad"], job_id="poison")
    more = b.submit("en", ["g3"], job_id="good2")
    assert [f.result(5) for f in good + more] == ["en:g1", "en:g2", "en:g3"]
    with pytest.raises(ValueError, match="cannot run bad"):
        bad[0].result(5)
    b.close()


def test_withdrawn_windows_never_run():
    run = Recorder()
    run.gate.clear()
    b = Batcher(run, max_batch=1, max_wait=0.0)
    busy = b.submit("en", ["busy"])
    assert run.entered.wait(5), "the first batch never reached the model"
    gone = b.submit("en", ["gone1", "gone2"])
    assert b.cancel(gone) == 2
    run.gate.set()
    busy[0].result(5)
    # A window submitted after them has run: withdrawn ones, still waiting, would have gone first.
    (later,) = b.submit("en", ["later"])
    assert later.result(5) == "en:later"
    assert all(f.cancelled() for f in gone)
    assert [p for _, ps in run.calls for p in ps] == ["busy", "later"]
    b.close()


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError):
        Batcher(Recorder(), max_batch=0)


def test_parallel_batches_run_side_by_side():
    """With parallel=2 two batches run at once (each in its own thread, as CTranslate2's
    workers run them on a CPU)."""
    both = threading.Barrier(2, timeout=5)
    order = []

    def run(key, payloads):
        order.append(list(payloads))
        both.wait()  # would time out if the two batches ran one after the other
        return [f"{key}:{p}" for p in payloads]

    b = Batcher(run, max_batch=2, max_wait=0.05, parallel=2)
    low = b.submit("en", ["l0", "l1"], priority="low")
    high = b.submit("en", ["h0", "h1"], priority="high")
    assert [f.result(10) for f in high + low] == ["en:h0", "en:h1", "en:l0", "en:l1"]
    assert sorted(map(sorted, order)) == [["h0", "h1"], ["l0", "l1"]]
    assert b.stats()["parallel"] == 2 and b.stats()["batches"] == 2
    b.close()


def test_the_jobs_in_the_model_are_named_and_a_batch_is_recorded_before_its_results():
    """What tests and operators watch instead of sleeping: which jobs are in the model now,
    and a batch's record, there as soon as any of its results is."""
    run = Recorder()
    run.gate.clear()
    b = Batcher(run, max_batch=2, max_wait=0.0)
    futures = b.submit("en", ["a", "b"], job_id="job-1")
    assert run.entered.wait(5)
    assert b.stats()["running_jobs"] == ["job-1"]
    run.gate.set()
    futures[0].result(5)
    assert b.stats()["batches"] == 1 and b.stats()["recent_sizes"] == [2]
    assert b.stats()["running_jobs"] == []
    b.close()
