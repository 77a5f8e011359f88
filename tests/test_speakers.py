"""The `speakers` analysis (models/analysis/speakers.py): its option, how it labels a
transcript from its turns, and who spoke when on a real conversation of three flite voices
whose turns are known.

The conversation's words are timed from its turns (each clip's words spread evenly over it),
so no Whisper model runs here; bench/speakers.py measures it on real transcripts.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from models.analysis import diarization, speakers
from models.errors import InvalidRequest

pytestmark = pytest.mark.timeout(300)

REQUIRE_SERVICES = os.environ.get("REQUIRE_SERVICES") == "1"
RATE = 16000
# (voice, what it says): three voices, eight turns, one of them short.
TURNS = [
    ("slt", "Good morning everyone, thank you for joining the call about the harbour project today."),
    ("rms", "Thanks. I have the numbers from the survey team, and they look better than we expected."),
    ("awb", "Before we go on, can somebody tell me when the report is due?"),
    ("slt", "It is due at the end of next month, so we still have some time to finish it."),
    ("rms", "Right."),
    ("awb", "Good. Then I would like to see the draft by the middle of the month, with the costs in it."),
    ("rms", "The costs are the hard part, because the prices of steel and concrete keep changing every week."),
    ("slt", "Let us put a range in the draft and settle the final figure in the last week."),
]
GAP = 0.4


def need(what: str, ok: bool) -> None:
    """Skip a test whose dependency is missing, or fail it when REQUIRE_SERVICES=1 (CI)."""
    if ok:
        return
    if REQUIRE_SERVICES:
        pytest.fail(f"required for the speakers analysis and missing: {what}")
    pytest.skip(f"{what} is not installed")


def need_diarization() -> None:
    need("the speakers extra (pip install torch==2.13.0 && pip install -e '.[speakers]')", speakers.missing() is None)
    need("flite (apt-get install flite)", shutil.which("flite") is not None)


def _speak(voice: str, text: str, tmp: Path) -> np.ndarray:
    from models.speech.audio import decode

    wav = tmp / f"{voice}.wav"
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(wav)], check=True)
    samples = decode(str(wav))
    # Without flite's own silence around the speech, so each turn's times are its speech's.
    frame = RATE // 100
    n = len(samples) // frame
    rms = np.sqrt(np.mean(samples[: n * frame].reshape(n, frame) ** 2, axis=1) + 1e-12)
    loud = np.flatnonzero(20 * np.log10(rms / rms.max()) > -40)
    return samples[loud[0] * frame : (loud[-1] + 1) * frame]


@pytest.fixture(scope="module")
def conversation(tmp_path_factory) -> tuple[np.ndarray, list[tuple[str, float, float]], dict]:
    """The samples, each turn's (voice, start, end), and a transcript whose words are timed
    from the turns, cut into segments of ten words that run across turns."""
    need_diarization()
    tmp = tmp_path_factory.mktemp("speakers")
    pieces, turns, words, at = [np.zeros(int(0.3 * RATE), dtype=np.float32)], [], [], 0.3
    for voice, text in TURNS:
        speech = _speak(voice, text, tmp)
        end = at + len(speech) / RATE
        turns.append((voice, at, end))
        said = text.split()
        step = (end - at) / len(said)
        for k, word in enumerate(said):
            words.append(
                {
                    "word": word,
                    "start": round(at + k * step, 3),
                    "end": round(at + (k + 1) * step, 3),
                    "probability": 0.9,
                    "voice": voice,
                }
            )
        pieces += [speech, np.zeros(int(GAP * RATE), dtype=np.float32)]
        at = end + GAP
    samples = np.concatenate(pieces).astype(np.float32)
    segments = []
    for i in range(0, len(words), 10):
        group = [{k: v for k, v in w.items() if k != "voice"} for w in words[i : i + 10]]
        segments.append(
            {
                "start": group[0]["start"],
                "end": group[-1]["end"],
                "text": " ".join(w["word"] for w in group),
                "words": group,
            }
        )
    result = {
        "text": " ".join(s["text"] for s in segments),
        "language": "en",
        "duration": len(samples) / RATE,
        "segments": segments,
    }
    return samples, turns, {"result": result, "voices": [w["voice"] for w in words]}


def _best_share(truth: list[str], found: list[str], weights: list[float]) -> float:
    """The share of `weights` labelled right under the best mapping of found labels to voices."""
    voices, labels = sorted(set(truth)), sorted(set(found))
    best = 0.0
    for perm in itertools.permutations(voices, min(len(voices), len(labels))):
        mapping = dict(zip(labels, perm, strict=False))
        right = sum(w for t, f, w in zip(truth, found, weights, strict=True) if mapping.get(f) == t)
        best = max(best, right)
    return best / sum(weights)


# -- parse: no extra needed ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected",
    [
        (True, {}),
        ("true", {}),
        ("1", {}),
        ("yes", {}),
        (" On ", {}),
        (3, {"speakers": 3}),
        (1, {"speakers": 1}),
        ("3", {"speakers": 3}),
        ("20", {"speakers": 20}),
        ({"min": 2, "max": 4}, {"min_speakers": 2, "max_speakers": 4}),
        ({"min": 2}, {"min_speakers": 2}),
        ({"max": "5"}, {"max_speakers": 5}),
        ("2-4", {"min_speakers": 2, "max_speakers": 4}),
        ("min=2,max=4", {"min_speakers": 2, "max_speakers": 4}),
        ("max=3", {"max_speakers": 3}),
        ("3-3", {"speakers": 3}),
        (False, None),
        ("false", None),
        ("", None),
        ("0", None),
        (None, None),
    ],
)
def test_parse(value, expected):
    assert speakers.parse(value) == expected


@pytest.mark.parametrize("value", ["x", 0, 21, -2, "21", "4-2", {"min": 0}, {"lo": 2}, [2], 2.5, "min=2,foo=3", "2-30"])
def test_parse_refuses(value):
    with pytest.raises(InvalidRequest, match=r"speakers must be true, a count from 1 to 20, or a range like 2-4|above"):
        speakers.parse(value)


def test_parse_says_what_to_send():
    with pytest.raises(InvalidRequest) as info:
        speakers.parse("x")
    assert str(info.value) == (
        "speakers must be true, a count from 1 to 20, or a range like 2-4 (or min=2,max=4), not 'x'"
    )


@pytest.mark.parametrize(
    "params, value",
    [
        ({}, True),
        ({"speakers": 1}, 1),
        ({"speakers": 3}, 3),
        ({"speakers": 20}, 20),
        ({"min_speakers": 2, "max_speakers": 4}, {"min": 2, "max": 4}),
        ({"min_speakers": 2}, {"min": 2}),
        ({"max_speakers": 5}, {"max": 5}),
        ({"min_speakers": 1, "max_speakers": 20}, {"min": 1, "max": 20}),
    ],
)
def test_given_parses_back(params, value):
    assert speakers.given(params) == value
    assert speakers.parse(speakers.given(params)) == params
    json.dumps(speakers.given(params))


@pytest.mark.parametrize("value", [True, "true", 1, 4, "3", "2-4", "min=2", "max=3", {"min": 2, "max": 5}, "3-3"])
def test_given_round_trips_what_a_door_parsed(value):
    params = speakers.parse(value)
    assert speakers.parse(speakers.given(params)) == params


def test_contract():
    assert (speakers.NAME, speakers.NEEDS_AUDIO, speakers.EXTRA) == ("speakers", True, "speakers")
    assert isinstance(speakers.VERSION, str)
    assert speakers.missing() is None or "whisperq[speakers]" in speakers.missing()


# -- apply: no extra needed ------------------------------------------------------------------------


def _word(text, start, end):
    return {"word": text, "start": start, "end": end, "probability": 0.9}


def _turn(speaker, start, end):
    return {"speaker": speaker, "start": start, "end": end}


def _output(*turns):
    return {
        "speakers": list(dict.fromkeys(t["speaker"] for t in turns)),
        "turns": list(turns),
        "speech_seconds": sum(t["end"] - t["start"] for t in turns),
        "embedding_seconds": 0.1,
    }


def _transcript(*segments):
    return {
        "text": " ".join(s["text"] for s in segments),
        "language": "en",
        "duration": max([s["end"] for s in segments], default=0.0) + 1.0,
        "segments": list(segments),
    }


def _segment(words, **more):
    return {
        "start": words[0]["start"],
        "end": words[-1]["end"],
        "text": " ".join(w["word"] for w in words),
        "words": words,
        **more,
    }


def test_apply_splits_a_segment_where_the_speaker_changes():
    result = _transcript(
        _segment(
            [
                _word("Hello", 0.0, 0.5),
                _word("there.", 0.5, 1.0),
                _word("General", 1.5, 2.2),
                _word("Kenobi.", 2.2, 3.0),
            ],
            avg_logprob=-0.2,
            compression_ratio=1.0,
        ),
        _segment([_word("Yes.", 3.5, 4.0)]),
    )
    before = copy.deepcopy(result)
    output = _output(_turn("A", 0.0, 1.0), _turn("B", 1.5, 4.0))
    out = speakers.apply(result, output, {})
    assert result == before  # not mutated
    segs = out["segments"]
    # Words are stored stripped: a split segment's text is its words joined with spaces.
    assert [(s["speaker"], s["start"], s["end"], s["text"]) for s in segs] == [
        ("A", 0.0, 1.0, "Hello there."),
        ("B", 1.5, 3.0, "General Kenobi."),
        ("B", 3.5, 4.0, "Yes."),
    ]
    assert segs[0]["avg_logprob"] == -0.2 and segs[1]["avg_logprob"] == -0.2
    assert segs[0]["compression_ratio"] != 1.0  # recomputed for the piece's text
    assert [w["speaker"] for s in segs for w in s["words"]] == ["A", "A", "B", "B", "B"]
    assert out["speakers"] == ["A", "B"] and out["turns"] == output["turns"]
    assert out["text"] == result["text"]
    json.dumps(out)


def test_a_split_segment_text_keeps_its_words_apart():
    words = [_word(w, 0.3 * i, 0.3 * i + 0.3) for i, w in enumerate("one two three four five six".split())]
    result = _transcript(_segment(words))
    out = speakers.apply(result, _output(_turn("A", 0.0, 0.9), _turn("B", 0.9, 1.8)), {})
    assert [s["text"] for s in out["segments"]] == ["one two three", "four five six"]
    assert " ".join(s["text"] for s in out["segments"]) == result["segments"][0]["text"]


def test_words_are_labelled_by_time_not_by_their_index():
    """The turn a word overlaps most; one in a pause, the nearest turn's speaker."""
    words = [
        _word("a", 0.0, 0.4),  # A
        _word("b", 0.8, 1.4),  # 0.2 s in A's turn, 0.4 s in B's: B
        _word("c", 2.05, 2.1),  # in the pause, nearer B's turn
        _word("d", 2.9, 3.0),  # in the pause, nearer C's turn
        _word("e", 3.2, 3.2),  # zero length, inside C's turn
        _word("f", 9.0, 9.5),  # after every turn: the last one's
    ]
    result = _transcript(_segment(words))
    output = _output(_turn("A", 0.0, 1.0), _turn("B", 1.0, 2.0), _turn("C", 3.0, 4.0))
    out = speakers.apply(result, output, {})
    assert [w["speaker"] for s in out["segments"] for w in s["words"]] == ["A", "B", "B", "C", "C", "C"]
    assert [s["text"] for s in out["segments"]] == ["a", "b c", "d e f"]


