"""PII redaction (models/analysis/redaction.py) on transcripts as Whisper writes them: what it
finds, that nothing it found is left in what clients get, and what it leaves alone."""

from __future__ import annotations

import copy
import json
import re

import pytest

from models.analysis import redaction
from models.errors import InvalidRequest

pytestmark = pytest.mark.timeout(60)

DEFAULT = ["EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "SPOKEN_DIGITS"]


def segment(text: str, start: float, words: bool = True) -> dict:
    """A segment as the engine stores it: words 0.3 s long, 0.1 s apart, punctuation attached."""
    out: dict = {"start": start, "text": text, "avg_logprob": -0.21, "no_speech_prob": 0.01}
    at, ws = start, []
    for w in text.split():
        ws.append({"word": w, "start": round(at, 3), "end": round(at + 0.3, 3), "probability": 0.87})
        at += 0.4
    out["end"] = round(at, 3)
    if words:
        out["words"] = ws
    return out


def transcript(*texts: str, words: bool = True) -> dict:
    segs, at = [], 0.0
    for t in texts:
        segs.append(segment(t, at, words))
        at = segs[-1]["end"] + 0.5
    return {
        "text": " ".join(texts),
        "language": "en",
        "duration": round(at, 3),
        "segments": segs,
        "language_probability": 1.0,
    }


def redacted(result: dict, value: object = "pii") -> tuple[dict, dict]:
    params = redaction.parse(value)
    assert params is not None
    output = redaction.run(result, params, None)
    return output, redaction.apply(result, output, params)


# ---------------------------------------------------------------------------------------------
# parse


@pytest.mark.parametrize("value", ["pii", "PII", True, "true", " yes "])
def test_pii_means_the_default_kinds(value):
    assert redaction.parse(value) == {"kinds": DEFAULT}


@pytest.mark.parametrize("value", [False, "", None, "false", "0", "off", [], "  "])
def test_off_means_not_asked(value):
    assert redaction.parse(value) is None


@pytest.mark.parametrize(
    ("value", "kinds"),
    [
        ("email,phone", ["EMAIL_ADDRESS", "PHONE_NUMBER"]),
        ("phone, email", ["EMAIL_ADDRESS", "PHONE_NUMBER"]),
        ('["card", "digits"]', ["CREDIT_CARD", "SPOKEN_DIGITS"]),
        (["ssn", "IBAN_CODE", "ip"], ["IBAN_CODE", "US_SSN", "IP_ADDRESS"]),
        ("credit_card,spoken-digits", ["CREDIT_CARD", "SPOKEN_DIGITS"]),
        ("pii,ssn", [*DEFAULT, "US_SSN"]),
        ("all", [*DEFAULT, "IBAN_CODE", "US_SSN", "IP_ADDRESS"]),
        ({"kinds": ["PHONE_NUMBER"]}, ["PHONE_NUMBER"]),
    ],
)
def test_kinds_are_picked_by_name_or_alias(value, kinds):
    assert redaction.parse(value) == {"kinds": kinds}


@pytest.mark.parametrize("value", ["email,passport", ["phone", "names"], '["email", 3]', "[email", 7, {"x": 1}])
def test_a_bad_value_says_what_to_send(value):
    with pytest.raises(InvalidRequest) as caught:
        redaction.parse(value)
    message = str(caught.value)
    for kind in ("email", "phone", "card", "digits", "ssn", "iban", "ip", "PHONE_NUMBER"):
        assert kind in message


def test_the_module_keeps_the_contract():
    assert redaction.NAME == "redact"
    assert isinstance(redaction.VERSION, str) and redaction.VERSION
    assert redaction.NEEDS_AUDIO is False
    assert redaction.EXTRA is None
    assert redaction.missing() is None


# ---------------------------------------------------------------------------------------------
# run and apply

# (segment texts as Whisper tiny.en writes them, the strings that must be gone, the kinds found)
CASES = [
    (
        ["Call me at 415-555-0132 or email jane.doe@example.com."],
        ["415-555-0132", "jane.doe@example.com", "555-0132", "jane.doe"],
        ["PHONE_NUMBER", "EMAIL_ADDRESS"],
    ),
    (["My card number is 4111 1111 1111 1111."], ["4111 1111 1111 1111", "4111"], ["CREDIT_CARD"]),
    (["My card number is 4111-1111-1111-1111, expiry 0927."], ["4111-1111-1111-1111"], ["CREDIT_CARD"]),
    (["The code is four one one one two two."], ["four one one one two two"], ["SPOKEN_DIGITS"]),
    (["Okay, it's 4 1 1 1 2 2."], ["4 1 1 1 2 2"], ["SPOKEN_DIGITS"]),
    (
        ["Yeah, my email is john dot smith at example dot com."],
        ["john dot smith at example dot com", "john dot smith", "smith"],
        ["EMAIL_ADDRESS"],
    ),
    (["You can reach me at jane.doe at gmail.com, thanks."], ["jane.doe at gmail.com", "jane.doe"], ["EMAIL_ADDRESS"]),
    (
        ["So my number is oh five five five, oh one three two."],
        ["oh five five five, oh one three two", "five five five"],
        ["SPOKEN_DIGITS"],
    ),
    (
        ["It's four one one one, one one one one, one one one one, one one one one."],
        ["four one one one, one one one one"],
        ["CREDIT_CARD"],
    ),
    (["Just call (415) 555-0132 after five."], ["(415) 555-0132", "555-0132"], ["PHONE_NUMBER"]),
    (["The London office is +44 20 7946 0958."], ["+44 20 7946 0958", "7946 0958"], ["PHONE_NUMBER"]),
    (
        ["Hi, this is Dana.", "My number is four one five,", "five five five, oh one three two.", "Thanks, bye."],
        ["four one five", "five five five, oh one three two"],
        ["PHONE_NUMBER", "PHONE_NUMBER"],
    ),
]


@pytest.mark.parametrize("words", [True, False], ids=["words", "no-words"])
@pytest.mark.parametrize(("texts", "secrets", "kinds"), CASES, ids=[c[0][0][:30] for c in CASES])
def test_what_it_finds_is_gone_from_what_clients_get(texts, secrets, kinds, words):
    result = transcript(*texts, words=words)
    output, shown = redacted(result)
    assert [e["kind"] for e in output["entities"]] == kinds
    assert output["count"] == len(kinds) and output["kinds"] == DEFAULT
    for dumped in (json.dumps(output), json.dumps(shown)):
        for secret in secrets:
            assert secret not in dumped
            assert secret.lower() not in dumped.lower()
    for kind in kinds:
        assert f"[{kind}]" in shown["text"]
    assert shown["text"] == " ".join(s["text"] for s in shown["segments"])
    assert shown["redacted"] == {"kinds": DEFAULT, "count": len(kinds)}
    if words:
        # every word is found in its segment's text, in order, and tags are whole words
        for s in shown["segments"]:
            assert " ".join(w["word"] for w in s["words"]) == s["text"]


def test_the_output_says_where_never_what():
    result = transcript("Hello there.", "Call me at 415-555-0132 or email jane.doe@example.com.")
    output = redaction.run(result, {"kinds": DEFAULT}, None)
    assert json.loads(json.dumps(output)) == output
    text = result["segments"][1]["text"]
    phone, email = output["entities"]
    assert set(phone) == {"kind", "segment", "start", "end", "time_start", "time_end"}
    assert (phone["segment"], text[phone["start"] : phone["end"]]) == (1, "415-555-0132")
    assert text[email["start"] : email["end"]] == "jane.doe@example.com"
    words = result["segments"][1]["words"]
    assert (phone["time_start"], phone["time_end"]) == (words[3]["start"], words[3]["end"])
    assert (email["time_start"], email["time_end"]) == (words[6]["start"], words[6]["end"])


def test_words_over_an_entity_become_one_word_with_the_tag():
    result = transcript("The code is four one one one two two.")
    before = copy.deepcopy(result)
    _, shown = redacted(result)
    assert result == before  # apply returns a new result
    original = result["segments"][0]["words"]
    words = shown["segments"][0]["words"]
    assert [w["word"] for w in words] == ["The", "code", "is", "[SPOKEN_DIGITS]."]
    assert words[:3] == original[:3]
    assert (words[3]["start"], words[3]["end"]) == (original[3]["start"], original[-1]["end"])
    assert shown["segments"][0]["text"] == "The code is [SPOKEN_DIGITS]."
    for key in ("avg_logprob", "no_speech_prob", "start", "end"):
        assert shown["segments"][0][key] == result["segments"][0][key]
    assert shown["language_probability"] == 1.0 and shown["duration"] == result["duration"]


def test_a_number_that_fails_luhn_is_not_a_card():
    result = transcript("My card number is 4111 1111 1111 1112.")
    assert redaction.run(result, {"kinds": ["CREDIT_CARD"]}, None)["entities"] == []
    assert "CREDIT_CARD" not in [e["kind"] for e in redaction.run(result, {"kinds": DEFAULT}, None)["entities"]]
    spoken = transcript("It's four one one one, one one one one, one one one one, one one one two.")
    assert [e["kind"] for e in redaction.run(spoken, {"kinds": DEFAULT}, None)["entities"]] == ["SPOKEN_DIGITS"]


@pytest.mark.parametrize(
    "text",
    [
        "So the meeting went well and we agreed on the plan for next quarter.",
        "We sold 1,200 units in 2023 and 2024, mostly in March.",
        "Have a look at example.com, I work at google dot com.",
        "It starts at 10:30 on page 12 of 40.",
        "I think one or two of them, maybe three.",
        "The version is 3.2 and it costs $49.99.",
    ],
)
def test_text_without_pii_is_left_alone(text):
    result = transcript(text)
    output, shown = redacted(result, "all")
    assert output["entities"] == [] and output["count"] == 0
    assert {k: v for k, v in shown.items() if k != "redacted"} == result
    assert shown["redacted"]["count"] == 0


def test_text_around_an_entity_is_unchanged():
    result = transcript(
        "Okay, so the invoice went out on Monday.",
        "If anything's wrong, call me at 415-555-0132 and I'll sort it.",
        "Thanks again, bye.",
    )
    _, shown = redacted(result)
    texts = [s["text"] for s in shown["segments"]]
    assert texts == [
        "Okay, so the invoice went out on Monday.",
        "If anything's wrong, call me at [PHONE_NUMBER] and I'll sort it.",
        "Thanks again, bye.",
    ]
    assert shown["segments"][0] == result["segments"][0] and shown["segments"][2] == result["segments"][2]


def test_optional_kinds_only_when_asked():
    result = transcript(
        "My social is 078-05-1120.",
        "The IBAN is GB82 WEST 1234 5698 7654 32.",
        "The server is at 192.168.10.24.",
    )
    secrets = ["078-05-1120", "GB82 WEST 1234 5698 7654 32", "WEST", "192.168.10.24"]
    output, shown = redacted(result, "ssn,iban,ip")
    assert [e["kind"] for e in output["entities"]] == ["US_SSN", "IBAN_CODE", "IP_ADDRESS"]
    for secret in secrets:
        assert secret not in json.dumps(shown) and secret not in json.dumps(output)
    only_email, _ = redacted(result, "email")
    assert only_email["entities"] == []


def test_only_the_kinds_asked_for():
    result = transcript("Call me at 415-555-0132 or email jane.doe@example.com.")
    output, shown = redacted(result, "email")
    assert [e["kind"] for e in output["entities"]] == ["EMAIL_ADDRESS"]
    assert shown["text"] == "Call me at 415-555-0132 or email [EMAIL_ADDRESS]."
    assert shown["redacted"] == {"kinds": ["EMAIL_ADDRESS"], "count": 1}


def test_a_word_the_text_does_not_hold_is_hidden_by_what_it_says():
    # words and text that disagree (a corrected text, an engine that cases words otherwise)
    result = transcript("Email jane.doe@example.com today.")
    result["segments"][0]["words"][1]["word"] = "Jane.Doe@Example.com"
    _, shown = redacted(result)
    assert [w["word"] for w in shown["segments"][0]["words"]] == ["Email", "[EMAIL_ADDRESS]", "today."]
    assert not re.search("jane", json.dumps(shown), re.IGNORECASE)


def test_a_long_transcript_is_quick():
    import time

    texts = [
        "So the meeting went well and we agreed on the plan for next quarter.",
        "Call me at 415-555-0132 or email jane.doe@example.com.",
        "The code is four one one one two two.",
    ] * 600  # about an hour and a half of speech
    result = transcript(*texts)
    began = time.perf_counter()
    output, shown = redacted(result, "all")
    assert time.perf_counter() - began < 20
    assert output["count"] == 1800
    assert "415-555-0132" not in json.dumps(shown)


@pytest.mark.parametrize(
    ("text", "hidden"),
    [
        # tiny.en on flite's "four one five, five five five, zero one three two": a digit dropped
        ("Please call me at 415-55-0132.", "415-55-0132"),
        # "four one one one, one one one one": "four" heard as "for", groups merged
        ("My card is for 111-111-11.", "111-111-11"),
    ],
)
def test_digit_groups_as_whisper_writes_spoken_digits_are_a_run(text, hidden):
    _, out = redacted(transcript(text))
    assert hidden not in json.dumps(out) and "[" in out["text"]


@pytest.mark.parametrize("text", ["In 2024, 15 people paid $1,500,000 for 3.5 acres.", "Version 2.13.0 shipped."])
def test_quantities_are_not_digit_runs(text):
    _, out = redacted(transcript(text))
    assert out["text"] == text


# -- fails closed: where the transcript is stored (models.jobs.analyses.hide_before_storing) ----------

SECRET = "Call me on four one five, five five five, zero one three two. Mail bob@example.com."


@pytest.fixture()
def redacting_job(settings, database):
    """A job asking for redaction, as a worker takes it for inference (its run is the caller's)."""
    from helpers import make_job

    from models.jobs.operations import begin_inference
    from models.runtime import Runtime

    rt = Runtime(settings)
    job = make_job(rt, audio_url="https://files.example.com/a.flac", analyses={"redact": {"kinds": list(DEFAULT)}})
    with rt.db.session() as session:
        from models.jobs.record import Job

        row = session.get(Job, job.id)
        row.start("w@test", "w1")
        row.stage = "queued"
    claim, _ = begin_inference(rt, job.id, "w@test", "w1", "host-a:1", 60)
    return rt, job.id, claim


def _stored_words(rt, job_id: str) -> str:
    """Everything the job's row holds of words, decrypted: its text, segments and extra."""
    from models.jobs.record import Job

    with rt.db.session() as session:
        job = session.get(Job, job_id)
        return json.dumps([job.result_text, job.result_segments, job.result_extra, job.correction])


def test_a_redacted_transcript_is_redacted_before_it_is_stored(redacting_job):
    from models.jobs.operations import complete_job, get_job

    rt, job_id, claim = redacting_job
    result, stored = complete_job(rt, job_id, transcript(SECRET), claim)
    kept = _stored_words(rt, job_id)
    assert stored and result["job_id"] == job_id
    assert "bob@example.com" not in kept and "four one five" not in kept and "[EMAIL_ADDRESS]" in kept
    job = get_job(rt, job_id)
    assert job.status == "COMPLETED" and job.result()["redacted"]["count"] >= 2  # no analysis pool needed
    assert job.result()["analyses"]["redact"]["status"] == "DONE"


def test_a_partial_transcript_of_a_cancelled_job_is_redacted_before_it_is_kept(redacting_job):
    from models.jobs.operations import cancel_running, get_job

    rt, job_id, claim = redacting_job
    partial = cancel_running(rt, job_id, transcript(SECRET), claim)
    assert partial["partial"] is True and "bob@example.com" not in json.dumps(partial)
    assert "bob@example.com" not in _stored_words(rt, job_id) and get_job(rt, job_id).status == "CANCELLED"


def test_a_redaction_that_fails_fails_the_job_and_keeps_no_text(redacting_job, monkeypatch):
    from models.errors import PermanentJobError
    from models.jobs.operations import complete_job, get_job

    rt, job_id, claim = redacting_job
    monkeypatch.setattr(redaction, "find", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("phonenumbers broke")))
    with pytest.raises(PermanentJobError, match=r"redact failed .*no transcript was kept"):
        complete_job(rt, job_id, transcript(SECRET), claim)
    job = get_job(rt, job_id)
    assert job.status == "FAILED" and "redact failed" in job.error and job.result() is None
    assert "bob" not in _stored_words(rt, job_id) and "four" not in _stored_words(rt, job_id)


