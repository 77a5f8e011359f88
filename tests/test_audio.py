import io

import pytest
from helpers import CLIPS

from models.errors import AudioTooLong, UnsupportedAudio
from models.speech import audio
from models.storage import clean_filename


@pytest.mark.parametrize("name, seconds", [("fox.flac", 4.3), ("report.opus", 9.385)])
def test_probe_measures_real_clips(name, seconds):
    info = audio.probe(CLIPS[name]["path"])
    assert info.duration == pytest.approx(seconds, abs=0.05)
    assert info.sample_rate in (16000, 48000)


def test_probe_refuses_text(tmp_path):
    f = tmp_path / "notes.wav"
    f.write_text("this is not audio at all " * 40)
    with pytest.raises(UnsupportedAudio, match="could not be decoded as audio"):
        audio.probe(f)


def test_probe_refuses_truncated_header(tmp_path):
    f = tmp_path / "cut.flac"
    f.write_bytes(CLIPS["fox.flac"]["path"].read_bytes()[:40])
    with pytest.raises(UnsupportedAudio):
        audio.probe(f)


def test_probe_enforces_the_length_limit():
    with pytest.raises(AudioTooLong, match="longer than the limit of 2 s"):
        audio.probe(CLIPS["fox.flac"]["path"], max_seconds=2)


def test_the_door_decodes_a_bounded_start_and_prepare_the_rest(tmp_path):
    """A silent file no longer than the door's decode is refused at the door; a longer one
    passes the door (only its start was decoded) and is refused when decoded in full."""
    import numpy as np
    from helpers import write_wav

    from models.errors import SilentAudio

    short = write_wav(tmp_path / "short.wav", np.zeros(int(16000 * audio.DOOR_SECONDS * 0.5), dtype=np.float32))
    with pytest.raises(SilentAudio, match="silent"):
        audio.probe(short)
    long = write_wav(tmp_path / "long.wav", np.zeros(int(16000 * (audio.DOOR_SECONDS + 4)), dtype=np.float32))
    assert audio.probe(long).duration == pytest.approx(audio.DOOR_SECONDS + 4, abs=0.01)
    with pytest.raises(SilentAudio, match="silent"):
        audio.decode(long)


def test_the_door_reads_a_long_files_length_from_its_header_and_decodes_only_its_start(monkeypatch):
    """The 9.4 s clip's header says its length: the door decodes PROOF_SECONDS of it (Opus
    frames are 20 ms) and takes the length from the header."""
    peaks = []
    real_peak = audio._peak
    monkeypatch.setattr(audio, "SILENCE", 2.0)  # every decoded frame is looked at
    monkeypatch.setattr(
        audio, "_peak", lambda frame: peaks.append(frame.samples / frame.sample_rate) or real_peak(frame)
    )
    info = audio.probe(CLIPS["report.opus"]["path"])
    assert info.duration == pytest.approx(9.385, abs=0.05)
    assert audio.PROOF_SECONDS <= sum(peaks) < audio.PROOF_SECONDS + 0.1, peaks


def test_a_file_whose_header_says_no_length_is_measured_by_its_packets():
    """A WebM as a browser's MediaRecorder writes it (streamed: no Duration element): the door
    decodes DOOR_SECONDS of it and counts the rest's packets, so the length is right."""
    import av
    import numpy as np

    class Streamed(io.RawIOBase):  # not seekable: the muxer cannot go back to write a Duration
        def __init__(self):
            self.data = bytearray()

        def writable(self):
            return True

        def write(self, b):
            self.data += bytes(b)
            return len(b)

    out, rate = Streamed(), 48000
    pcm = (np.sin(2 * np.pi * 440 * np.arange(int(rate * 7.5)) / rate) * 8000).astype(np.int16)
    with av.open(out, "w", format="webm") as container:
        stream = container.add_stream("libopus", rate=rate, layout="mono")
        for start in range(0, pcm.size, 960):
            frame = av.AudioFrame.from_ndarray(pcm[start : start + 960].reshape(1, -1), format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, start
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    data = bytes(out.data)
    with av.open(io.BytesIO(data)) as container:
        assert container.duration is None and container.streams.audio[0].duration is None
    assert audio.probe(io.BytesIO(data)).duration == pytest.approx(7.5, abs=0.05)
    with pytest.raises(AudioTooLong):
        audio.probe(io.BytesIO(data), max_seconds=5)


def test_decode_gives_16k_mono_float():
    samples = audio.decode(CLIPS["fox.flac"]["path"])
    assert samples.dtype.name == "float32"
    assert len(samples) / audio.SAMPLE_RATE == pytest.approx(4.3, abs=0.05)


@pytest.mark.parametrize(
    "raw, clean",
    [
        ("../../etc/passwd", "passwd"),
        ("C:\\x\\talk.mp3", "talk.mp3"),
        ("a\x00b\x1b[31m.wav", "ab[31m.wav"),
        ("", None),
        ("..", None),
        ("réunion ünï.flac", "réunion ünï.flac"),
    ],
)
def test_client_filenames_are_made_safe(raw, clean):
    assert clean_filename(raw) == clean


def test_the_store_names_a_file_by_its_job_alone(tmp_path):
    """No client suffix reaches the store, where FFmpeg could guess a demuxer from it."""
    from models.storage import LocalStorage

    store = LocalStorage(tmp_path)
    spooled = tmp_path / "upload"
    spooled.write_bytes(b"x")
    ref = store.store_audio(spooled, "0123abcd-0000-4000-8000-000000000000")
    assert ref == "audio/01/0123abcd-0000-4000-8000-000000000000"