def test_words_merged_before_apply_are_still_labelled_right():
    """Redaction is applied before speakers and folds words into one tagged word: fewer words
    than the transcript run() saw, each labelled by its time."""
    from models.analysis import merged, redaction

    words = [
        _word("My", 0.0, 0.3),
        _word("number", 0.3, 0.6),
        _word("is", 0.6, 0.8),
        _word("415", 0.8, 1.4),
        _word("555", 1.4, 2.0),
        _word("0132.", 2.0, 2.8),
        _word("Thanks,", 3.5, 3.9),
        _word("got", 3.9, 4.2),
        _word("it.", 4.2, 4.6),
    ]
    result = _transcript(_segment(words))
    output = _output(_turn("A", 0.0, 2.8), _turn("B", 3.5, 4.6))
    params = redaction.parse("pii")
    runs = {"redact": (params, redaction.run(result, params, None)), "speakers": ({}, output)}
    out = merged(result, runs)
    segs = out["segments"]
    assert [(s["speaker"], s["text"]) for s in segs] == [
        ("A", "My number is [PHONE_NUMBER]."),
        ("B", "Thanks, got it."),
    ]
    assert [(w["word"], w["speaker"]) for s in segs for w in s["words"]] == [
        ("My", "A"),
        ("number", "A"),
        ("is", "A"),
        ("[PHONE_NUMBER].", "A"),
        ("Thanks,", "B"),
        ("got", "B"),
        ("it.", "B"),
    ]
    # The same by hand, and with an output of the first version (which listed a label per
    # word of the transcript it saw): apply reads the turns only.
    folded = copy.deepcopy(result)
    seg = folded["segments"][0]
    seg["words"] = [*words[:3], {**words[3], "word": "[PHONE_NUMBER].", "end": 2.8}, *words[6:]]
    old = {**output, "words": ["A"] * 6 + ["B"] * 3, "segment_speakers": ["A"]}
    for given in (output, old):
        labels = [w["speaker"] for s in speakers.apply(folded, given, {})["segments"] for w in s["words"]]
        assert labels == ["A"] * 4 + ["B"] * 3


