"""Timed words into subtitle segments: every word kept once, in order, cut where a reader expects."""

import itertools

import pytest

from models.speech.segments import MAX_CUE_CHARS, MAX_CUE_SECONDS, TimedWord, cues, window_segments, window_words
from models.speech.windows import TimeMap


def words(spec: str, start: float = 0.0, step: float = 0.3, pause_after: dict | None = None) -> list[TimedWord]:
    """Words 0.25 s long every `step` s; `pause_after` adds silence after the word at an index."""
    out, at = [], start
    for i, w in enumerate(spec.split()):
        out.append(TimedWord(" " + w, round(at, 3), round(at + 0.25, 3), 0.9))
        at += step + (pause_after or {}).get(i, 0.0)
    return out


def test_every_word_is_kept_once_in_order():
    ws = words("one two three. four five six seven eight nine ten, eleven twelve thirteen fourteen " * 6)
    segs = cues(ws, with_words=True)
    assert [w["word"] for s in segs for w in s.words] == [w.text.strip() for w in ws]
    assert " ".join(s.text for s in segs) == " ".join(w.text.strip() for w in ws)
    assert all(a.end <= b.start for a, b in itertools.pairwise(segs))


def test_a_cue_ends_with_its_sentence_and_at_a_pause():
    segs = cues(words("Hello there. How are you today and", pause_after={5: 1.5}) + words("after the pause.", 5.0))
    assert [s.text for s in segs] == ["Hello there.", "How are you today", "and", "after the pause."]


def test_a_long_sentence_is_broken_at_its_last_clause_mark_else_near_its_middle():
    long = "first part of a long sentence that goes on, and then goes on and on without any end in sight at all"
    segs = cues(words(long))
    assert segs[0].text.endswith("goes on,")
    assert all(len(s.text) <= MAX_CUE_CHARS and s.end - s.start <= MAX_CUE_SECONDS for s in segs)
    plain = cues(words("word " * 40))
    assert len(plain) >= 2 and all(len(s.text) <= MAX_CUE_CHARS for s in plain)
    sizes = [len(s.text.split()) for s in plain]
    assert max(sizes) - min(sizes[:-1] or sizes) <= sizes[0]  # no one-word orphans in the middle


def test_words_are_placed_through_the_windows_time_map():
    # A window of two stretches: 0-2 s of the window is 10-12 s of the recording, 2-4 s is 20-22 s.
    where = TimeMap(((0.0, 10.0), (2.0, 20.0)))
    placed = window_words([(" a", 0.5, 0.8, 0.9), (" b", 1.9, 2.3, 0.9), (" c", 2.5, 2.9, 0.9)], where, 4.0)
    assert [(w.start, w.end) for w in placed] == [(10.5, 10.8), (20.0 - 0.1, 20.3), (20.5, 20.9)]
    # A plain offset is one stretch.
    assert window_words([(" a", 0.5, 0.8, 0.9)], 3.0, 4.0)[0].start == 3.5


def test_times_stay_inside_the_window_and_in_order():
    placed = window_words([(" a", -0.2, 0.3, 0.9), (" b", 0.2, 0.1, 0.9), (" c", 3.5, 9.0, 0.9)], 0.0, 4.0)
    assert placed[0].start == 0.0 and placed[1].start >= placed[0].start and placed[1].end >= placed[1].start
    assert placed[-1].end <= 4.0


def test_a_word_stretched_into_the_silence_before_it_is_cut_back():
    aligned = [
        (" Hello.", 0.2, 0.6, 0.9),
        (" Then", 0.6, 5.0, 0.9),
        (" more", 5.0, 5.3, 0.9),
        (" words.", 5.3, 5.6, 0.9),
    ]
    placed = window_words(aligned, 0.0, 6.0)
    assert placed[1].end == 5.0 and placed[1].start > 4.0


def test_text_the_alignment_could_not_time_is_still_kept():
    segs = window_segments(" Words with no timing.", [], TimeMap.at(30.0), 12.0, with_words=True)
    assert [(s.start, s.end, s.text, s.words) for s in segs] == [(30.0, 42.0, "Words with no timing.", ())]
    assert window_segments("", [], 0.0, 5.0) == []


@pytest.mark.parametrize("with_words", [False, True])
def test_words_are_shown_only_when_asked(with_words):
    segs = cues(words("one two three."), with_words=with_words)
    assert (segs[0].words is not None) == with_words