def test_a_failed_redaction_of_a_partial_transcript_keeps_nothing(redacting_job, monkeypatch):
    from models.jobs.operations import cancel_running, get_job

    rt, job_id, claim = redacting_job
    monkeypatch.setattr(redaction, "find", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("phonenumbers broke")))
    assert cancel_running(rt, job_id, transcript(SECRET), claim) is None
    assert get_job(rt, job_id).status == "CANCELLED" and "bob" not in _stored_words(rt, job_id)


def settings_models() -> str:
    import os

    return os.environ["WHISPERQ_MODELS"]


def test_a_job_asking_for_redaction_is_never_shadowed_nor_exported(settings, database, tmp_path):
    from types import SimpleNamespace

    from config import Settings
    from models.jobs.operations import job_row
    from models.maintenance.dataset import _left_out

    shadowing = SimpleNamespace(
        settings=Settings.from_env(
            {
                "WHISPERQ_DATA_DIR": str(tmp_path),
                "WHISPERQ_MODELS": settings_models(),
                "WHISPERQ_SHADOW": "tiny.en=base:50",
            }
        )
    )
    ids = [f"{n:08x}-0000-4000-8000-000000000000" for n in range(60)]
    plain = [job_row(shadowing, i, "", duration=1.0, model="tiny.en") for i in ids]
    asked = [job_row(shadowing, i, "", duration=1.0, model="tiny.en", analyses={"redact": {}}) for i in ids]
    assert any(r.shadow for r in plain) and not any(r.shadow for r in asked)
    row = SimpleNamespace(
        deleted_at=None, audio_purged_at=None, result_purged_at=None, status="COMPLETED", audio_ref="x"
    )
    assert _left_out(SimpleNamespace(**vars(row), analyses={"redact": {}})) == "asked for redaction"
    assert _left_out(SimpleNamespace(**vars(row), analyses={"speakers": {}})) is None