def test_apply_without_words_labels_segments():
    result = {
        "text": "One. Two. Three.",
        "language": "en",
        "duration": 8.0,
        "segments": [
            {"start": 0.0, "end": 1.0, "text": "One."},
            {"start": 2.0, "end": 3.0, "text": "Two."},
            {"start": 6.5, "end": 7.0, "text": "Three."},  # in no turn: the nearest
        ],
    }
    out = speakers.apply(result, _output(_turn("A", 0.0, 1.2), _turn("B", 1.8, 5.0)), {})
    assert [s["speaker"] for s in out["segments"]] == ["A", "B", "B"]
    assert "words" not in out["segments"][0] and "speaker" not in result["segments"][0]


def test_apply_with_no_turns():
    result = _transcript(_segment([_word("Hm.", 0.0, 0.5)]))
    out = speakers.apply(result, _output(), {})
    assert out["segments"][0]["speaker"] is None and out["speakers"] == [] and out["turns"] == []


def test_short_flips_are_smoothed():
    spans = [(i * 0.2, i * 0.2 + 0.2) for i in range(9)]
    # A 0.2 s flip between two runs of one speaker is theirs; a 0.6 s turn stays.
    assert diarization._smooth([0, 1, 0, 0, 0, 0, 0, 0, 0], spans) == [0] * 9
    assert diarization._smooth([0, 1, 1, 1, 0, 0, 0, 0, 0], spans) == [0, 1, 1, 1, 0, 0, 0, 0, 0]
    # At the ends, and between two different speakers, a short run stays.
    assert diarization._smooth([0, 0, 0, 0, 0, 0, 0, 0, 1], spans) == [0, 0, 0, 0, 0, 0, 0, 0, 1]
    assert diarization._smooth([0, 0, 0, 1, 2, 2, 2, 2, 2], spans) == [0, 0, 0, 1, 2, 2, 2, 2, 2]
    # A short stretch of speech of its own ("yes" between pauses) is a turn, not a flip.
    owner = [0, 1, 2, 2, 2, 2, 2, 2, 2]
    assert diarization._smooth([0, 1, 0, 0, 0, 0, 0, 0, 0], spans, owner) == [0, 1, 0, 0, 0, 0, 0, 0, 0]
    assert diarization._smooth([0, 0, 0, 0, 1, 0, 0, 0, 0], spans, owner) == [0] * 9


