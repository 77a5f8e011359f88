"""The speech engine on real audio: windows, batching, and that batching changes nothing."""
import numpy as np
import pytest

from helpers import CLIPS, long_recording, word_error_rate
from models import audio
from models.speech import FasterWhisperEngine, bundled_model_path, is_multilingual, resolve_device
from models.windows import MAX_WINDOW_SECONDS, split_windows


@pytest.fixture(scope="module")
def engine():
    return FasterWhisperEngine(bundled_model_path(), device="cpu")


def test_bundled_model_is_english_only_and_runs_int8_on_cpu(engine):
    assert not is_multilingual(bundled_model_path())
    assert (engine.device, engine.compute_type) == ("cpu", "int8")
    assert resolve_device("cpu", "auto") == ("cpu", "int8")
    assert resolve_device("cuda", "auto") == ("cuda", "float16")


@pytest.mark.parametrize("name", ["fox.flac", "report.opus"])
def test_clips_come_out_right(engine, name):
    t = engine.transcribe(audio.decode(CLIPS[name]["path"]), language="en")
    assert word_error_rate(CLIPS[name]["text"], t.text) <= 0.1, t.text
    assert t.language == "en" and t.segments


def test_short_audio_is_one_window_and_long_audio_is_cut_in_silences():
    samples, _ = long_recording()
    assert split_windows(samples[: 16000 * 20]) == split_windows(samples[: 16000 * 20])[:1]
    windows = split_windows(samples)
    assert len(windows) >= 2
    assert all(0 < w.seconds <= MAX_WINDOW_SECONDS for w in windows)
    assert all(a.end <= b.start for a, b in zip(windows, windows[1:]))
    assert windows[-1].end <= len(samples)
    # Silence is not speech: a long silent stretch yields no window at all.
    assert split_windows(np.zeros(16000 * 40, dtype=np.float32)) == []


def test_long_audio_is_transcribed_across_windows(engine):
    samples, text = long_recording()
    t = engine.transcribe(samples, language="en", batch_size=4)
    assert word_error_rate(text, t.text) <= 0.15, t.text
    assert t.segments[-1].end > MAX_WINDOW_SECONDS  # times are offset by each window's start
    assert [s.start for s in t.segments] == sorted(s.start for s in t.segments)


def test_batched_and_unbatched_give_the_same_transcript(engine):
    samples, _ = long_recording()
    one = engine.transcribe(samples, language="en", batch_size=1)
    four = engine.transcribe(samples, language="en", batch_size=4)
    assert one == four


def test_a_window_reads_the_same_whatever_shares_its_batch(engine):
    fox, report = audio.decode(CLIPS["fox.flac"]["path"]), audio.decode(CLIPS["report.opus"]["path"])
    alone = engine.transcribe_batch([fox], [0.0], "en")
    mixed = engine.transcribe_batch([report, fox, report[: 16000 * 3]], [0.0, 0.0, 0.0], "en")
    assert mixed[1] == alone[0]
