"""How fast the inference pool really goes, per model, measured on this worker process's
last batches: what a window costs, what a second of speech costs, and how much slower each
batch runs with k batches running side by side.

Why two costs: Whisper pads every window to 30 s, so a window of 9 s of speech costs much
more than a third of a full one; a speed in audio seconds per second measured on long
recordings would be the wrong one for a burst of short clips. Why by batches at once: a
lone job fills one batch on one of the batcher's lanes, a burst keeps every lane busy, and
the lanes share the machine (on a CPU two lanes do not go twice as fast as one). A speed
measured on jobs run one by one would be the wrong one for a burst, and the other way
round. Why speech seconds: a window holds speech only (silence is left out,
models.speech.windows), so a recording's length says little of its cost.

The figures go out in the worker's heartbeat (models.jobs.workers), at most a second after
a batch, for the estimates (models.jobs.eta) to read.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

# The batches a meter remembers: the pool's recent past, not the morning's.
HISTORY = 48


class Meter:
    """One model's batches in this process: (start, end, windows, speech seconds) of the last ones."""

    def __init__(self, lanes: int, batch: int):
        self.lanes, self.batch = lanes, batch
        self._batches: deque[tuple[float, float, int, float]] = deque(maxlen=HISTORY)
        self._lock = threading.Lock()
        self._seen = 0

    def record(self, start: float, end: float, windows: int, speech: float) -> None:
        with self._lock:
            self._seen += 1
            if self._seen > 1:  # the first batch loads the model: not the pool's speed
                self._batches.append((start, end, windows, speech))

    def figures(self) -> dict[str, Any]:
        """{"lanes", "batch", "window": seconds per window, "speech": seconds per speech second
        (a batch's run time ≈ window × windows + speech × speech seconds, fitted over the last
        batches), "slowdown": {k: a batch's run time over that fit, with k batches running}}."""
        with self._lock:
            batches = [(e - s, w, a) for s, e, w, a in self._batches if e > s]
            spans = [(s, e) for s, e, _w, _a in self._batches if e > s]
        out: dict[str, Any] = {"lanes": self.lanes, "batch": self.batch}
        if not batches:
            return out
        window, speech = _fit(batches)
        side_by_side = _running(spans)
        taken: dict[int, list[float]] = {}
        for (took, w, a), k in zip(batches, side_by_side, strict=True):
            fitted = window * w + speech * a
            if fitted > 0:
                sums = taken.setdefault(max(1, round(k)), [0.0, 0.0])
                sums[0] += took
                sums[1] += fitted
        return dict(
            out,
            window=round(window, 4),
            speech=round(speech, 5),
            slowdown={str(k): round(t / f, 3) for k, (t, f) in sorted(taken.items())},
        )


def _fit(batches: list[tuple[float, int, float]]) -> tuple[float, float]:
    """Least squares of took = window × windows + speech × seconds, neither negative, each
    batch weighted by 1/took² (relative errors: a short batch counts as much as a long one, as
    a short job's estimate matters as much as a long one's). Batches all of one shape cannot
    tell the two apart: then the speech carries it all."""
    ww = wa = aa = tw = ta = 0.0
    for t, w, a in batches:
        weight = 1.0 / (t * t)
        ww, wa, aa = ww + weight * w * w, wa + weight * w * a, aa + weight * a * a
        tw, ta = tw + weight * t * w, ta + weight * t * a
    det = ww * aa - wa * wa
    if det > 1e-6 * ww * aa:
        window, speech = (tw * aa - ta * wa) / det, (ta * ww - tw * wa) / det
        if window >= 0 and speech >= 0:
            return window, speech
        if window < 0:
            return 0.0, ta / aa
        return tw / ww, 0.0
    return (0.0, ta / aa) if aa > 0 else (tw / ww, 0.0)


def _running(spans: list[tuple[float, float]]) -> list[float]:
    """For each batch, how many batches ran on average while it ran (itself included)."""
    out = []
    for start, end in spans:
        overlap = sum(max(0.0, min(end, e) - max(start, s)) for s, e in spans)
        out.append(overlap / (end - start))
    return out


_meters: dict[str, Meter] = {}
_lock = threading.Lock()
_news = threading.Event()


def metered(
    run_batch: Callable[[Hashable, list[Any]], Sequence[Any]], model: str, lanes: int, batch: int, sample_rate: int
) -> Callable[[Hashable, list[Any]], Sequence[Any]]:
    """`run_batch` (models.speech.batching.Batcher's), timed into `model`'s meter. Its payloads
    are (samples, ...) at `sample_rate`."""
    with _lock:
        meter = _meters.setdefault(model, Meter(lanes, batch))

    def run(key: Hashable, payloads: list[Any]) -> Sequence[Any]:
        start = time.monotonic()
        results = run_batch(key, payloads)
        meter.record(start, time.monotonic(), len(payloads), sum(len(p[0]) for p in payloads) / sample_rate)
        _news.set()
        return results

    return run


def figures() -> dict[str, dict[str, Any]] | None:
    """This process's figures by model, for its heartbeat; None where it runs no batches."""
    with _lock:
        meters = dict(_meters)
    return {model: meter.figures() for model, meter in meters.items()} or None


def news() -> bool:
    """Whether a batch ran since the last call (the heartbeat then goes out early)."""
    fresh = _news.is_set()
    _news.clear()
    return fresh