def test_turns_end_at_long_pauses():
    spans = [(0.0, 1.0), (1.2, 2.0), (5.0, 6.0), (6.1, 7.0)]
    assert diarization._turns(["A", "A", "A", "B"], spans) == [
        {"speaker": "A", "start": 0.0, "end": 2.0},
        {"speaker": "A", "start": 5.0, "end": 6.0},
        {"speaker": "B", "start": 6.1, "end": 7.0},
    ]


def test_units_cover_each_stretch():
    spans, owner = diarization._units([(0.0, 1.0), (2.0, 2.1), (3.0, 3.6)])
    assert owner == [0, 0, 0, 0, 1, 2, 2]
    assert spans[0] == (0.0, 0.25) and spans[3][1] == 1.0 and spans[4] == (2.0, 2.1)
    assert spans[-1][1] == pytest.approx(3.6)


def test_run_on_silence():
    need("webrtcvad (the speakers extra)", speakers.missing() is None)
    result = {"text": "", "language": "en", "duration": 2.0, "segments": []}
    out = speakers.run(result, {}, np.zeros(2 * RATE, dtype=np.float32))
    assert out["speakers"] == [] and out["turns"] == [] and out["speech_seconds"] == 0
    json.dumps(out)


# -- run on real voices ----------------------------------------------------------------------------


