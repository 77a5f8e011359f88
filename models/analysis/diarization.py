"""Who spoke when in a recording: speaker diarization (models.analysis.speakers is the analysis).

Speech is found in the audio, not in the transcript (which drops some: DER counts who spoke
when over the audio): WebRTC's voice activity detector (webrtcvad, which Resemblyzer requires)
marks 30 ms frames, and runs of them closer than SPEECH_FILL are one stretch of speech. Where
it finds none, the transcript's words are the speech. The stretches are cut into short
windows (WINDOW seconds, HOP apart, none across a pause), each window turned into a voice
embedding by Resemblyzer's encoder (its 17 MB weights ship in its wheel: nothing is
downloaded), and the windows clustered by cosine distance with scikit-learn's average-linkage
agglomerative clustering: cut at THRESHOLD when the client gave no count (a cluster too small
to be a voice merged into its nearest), into exactly N clusters when it did, and kept within
a given min/max. Each stretch is then labelled in units of about STEP seconds, each unit
taking the speaker whose voice is nearest its own (the windows over it, weighted by how much
of it they cover); a flip shorter than MIN_TURN inside a stretch, between two runs of one
speaker, is smoothed away, and the units make the turns (a pause over TURN_GAP ends one).

Torch, Resemblyzer, webrtcvad and scikit-learn (the `speakers` extra) are imported inside the
functions that use them: importing this module loads none of them.
"""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Any

import numpy as np

SAMPLE_RATE = 16000
MAX_SPEAKERS = 20  # the most a recording is told apart into (a client's count is checked against it)
# Embedding windows over speech, in seconds: Resemblyzer's encoder was trained on 1.6 s.
WINDOW = 1.5
HOP = 0.75
# Speech is found in the audio by WebRTC's detector, on frames of VAD_FRAME seconds at
# aggressiveness VAD_MODE (0 to 3); runs of speech closer than SPEECH_FILL are one stretch
# (windows do not cross a longer pause), and a stretch shorter than MIN_SPEECH is a click.
VAD_MODE = 2
VAD_FRAME = 0.03
SPEECH_FILL = 0.2
MIN_SPEECH = 0.1
# Stretches are labelled in units of about STEP seconds (each a speaker: a turn changes there).
STEP = 0.25
# A stretch shorter than this still gets a window of its own (shorter ones only the nearest
# window's voice).
MIN_WINDOW = 0.3
# Cosine distance at which two groups of windows are different voices (bench/speakers.py).
THRESHOLD = 0.28
# A cluster of fewer windows than this is not a speaker of its own (unless a count asks for it).
MIN_WINDOWS = 4
# A cluster at most SATELLITE times the size of its nearest, whose centroid is within NEAR
# (cosine distance) of that one's, is merged into it.
NEAR = 0.17
SATELLITE = 0.25
# At most this many windows are clustered (an even sample of a longer recording's): average
# linkage keeps a distance for every pair (2000 windows, 25 minutes of speech: 32 MB).
MAX_CLUSTERED = 2000
# A pause longer than this ends a turn, even where the same speaker goes on after it.
TURN_GAP = 1.0
# A run of units of one speaker shorter than this, between units of another, is theirs.
MIN_TURN = 0.5
# Windows per call of the encoder, and its CPU threads: one, as the engine's batches run. On
# the 2-core CI machine with another process on one core, 64 windows took 0.27 s on one
# thread and 6.2 s on two (the second thread waits on the busy core at every step).
BATCH = 256
THREADS = 1
N_FFT, HOP_SAMPLES = 400, 160
# Volume each window is brought to before embedding (Resemblyzer's own target), dBFS.
TARGET_DBFS = -30.0


# -- speech, voices, turns -----------------------------------------------------------------------------------------


