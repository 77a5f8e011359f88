"""Make the long-form evaluation set: read texts with flite, lay them out with sox, encode Opus.

The committed recordings under bench/recordings/ (and the two the tests use, under
tests/fixtures/) were made by this script; run it again
(`python bench/make_recordings.py`, needs Debian's `flite` and `sox`) to rebuild them from
bench/recordings/texts.json. Each recording's text, how it was made and, for `pauses`, where
each sentence starts, go to bench/recordings/recordings.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "bench" / "recordings"
# These two are also the test suite's long-form fixtures.
IN_TESTS = {"harbour", "pauses"}
RATE = 16000
# Silence before each sentence of `pauses`: short and long, one longer than a 30 s window.
PAUSES = [0.5, 2.0, 5.0, 3.0, 8.0, 2.5, 12.0, 4.0, 35.0, 3.0, 6.0, 2.0]


def speak(text: str, tmp: Path) -> np.ndarray:
    """`text` read by flite's slt voice, as float32 mono at 16 kHz."""
    raw, wav = tmp / "raw.wav", tmp / "speech.raw"
    subprocess.run(["flite", "-voice", "slt", "-t", text, "-o", str(raw)], check=True)
    subprocess.run(
        ["sox", str(raw), "-r", str(RATE), "-c", "1", "-b", "16", "-e", "signed", "-t", "raw", str(wav)], check=True
    )
    return np.frombuffer(wav.read_bytes(), dtype="<i2").astype(np.float32) / 32768


def synth(tmp: Path, seconds: float, *effect: str) -> np.ndarray:
    """A sox `synth` sound of `seconds`, float32 mono at 16 kHz."""
    out = tmp / "synth.raw"
    subprocess.run(
        [
            "sox",
            "-n",
            "-r",
            str(RATE),
            "-c",
            "1",
            "-b",
            "16",
            "-e",
            "signed",
            "-t",
            "raw",
            str(out),
            "synth",
            f"{seconds:.3f}",
            *effect,
        ],
        check=True,
    )
    return np.frombuffer(out.read_bytes(), dtype="<i2").astype(np.float32) / 32768


def music(tmp: Path, seconds: float) -> np.ndarray:
    """Plucked chords (C, A minor, F, G), one every 1.5 s, for as long as asked."""
    chords = [("C3", "E4", "G4"), ("A2", "C4", "E4"), ("F2", "A3", "C4"), ("G2", "B3", "D4")]
    bars = []
    for n in range(int(seconds / 1.5) + 1):
        notes = [synth(tmp, 1.5, "pluck", note) for note in chords[n % len(chords)]]
        bars.append(sum(notes) / len(notes))
    return np.concatenate(bars)[: int(seconds * RATE)]


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.float32)


def joined(parts: list[np.ndarray], gap: float) -> np.ndarray:
    out = []
    for n, part in enumerate(parts):
        out += [silence(gap)] if n else []
        out.append(part)
    return np.concatenate(out)


def under(speech: np.ndarray, bed: np.ndarray, snr_db: float) -> np.ndarray:
    """`speech` over `bed` scaled to the signal-to-noise ratio asked (RMS of the speech's loud part)."""
    loud = speech[np.abs(speech) > 0.01]
    gain = np.sqrt(np.mean(loud**2) / np.mean(bed**2)) / (10 ** (snr_db / 20))
    mix = speech + bed[: len(speech)] * gain
    return (mix / max(1.0, float(np.abs(mix).max()) / 0.98)).astype(np.float32)


def write_opus(path: Path, samples: np.ndarray, bitrate: int = 24000) -> None:
    import av

    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    with av.open(str(path), "w", format="ogg") as out:
        stream = out.add_stream("libopus", rate=RATE, layout="mono")
        stream.bit_rate = bitrate
        for start in range(0, len(pcm), RATE):
            frame = av.AudioFrame.from_ndarray(pcm[None, start : start + RATE], format="s16", layout="mono")
            frame.sample_rate = RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def main() -> None:
    texts = json.loads((HERE / "texts.json").read_text())
    made: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        read = {name: [speak(p, tmp) for p in paras] for name, paras in texts.items() if name != "pauses"}

        def add(name: str, samples: np.ndarray, text: str, how: str, **extra) -> None:
            path = (ROOT / "tests" / "fixtures" if name in IN_TESTS else HERE) / f"{name}.opus"
            write_opus(path, samples)
            made[name] = {
                "file": str(path.relative_to(ROOT)),
                "text": text,
                "duration": round(len(samples) / RATE, 2),
                "made_with": how,
                **extra,
            }
            print(f"{name}: {len(samples) / RATE:.1f} s", file=sys.stderr)

        def words(*names: str) -> str:
            return " ".join(p for n in names for p in texts[n])

        add("harbour", joined(read["harbour"], 0.6), words("harbour"), "read prose; paragraphs 0.6 s apart")
        add(
            "orders",
            joined(read["orders"], 1.0),
            words("orders"),
            "numbers and names read as words; paragraphs 1 s apart",
        )
        parts, starts, at = [], [], 0.0
        for pause, sentence in zip(PAUSES, texts["pauses"], strict=False):
            spoken = speak(sentence, tmp)
            at += pause
            starts.append(round(at, 3))
            parts += [silence(pause), spoken]
            at += len(spoken) / RATE
        add(
            "pauses",
            np.concatenate([*parts, silence(1.0)]),
            words("pauses"),
            f"sentences after silences of {', '.join(f'{p:g}' for p in PAUSES)} s",
            sentence_starts=starts,
        )
        speech = joined(read["workshop"] + read["garden"], 0.8)
        add(
            "noise",
            under(speech, synth(tmp, len(speech) / RATE, "pinknoise"), 15.0),
            words("workshop", "garden"),
            "instructions and prose read over sox pink noise at 15 dB SNR; paragraphs 0.8 s apart",
        )
        speech = joined(read["orders"], 1.0)
        add(
            "music",
            under(speech, music(tmp, len(speech) / RATE), 10.0),
            words("orders"),
            "the orders read over plucked chords made with sox, 10 dB below the speech",
        )
        lecture = ["harbour", "orders", "workshop", "garden"]
        read["pauses"] = [speak(" ".join(texts["pauses"]), tmp)]
        add(
            "lecture",
            joined([p for n in [*lecture, "pauses"] for p in read[n]], 0.3),
            words(*lecture, "pauses"),
            "all the texts read on, paragraphs 0.3 s apart: five minutes cut into windows inside sentences",
        )
    (HERE / "recordings.json").write_text(json.dumps(made, indent=2) + "\n")


if __name__ == "__main__":
    main()