def _share_of_speech(turns: list[tuple[str, float, float]], found: list[dict], step: float = 0.01) -> float:
    """The share of the true turns' time whose found speaker is right (under the best mapping of
    labels to voices): 1 minus missed speech and confusion."""
    times = [t for _, s, e in turns for t in np.arange(s, e, step)]
    truth = [v for v, s, e in turns for _ in np.arange(s, e, step)]
    labels = []
    for t in times:
        hit = [f["speaker"] for f in found if f["start"] <= t < f["end"]]
        labels.append(hit[0] if hit else "none")
    return _best_share(truth, labels, [1.0] * len(times))


def test_speech_is_found_in_the_audio(conversation):
    samples, turns, _made = conversation
    found = diarization._speech(samples)
    step = 0.01
    times = np.arange(0, len(samples) / RATE, step)
    said = np.array([any(s <= t < e for _, s, e in turns) for t in times])
    heard = np.array([any(s <= t < e for s, e in found) for t in times])
    assert (said & ~heard).sum() <= 0.03 * said.sum(), found
    assert (heard & ~said).sum() <= 0.1 * said.sum(), found


def test_three_voices_found_and_labelled(conversation):
    samples, turns, made = conversation
    result = made["result"]
    before = copy.deepcopy(result)
    output = speakers.run(result, {}, samples)
    json.dumps(output)
    assert result == before
    assert len(output["speakers"]) == 3, output["turns"]
    assert output["speakers"] == ["A", "B", "C"]
    assert _share_of_speech(turns, output["turns"]) >= 0.9, output["turns"]
    assert output["embedding_seconds"] > 0 and output["speech_seconds"] > 0

    out = speakers.apply(result, output, {})
    assert result == before
    assert out["speakers"] == output["speakers"]
    words = [w for s in result["segments"] for w in s["words"]]
    labelled = [w for s in out["segments"] for w in s["words"]]
    assert [w["word"] for w in labelled] == [w["word"] for w in words]
    share = _best_share(made["voices"], [w["speaker"] for w in labelled], [w["end"] - w["start"] for w in words])
    assert share >= 0.9, (share, output["turns"])
    for seg in out["segments"]:
        assert {w["speaker"] for w in seg["words"]} == {seg["speaker"]}
        assert seg["text"] == " ".join(w["word"] for w in seg["words"])
        assert (seg["start"], seg["end"]) == (seg["words"][0]["start"], seg["words"][-1]["end"])
    # Segments of ten words run across turns: they are split at each change of speaker.
    assert len(out["segments"]) > len(result["segments"])


