"""Benchmark: what encryption at rest costs, side by side with plain files.

Writes and reads --jobs / BENCH_JOBS MB (default 128; this benchmark's size is in MB, not
jobs) through models.security.sealed and through plain files in the data dir's file system
(BENCH_DIR, default a temporary dir), alternating run by run so drift hits both alike; then
decodes the 9.4 s fixture clip from an encrypted and a plain copy. Reports medians of
--runs / BENCH_RUNS runs (default 5) and the ratios. Run with `make bench-encryption`:

    BENCH_JOBS=128 BENCH_RUNS=5 python bench/encryption.py
"""

from __future__ import annotations

import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import knobs  # noqa: E402

from models.security.crypto import Keyring, new_key_line, parse_keys  # noqa: E402
from models.security.sealed import EncryptedWriter, open_decrypted  # noqa: E402
from models.speech import audio  # noqa: E402

KNOBS = knobs.read(__doc__, "128", runs=5, what="MB")
RUNS, MB = KNOBS.runs, KNOBS.size
BLOCK = 1024 * 1024


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    keyring = Keyring(tuple(parse_keys(new_key_line("bench"))))
    work = Path(tempfile.mkdtemp(prefix="whisperq-bench-", dir=os.environ.get("BENCH_DIR")))
    data = secrets.token_bytes(BLOCK)
    plain_path, sealed_path = work / "plain.bin", work / "sealed.bin"

    def write_plain():
        with open(plain_path, "wb") as fh:
            for _ in range(MB):
                fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    def write_sealed():
        with EncryptedWriter(sealed_path, keyring) as fh:
            for _ in range(MB):
                fh.write(data)
        with open(sealed_path, "rb") as fh:
            os.fsync(fh.fileno())

    def read_plain():
        with open(plain_path, "rb") as fh:
            while fh.read(BLOCK):
                pass

    def read_sealed():
        with open_decrypted(sealed_path, keyring) as fh:
            while fh.read(BLOCK):
                pass

    clip = ROOT / "tests" / "fixtures" / "report.opus"
    wav = work / "clip.wav"
    import av  # the clip as WAV, so the plain and encrypted copies differ only in sealing

    with av.open(str(clip)) as src, av.open(str(wav), "w", format="wav") as dst:
        stream = dst.add_stream("pcm_s16le", rate=16000, layout="mono")
        resampler = av.AudioResampler(format="s16", layout="mono", rate=16000)
        for frame in src.decode(audio=0):
            for out in resampler.resample(frame):
                for packet in stream.encode(out):
                    dst.mux(packet)
        for packet in stream.encode(None):
            dst.mux(packet)
    sealed_wav = work / "clip.sealed"
    with EncryptedWriter(sealed_wav, keyring) as fh:
        fh.write(wav.read_bytes())

    def decode_plain():
        audio.decode(wav)

    def decode_sealed():
        with open_decrypted(sealed_wav, keyring) as fh:
            audio.decode(fh)

    pairs = [
        ("write", write_plain, write_sealed),
        ("read", read_plain, read_sealed),
        ("decode clip", decode_plain, decode_sealed),
    ]
    results = {name: ([], []) for name, _, _ in pairs}
    try:
        for run in range(RUNS):
            for name, plain, sealed in pairs:
                first, second = (plain, sealed) if run % 2 == 0 else (sealed, plain)
                t1, t2 = timed(first), timed(second)
                p, s = (t1, t2) if run % 2 == 0 else (t2, t1)
                results[name][0].append(p)
                results[name][1].append(s)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{MB} MB, {RUNS} runs, medians ({os.cpu_count()} CPUs)")
    print(f"{'':12} {'plain':>12} {'encrypted':>12} {'ratio':>7}")
    for name, (plain, sealed) in results.items():
        p, s = statistics.median(plain), statistics.median(sealed)
        if name == "decode clip":
            print(f"{name:12} {p * 1000:>9.1f} ms {s * 1000:>9.1f} ms {s / p:>6.2f}x")
        else:
            print(f"{name:12} {MB / p:>7.0f} MB/s {MB / s:>7.0f} MB/s {s / p:>6.2f}x")


if __name__ == "__main__":
    main()