def _speech(samples: np.ndarray) -> list[tuple[float, float]]:
    """Where the audio holds speech: WebRTC's voice activity detector (webrtcvad, which
    Resemblyzer requires) on VAD_FRAME frames at VAD_MODE, speech runs closer than
    SPEECH_FILL joined and those shorter than MIN_SPEECH dropped."""
    import webrtcvad

    vad = webrtcvad.Vad(VAD_MODE)
    n = int(SAMPLE_RATE * VAD_FRAME)
    # A quiet recording brought up to a quarter of full scale first: the detector reads 16-bit
    # levels, and one at -60 dBFS is a few steps of them.
    peak = float(max(samples.max(), -samples.min())) if samples.size else 0.0
    gain = 0.25 / peak if 0.0 < peak < 0.25 else 1.0
    out: list[list[float]] = []
    block = n * 2000  # converted a minute at a time: no copy of a long recording's samples
    for at in range(0, len(samples) - n + 1, block):
        pcm = (np.clip(samples[at : at + block] * gain, -1.0, 1.0) * 32767).astype(np.int16)
        for i in range(len(pcm) // n):
            if not vad.is_speech(pcm[i * n : (i + 1) * n].tobytes(), SAMPLE_RATE):
                continue
            start = (at + i * n) / SAMPLE_RATE
            end = start + VAD_FRAME
            if out and start - out[-1][1] < SPEECH_FILL:
                out[-1][1] = end
            else:
                out.append([start, end])
    return [(round(a, 3), round(b, 3)) for a, b in out if b - a >= MIN_SPEECH]


def _stretches(spans: list[tuple[float, float]], duration: float) -> list[tuple[float, float]]:
    """Spans merged across pauses shorter than SPEECH_FILL, within the audio."""
    out: list[list[float]] = []
    for start, end in sorted(spans):
        start, end = max(0.0, min(start, duration)), max(0.0, min(end, duration))
        if end <= start:
            continue
        if out and start - out[-1][1] < SPEECH_FILL:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _windows(stretches: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """WINDOW-long windows HOP apart over each stretch (the last one ending with it); a stretch
    shorter than a window is one window, if it lasts MIN_WINDOW."""
    out: list[tuple[float, float]] = []
    for start, end in stretches:
        length = end - start
        if length < WINDOW:
            if length >= MIN_WINDOW:
                out.append((start, end))
            continue
        count = int(np.ceil((length - WINDOW) / HOP - 1e-9)) + 1
        for k in range(count):
            s = min(start + k * HOP, end - WINDOW)
            out.append((s, s + WINDOW))
    return out


def _units(stretches: list[tuple[float, float]]) -> tuple[list[tuple[float, float]], list[int]]:
    """Each stretch cut into equal pieces of about STEP seconds, the units labelled one by one;
    and each unit's stretch."""
    spans: list[tuple[float, float]] = []
    owner: list[int] = []
    for i, (start, end) in enumerate(stretches):
        count = max(1, round((end - start) / STEP))
        step = (end - start) / count
        spans += [(start + k * step, start + (k + 1) * step) for k in range(count)]
        owner += [i] * count
    return spans, owner


@lru_cache(maxsize=1)
def _encoder() -> Any:
    """Resemblyzer's voice encoder, loaded once per process (GPU where torch sees one), with
    what a first call pays once made here: librosa's mel filters, scikit-learn's import."""
    import warnings

    import sklearn.cluster  # noqa: F401

    with warnings.catch_warnings():  # Resemblyzer imports scipy.ndimage.morphology (deprecated)
        warnings.simplefilter("ignore", DeprecationWarning)
        from resemblyzer import VoiceEncoder

    encoder = VoiceEncoder(verbose=False)
    encoder.eval()
    _mel_basis()
    return encoder


@lru_cache(maxsize=1)
def _mel_basis() -> np.ndarray:
    import librosa

    return np.asarray(librosa.filters.mel(sr=SAMPLE_RATE, n_fft=N_FFT, n_mels=40), dtype=np.float32)


def _mel(chunk: np.ndarray) -> np.ndarray:
    """Resemblyzer's input (its audio.wav_to_mel_spectrogram: librosa's power mel spectrogram,
    25 ms frames 10 ms apart, 40 bands), computed here in one matrix product: librosa's own
    goes through an einsum that took 8 ms a window where this takes under 1."""
    padded = np.pad(chunk, N_FFT // 2)
    count = 1 + (len(padded) - N_FFT) // HOP_SAMPLES
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_SAMPLES][:count]
    power = np.abs(np.fft.rfft(frames * _hann(), axis=1)) ** 2
    return np.asarray(power.astype(np.float32) @ _mel_basis().T)


@lru_cache(maxsize=1)
def _hann() -> np.ndarray:
    return np.asarray(0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT), dtype=np.float32)


def _embed(samples: np.ndarray, windows: list[tuple[float, float]]) -> np.ndarray:
    """One L2-normed voice embedding per window: the full-length windows in plain batches, the
    shorter ones (a stretch under WINDOW) packed, each window brought to TARGET_DBFS first."""
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence, pad_sequence

    encoder = _encoder()
    target = 10 ** (TARGET_DBFS / 20)
    mels = []
    for start, end in windows:
        chunk = samples[int(start * SAMPLE_RATE) : int(end * SAMPLE_RATE)].astype(np.float32)
        rms = float(np.sqrt(np.mean(chunk**2))) if chunk.size else 0.0
        if rms > 1e-6:
            chunk = chunk * (target / rms)
        mels.append(torch.from_numpy(_mel(chunk)))
    groups: dict[int, list[int]] = {}
    full = max(len(m) for m in mels)
    for i, m in enumerate(mels):
        groups.setdefault(len(m) if len(m) == full else -1, []).append(i)
    out = np.zeros((len(windows), 256))
    threads = torch.get_num_threads()
    if encoder.device.type == "cpu":
        torch.set_num_threads(THREADS)
    try:
        with torch.inference_mode():
            for length, members in groups.items():
                for i in range(0, len(members), BATCH):
                    part = members[i : i + BATCH]
                    batch: Any = pad_sequence([mels[k] for k in part], batch_first=True).to(encoder.device)
                    if length < 0:
                        lengths = torch.tensor([len(mels[k]) for k in part])
                        batch = pack_padded_sequence(batch, lengths, batch_first=True, enforce_sorted=False)
                    _, (hidden, _) = encoder.lstm(batch)
                    raw = encoder.relu(encoder.linear(hidden[-1]))
                    out[part] = (raw / torch.norm(raw, dim=1, keepdim=True).clamp_min(1e-8)).cpu().numpy()
    finally:
        torch.set_num_threads(threads)
    return out


def _normed(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return np.asarray(x / np.maximum(norm, 1e-12))


def _centroids(embeddings: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return _normed(np.stack([embeddings[labels == k].sum(0) for k in range(labels.max() + 1)]))


def _agglomerate(embeddings: np.ndarray, count: int | None) -> np.ndarray:
    from sklearn.cluster import AgglomerativeClustering

    if len(embeddings) < 2:
        return np.zeros(len(embeddings), dtype=int)
    model = AgglomerativeClustering(
        n_clusters=count, distance_threshold=None if count else THRESHOLD, metric="cosine", linkage="average"
    )
    return np.asarray(model.fit_predict(embeddings))


def _absorb_small(embeddings: np.ndarray, labels: np.ndarray, keep: int) -> np.ndarray:
    """Clusters of fewer than MIN_WINDOWS windows (a window across two voices, a cough, a
    stretch unlike the rest of its speaker's) merged into the nearest other, smallest first,
    while more than `keep` clusters are left."""
    labels = np.unique(labels, return_inverse=True)[1]
    while labels.max() + 1 > keep:
        sizes = np.bincount(labels)
        small = int(sizes.argmin())
        if sizes[small] >= MIN_WINDOWS:
            break
        centroids = _centroids(embeddings, labels)
        similarity = centroids @ centroids[small]
        similarity[small] = -np.inf
        labels[labels == small] = int(similarity.argmax())
        labels = np.unique(labels, return_inverse=True)[1]
    return labels


def _absorb_satellites(embeddings: np.ndarray, labels: np.ndarray, keep: int) -> np.ndarray:
    """A cluster much smaller than its nearest, and close to it (centroids within NEAR), is
    part of it: windows of one voice at a change of speaker or of tone."""
    while labels.max() + 1 > keep:
        sizes = np.bincount(labels)
        centroids = _centroids(embeddings, labels)
        distance = 1 - centroids @ centroids.T
        np.fill_diagonal(distance, np.inf)
        nearest = distance.argmin(1)
        small = [
            k for k in range(len(sizes)) if distance[k, nearest[k]] < NEAR and sizes[k] <= SATELLITE * sizes[nearest[k]]
        ]
        if not small:
            break
        k = min(small, key=lambda k: sizes[k])
        labels[labels == k] = nearest[k]
        labels = np.unique(labels, return_inverse=True)[1]
    return labels


def _merge_down(embeddings: np.ndarray, labels: np.ndarray, count: int) -> np.ndarray:
    """Clusters merged, the pair nearest in average cosine distance first, down to `count`."""
    labels = np.unique(labels, return_inverse=True)[1]
    distance = 1 - embeddings @ embeddings.T
    while labels.max() + 1 > count:
        k = labels.max() + 1
        members = [labels == i for i in range(k)]
        best, pair = np.inf, (0, 1)
        for i in range(k):
            for j in range(i + 1, k):
                d = float(distance[np.ix_(members[i], members[j])].mean())
                if d < best:
                    best, pair = d, (i, j)
        labels[labels == pair[1]] = pair[0]
        labels = np.unique(labels, return_inverse=True)[1]
    return labels


def _cluster(embeddings: np.ndarray, params: dict[str, Any]) -> np.ndarray:
    """Each window's cluster: cut at THRESHOLD (small clusters absorbed), or the asked count,
    within min/max."""
    n = len(embeddings)
    low = params.get("speakers", params.get("min_speakers", 1))
    high = params.get("speakers", params.get("max_speakers", MAX_SPEAKERS))
    low, high = min(low, n), min(high, n)
    if n < 2:
        return np.zeros(n, dtype=int)
    labels = _absorb_satellites(embeddings, _absorb_small(embeddings, _agglomerate(embeddings, None), max(low, 1)), low)
    found = labels.max() + 1
    if found > high:
        return _merge_down(embeddings, labels, high)
    if found < low:
        # The tree cut into more clusters until `low` of them are not small (the first cuts
        # split off outliers), the small ones absorbed, then merged down to `low`.
        for k in range(low, min(n, low + 40) + 1):
            labels = _agglomerate(embeddings, k)
            if (np.bincount(labels) >= MIN_WINDOWS).sum() >= low:
                return _merge_down(embeddings, _absorb_small(embeddings, labels, 1), low)
        return _agglomerate(embeddings, low)
    return labels


def _smooth(labels: list[int], spans: list[tuple[float, float]], owner: list[int] | None = None) -> list[int]:
    """Runs shorter than MIN_TURN between two runs of one other speaker become theirs; with
    each unit's stretch (`owner`), only runs inside one stretch of speech (a short stretch of
    its own, between pauses, is a short turn: "yes", "right")."""
    labels = list(labels)
    owner = owner if owner is not None else [0] * len(labels)
    while True:
        runs: list[list[int]] = []  # [label, first, last]
        for i, lab in enumerate(labels):
            if runs and runs[-1][0] == lab:
                runs[-1][2] = i
            else:
                runs.append([lab, i, i])
        changed, r = False, 1
        while r < len(runs) - 1:
            (before, _, _), (lab, first, last), (after, _, _) = runs[r - 1 : r + 2]
            inside = owner[first - 1] == owner[first] or owner[last] == owner[last + 1]
            if before == after != lab and spans[last][1] - spans[first][0] < MIN_TURN and inside:
                # Three runs become one: the next run is left for the next pass.
                labels[first : last + 1] = [before] * (last - first + 1)
                changed, r = True, r + 2
            else:
                r += 1
        if not changed:
            return labels


def _turns(labels: list[str], spans: list[tuple[float, float]]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for lab, (start, end) in zip(labels, spans, strict=True):
        if turns and turns[-1]["speaker"] == lab and start - turns[-1]["end"] <= TURN_GAP:
            turns[-1]["end"] = round(max(turns[-1]["end"], end), 3)
        else:
            turns.append({"speaker": lab, "start": round(start, 3), "end": round(end, 3)})
    return turns


def _letters(k: int) -> str:
    name = ""
    k += 1
    while k:
        k, rest = divmod(k - 1, 26)
        name = chr(ord("A") + rest) + name
    return name


def _label_units(
    embeddings: np.ndarray, windows: list[tuple[float, float]], spans: list[tuple[float, float]], params: dict[str, Any]
) -> list[int]:
    """Each unit's voice: the windows clustered, then each unit's own embedding (the windows
    over it, weighted by how much of it they cover) given the nearest cluster's centroid."""
    # Voices are told apart on the full-length windows: a shorter one (a stretch under WINDOW)
    # is a noisier embedding. Past MAX_CLUSTERED (average linkage holds every pair of
    # windows in memory), an even sample of them.
    full = np.flatnonzero([end - start >= WINDOW - 1e-6 for start, end in windows])
    if len(full) < max(2, params.get("speakers", params.get("min_speakers", 1))):
        full = np.arange(len(windows))
    if len(full) > MAX_CLUSTERED:
        full = full[np.linspace(0, len(full) - 1, MAX_CLUSTERED).round().astype(int)]
    labels = _cluster(embeddings[full], params)
    centroids = _centroids(embeddings[full], labels)
    starts = np.array([w[0] for w in windows])
    ends = np.array([w[1] for w in windows])
    mids = (starts + ends) / 2
    out = []
    for start, end in spans:
        end = max(end, start + 0.02)
        # Windows are in time order and at most WINDOW long: those over the unit start here.
        lo, hi = np.searchsorted(starts, start - WINDOW), np.searchsorted(starts, end)
        overlap = np.clip(np.minimum(ends[lo:hi], end) - np.maximum(starts[lo:hi], start), 0, None)
        if overlap.sum() > 0:
            voice = _normed(overlap @ embeddings[lo:hi])
        else:  # a unit no window covers (a stretch too short): the nearest window's voice
            voice = embeddings[int(np.abs(mids - (start + end) / 2).argmin())]
        out.append(int((centroids @ voice).argmax()))
    return out


def _regions(samples: np.ndarray, fallback: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Speech: what the detector found; where it found none, the `fallback` spans (a
    transcript's words)."""
    found = _speech(samples)
    if found:
        return found
    return _stretches(fallback, len(samples) / SAMPLE_RATE)


def diarize(
    samples: np.ndarray, params: dict[str, Any], fallback: list[tuple[float, float]] | None = None
) -> dict[str, Any]:
    """Who spoke when in `samples` (16 kHz mono): the speakers ("A", "B", ... in the order they
    first speak), their turns, and the seconds of speech and of embedding. `params` may hold
    `speakers` (an exact count) or `min_speakers`/`max_speakers`; `fallback` is speech to use
    where the detector finds none (a transcript's words)."""
    regions = _regions(samples, fallback or [])
    spans, owner = _units(regions)
    seconds = 0.0
    windows = _windows(regions)
    if not spans:
        labels: list[int] = []
    elif not windows:  # speech too short to embed: one speaker
        labels = [0] * len(spans)
    else:
        _encoder()  # loaded once per process, not counted
        began = time.perf_counter()
        embeddings = _embed(samples, windows)
        seconds = time.perf_counter() - began
        labels = _smooth(_label_units(embeddings, windows, spans, params), spans, owner)
    # Letters in order of first appearance.
    order: dict[int, str] = {}
    for k in labels:
        if k not in order:
            order[k] = _letters(len(order))
    return {
        "speakers": list(order.values()),
        "turns": _turns([order[k] for k in labels], spans),
        "speech_seconds": round(sum(end - start for start, end in regions), 3),
        "embedding_seconds": round(float(seconds), 3),
    }