def test_speech_the_transcript_dropped_still_has_its_speaker(conversation):
    """Turns come from the audio: a transcript that lost the second half of the conversation
    (or holds nothing at all) still gets who spoke there."""
    samples, turns, made = conversation
    result = copy.deepcopy(made["result"])
    half = turns[len(turns) // 2][1]
    result["segments"] = [s for s in result["segments"] if s["end"] <= half]
    output = speakers.run(result, {}, samples)
    assert len(output["speakers"]) == 3
    later = [(v, s, e) for v, s, e in turns if s >= half]
    assert _share_of_speech(later, output["turns"]) >= 0.9, output["turns"]
    empty = {"text": "", "language": "en", "duration": len(samples) / RATE, "segments": []}
    assert _share_of_speech(turns, speakers.run(empty, {}, samples)["turns"]) >= 0.9


def test_a_count_given_or_bounded(conversation):
    samples, _turns, made = conversation
    assert len(speakers.run(made["result"], {"speakers": 2}, samples)["speakers"]) == 2
    assert len(speakers.run(made["result"], {"max_speakers": 2}, samples)["speakers"]) == 2
    assert len(speakers.run(made["result"], {"min_speakers": 4}, samples)["speakers"]) == 4


def test_segments_without_words(conversation):
    samples, turns, _made = conversation
    # A transcript without words: one segment per turn.
    result = {
        "text": "",
        "language": "en",
        "duration": len(samples) / RATE,
        "segments": [
            {"start": round(s, 3), "end": round(e, 3), "text": t}
            for (_, s, e), (_, t) in zip(turns, TURNS, strict=True)
        ],
    }
    output = speakers.run(result, {}, samples)
    assert len(output["speakers"]) == 3
    out = speakers.apply(result, output, {})
    found = [s["speaker"] for s in out["segments"]]
    share = _best_share([v for v, _, _ in turns], found, [e - s for _, s, e in turns])
    assert share >= 0.9, output


def test_a_real_two_person_recording_is_told_apart():
    """Real people, not a synthesiser (bench/recordings/real-speakers: pyannote.audio's sample,
    with its reference turns): two voices found, and of the time where one of them alone
    speaks at least 90 % is given to the right one under the best mapping (bench/speakers.py
    scores the same recording with pyannote.metrics: DER 10.5 %, docs/analyses/speakers.md)."""
    need_diarization()
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import real_voices

    samples, reference = real_voices.recording(), real_voices.reference()
    out = diarization.diarize(samples, {}, [])
    assert out["speakers"] == ["A", "B"], out["speakers"]
    alone = real_voices.solo(reference, len(samples) / RATE)
    truth, found, weights = [], [], []
    for voice, spans in alone.items():
        for start, end in spans:
            for turn in out["turns"]:
                overlap = min(end, turn["end"]) - max(start, turn["start"])
                if overlap > 0:
                    truth.append(voice)
                    found.append(turn["speaker"])
                    weights.append(overlap)
    covered = sum(weights) / sum(e - s for spans in alone.values() for s, e in spans)
    assert covered >= 0.85, covered  # the speech is found
    assert _best_share(truth, found, weights) >= 0.9, _best_share(truth, found, weights)
