"""Benchmark: words to listen for (`hotwords`), on recordings with rare names made for the purpose.

Each sentence holds names tiny.en rarely spells right (people, places, products). flite's
`slt` voice speaks it; the bundled engine transcribes it with no hotwords, then with the
sentence's names as `hotwords` (as a job's `hotwords=` passes them), the same samples and
decoding. The table gives, for each way, the share of names written exactly (case and
punctuation aside) and the word error rate of the whole sentences (OpenAI's English
normaliser), and how much longer a decode with hotwords takes.

--jobs / BENCH_JOBS takes the first N sentences (default: all 12). Run with `make bench-hotwords`;
the table goes in docs/analyses/index.md:

    BENCH_JOBS=12 python bench/hotwords.py
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (sentence, its rare names)
SENTENCES = [
    ("Siobhan will present the quarterly numbers on Thursday.", ["Siobhan"]),
    ("Please forward the contract to Saoirse before noon.", ["Saoirse"]),
    ("Our new cluster runs on Kubernetes in the Frankfurt region.", ["Kubernetes"]),
    ("Niamh and Aoife approved the budget yesterday.", ["Niamh", "Aoife"]),
    ("The shipment from Szczecin arrives next week.", ["Szczecin"]),
    ("Doctor Nguyen reviewed the scans with Professor Okonkwo.", ["Nguyen", "Okonkwo"]),
    ("We migrated the billing service to Postgres and Grafana.", ["Postgres", "Grafana"]),
    ("Tadhg booked the conference room for the Anthropic call.", ["Tadhg", "Anthropic"]),
    ("The invoice for Xochitl was sent to Oaxaca.", ["Xochitl", "Oaxaca"]),
    ("Ask Joaquin whether the Reykjavik office signed off.", ["Joaquin", "Reykjavik"]),
    ("Caoimhe is leading the Terraform rollout this sprint.", ["Caoimhe", "Terraform"]),
    ("Send the draft to Wojciech and Krzysztof for review.", ["Wojciech", "Krzysztof"]),
]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def _speak(text: str, folder: Path, n: int):
    from models.speech import audio

    path = folder / f"s{n}.wav"
    subprocess.run(["flite", "-voice", "slt", "-t", text, "-o", str(path)], check=True, timeout=60)
    return audio.decode(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("BENCH_JOBS", len(SENTENCES))))
    args = parser.parse_args()
    import jiwer
    from whisper_normalizer.english import EnglishTextNormalizer

    from models.speech.engines import FasterWhisperEngine, bundled_model_path
    from models.speech.windows import split_windows

    normal = EnglishTextNormalizer()
    engine = FasterWhisperEngine(bundled_model_path(), cpu_threads=2)
    chosen = SENTENCES[: max(1, args.jobs)]
    rows = {"without hotwords": [], "with hotwords": []}
    seconds = {"without hotwords": 0.0, "with hotwords": 0.0}
    with tempfile.TemporaryDirectory() as tmp:
        for n, (sentence, names) in enumerate(chosen):
            samples = _speak(sentence, Path(tmp), n)
            windows = split_windows(samples)
            for way, hotwords in (("without hotwords", None), ("with hotwords", ", ".join(names))):
                started = time.perf_counter()
                segments = engine.transcribe_batch(
                    [w.samples(samples) for w in windows], [w.time_map() for w in windows], "en", hotwords=hotwords
                )
                seconds[way] += time.perf_counter() - started
                text = " ".join(s.text for segs in segments for s in segs)
                heard = set(_words(text))
                found = sum(all(w in heard for w in _words(name)) for name in names)
                wer = jiwer.wer(normal(sentence), normal(text) or "-")
                rows[way].append((found, len(names), wer, text))
                print(f"{way:17} {found}/{len(names)} names  {text}", flush=True)
    print(f"\n{len(chosen)} sentences, {sum(len(n) for _, n in chosen)} rare names, tiny.en, beam 5\n")
    print("| way | names written right | WER (all words) | decode time |")
    print("|---|---|---|---|")
    base = seconds["without hotwords"] or 1.0
    for way, results in rows.items():
        found = sum(r[0] for r in results)
        total = sum(r[1] for r in results)
        wer = sum(r[2] for r in results) / len(results)
        print(f"| {way} | {found}/{total} ({found / total:.0%}) | {wer:.1%} | {seconds[way] / base:.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
