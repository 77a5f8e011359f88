import json
import re

import pytest

from models.speech.formats import render

RESULT = {
    "job_id": "j1",
    "text": "Hello there. General Kenobi.",
    "language": "en",
    "duration": 3725.5,
    "segments": [
        {"start": 0.0, "end": 1.25, "text": " Hello there."},
        {"start": 1.25, "end": 3725.4996, "text": "General --> Kenobi."},
        {"start": 3725.5, "end": 3725.5, "text": "   "},
    ],
}


def test_txt_is_the_text():
    assert render(RESULT, "txt") == "Hello there. General Kenobi.\n"


def test_json_round_trips():
    assert json.loads(render(RESULT, "json")) == RESULT


def test_srt_numbers_cues_from_one_with_comma_milliseconds():
    srt = render(RESULT, "srt")
    blocks = srt.strip().split("\n\n")
    assert len(blocks) == 2  # the blank segment is dropped
    assert blocks[0].splitlines() == ["1", "00:00:00,000 --> 00:00:01,250", "Hello there."]
    assert blocks[1].splitlines()[0:2] == ["2", "00:00:01,250 --> 01:02:05,500"]
    for block in blocks:
        assert re.fullmatch(r"\d{2}:\d{2}:\d{2},\d{3} --> \d{2}:\d{2}:\d{2},\d{3}", block.splitlines()[1])


def test_vtt_has_header_and_dot_milliseconds():
    vtt = render(RESULT, "vtt")
    assert vtt.startswith("WEBVTT\n\n")
    cues = vtt.split("\n\n")[1:]
    assert cues[0].splitlines() == ["00:00:00.000 --> 00:00:01.250", "Hello there."]
    # "-->" may not appear inside a cue's text.
    assert "General -> Kenobi." in cues[1]
    assert vtt.count("-->") == 2


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="txt, json, srt, vtt"):
        render(RESULT, "docx")
