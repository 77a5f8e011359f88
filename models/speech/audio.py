"""Audio probing and decoding (PyAV/FFmpeg), confined to the bytes of the file itself.

FFmpeg picks a demuxer from the content and the file name, and some demuxers open other
files and URLs: an HLS or DASH playlist, a concat script, an SDP session description, an
image sequence. A client's upload named `talk.m3u8` would make a worker read whatever the
playlist names (a local file, an internal address) and hand its transcript back. So FFmpeg
is given a file object with no name, only the demuxers of self-contained audio and video
containers (DEMUXERS) are allowed, nested opens are refused (no protocol is allowed), and
the container found at the door is pinned for the decode in the preparation pool.
"""

from __future__ import annotations

import gc
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import av
import numpy as np

from models.errors import AudioTooLong, SilentAudio, UnsupportedAudio
from models.security.crypto import DecryptionError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer
    from av.audio.frame import AudioFrame
    from av.audio.stream import AudioStream
    from av.container import InputContainer

SAMPLE_RATE = 16000
SILENCE = 10 ** (-60 / 20)  # peak amplitude below -60 dBFS: nothing to hear
# FFmpeg's names of demuxers whose input is all in one file (matroska covers WebM; mov
# covers MP4, M4A, 3GP).
DEMUXERS = (
    "wav",
    "w64",
    "flac",
    "mp3",
    "ogg",
    "matroska",
    "webm",
    "mov",
    "mp4",
    "m4a",
    "3gp",
    "aac",
    "aiff",
    "caf",
    "asf",
    "amr",
    "amrnb",
    "amrwb",
)
# What the door decodes. A file whose header says how long it is gets its first PROOF_SECONDS
# decoded (the codec works on these bytes) and no more: its length is the header's, and the
# whole file is decoded once, in the preparation pool, which checks that length again. A file
# no longer than DOOR_SECONDS, or whose header says no length, is decoded up to DOOR_SECONDS
# (so a short silent clip is refused at once) and the rest of an unsaid length is measured by
# its packets, demuxed, not decoded. 2 s of Opus cost ~4 ms of the web's CPU; 0.1 s, ~0.2 ms.
DOOR_SECONDS = 2.0
PROOF_SECONDS = 0.1
_CONFINED = {
    "format_whitelist": ",".join(DEMUXERS),
    # Nested opens (a playlist's entries, a script's files) need a protocol: none is allowed.
    "protocol_whitelist": "none",
    "protocol_blacklist": "file,http,https,tcp,udp,rtp,rtsp,ftp,data,pipe,concat,subfile,crypto,hls,tls",
}
SUPPORTED = "upload audio such as WAV, FLAC, MP3, Ogg/Opus, WebM, M4A or AAC"


class _Unnamed(io.RawIOBase):
    """The bytes of a file and nothing about it: FFmpeg gets no name to guess a demuxer from."""

    name = "audio"

    def __init__(self, fh: BinaryIO):
        self._fh = fh

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        with memoryview(buffer) as view:
            data = self._fh.read(len(view))
            view[: len(data)] = data
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()


def _open(fh: BinaryIO, format: str | None) -> InputContainer:
    if format is not None and format.split(",")[0] not in DEMUXERS:
        raise UnsupportedAudio(f"the container {format!r} is not one this service decodes; {SUPPORTED}")
    try:
        return av.open(_Unnamed(fh), mode="r", format=format, options=dict(_CONFINED), metadata_errors="ignore")
    except av.error.FFmpegError as exc:
        raise UnsupportedAudio(
            f"the file could not be decoded as audio in a container this service reads ({_reason(exc)}); {SUPPORTED}"
        ) from exc


@dataclass(frozen=True)
class AudioInfo:
    duration: float
    codec: str
    sample_rate: int
    channels: int
    format: str = ""  # the demuxer to pin when the file is decoded in full


def _peak(frame: AudioFrame) -> float:
    """Peak amplitude of a decoded frame, 0..1 whatever its sample format."""
    data = frame.to_ndarray()
    if data.dtype.kind == "f":
        return float(np.abs(data).max(initial=0.0))
    # av types to_ndarray() as a union of float and integer arrays, which a kind check cannot
    # narrow: the float ones returned above, this dtype is an integer one
    info = np.iinfo(data.dtype)  # type: ignore[type-var]
    if data.dtype.kind == "u":
        mid = (int(info.max) + 1) / 2
        return float(np.abs(data.astype(np.float64) - mid).max(initial=0.0) / mid)
    return float(np.abs(data.astype(np.float64)).max(initial=0.0) / -int(info.min))


def _header_seconds(container: InputContainer, stream: AudioStream) -> float | None:
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration and container.duration > 0:
        return container.duration / 1_000_000
    return None


def probe(
    source: str | Path | BinaryIO,
    max_seconds: float | None = None,
    format: str | None = None,
    decode_seconds: float | None = DOOR_SECONDS,
) -> AudioInfo:
    """Prove a file is audio at bounded cost: its container (from DEMUXERS), its audio stream,
    and a decoded start: PROOF_SECONDS of a file whose header says it is longer than
    `decode_seconds`, else up to `decode_seconds` (all of it with None). The duration is the
    header's where it says one, else what was decoded plus the rest's packets, demuxed. A
    file longer than its header says is cut short while the preparation pool decodes it
    (`decode`'s max_seconds).
    Raises UnsupportedAudio, SilentAudio (what was decoded is all of it, and silent) or AudioTooLong.
    """
    too_long = f"the audio is longer than the limit of {max_seconds or 0:.0f} s; split it into shorter files"
    with _reading(source) as fh:
        try:
            with _open(fh, format) as container:
                if not container.streams.audio:
                    raise UnsupportedAudio(f"the file has no audio stream; {SUPPORTED}")
                stream = container.streams.audio[0]
                rate = stream.codec_context.sample_rate or stream.rate or 0
                header = _header_seconds(container, stream)
                if max_seconds is not None and header is not None and header > max_seconds:
                    raise AudioTooLong(too_long)
                budget = decode_seconds
                if budget is not None and header is not None and header > budget:
                    budget = PROOF_SECONDS  # the length is the header's: prove the codec, no more
                samples, peak, ended, demuxed = 0, 0.0, True, 0.0
                decoding = True
                for packet in container.demux(stream):
                    if not decoding:  # the header says no length: count the rest without decoding it
                        if packet.duration and packet.time_base:
                            demuxed += float(packet.duration * packet.time_base)
                        if max_seconds is not None and samples / rate + demuxed > max_seconds:
                            raise AudioTooLong(too_long)
                        continue
                    for frame in packet.decode():
                        samples += frame.samples
                        rate = frame.sample_rate or rate
                        if peak < SILENCE:
                            peak = max(peak, _peak(frame))
                    seconds = samples / rate if rate else 0.0
                    if max_seconds is not None and seconds > max_seconds:
                        raise AudioTooLong(too_long)
                    if budget is not None and samples and seconds >= budget:
                        ended = False  # the rest (and whether it is all silence) is for the preparation pool
                        if header is not None:
                            break
                        decoding = False
                codec = stream.codec_context.name
                channels = getattr(stream.codec_context, "channels", 0) or 0
                demuxer = container.format.name.split(",")[0]
        except (UnsupportedAudio, AudioTooLong, DecryptionError):
            raise
        except Exception as exc:  # FFmpeg says "Invalid data found", "End of file", ...
            raise UnsupportedAudio(f"the file could not be decoded as audio ({_reason(exc)}); {SUPPORTED}") from exc
    if not samples or not rate:
        raise UnsupportedAudio("the file contains no audio samples; upload a recording that is not empty")
    if peak < SILENCE and ended:
        raise SilentAudio("the audio is silent (nothing louder than -60 dBFS); upload a recording with speech in it")
    decoded = samples / rate
    if ended:
        duration = decoded
    elif header is not None:
        duration = max(header, decoded)
    else:
        duration = decoded + demuxed
    return AudioInfo(duration=duration, codec=codec, sample_rate=rate, channels=channels, format=demuxer)


def decode(source: str | Path | BinaryIO, format: str | None = None, max_seconds: float | None = None) -> np.ndarray:
    """The whole audio as float32 mono at 16 kHz, the model's input, decoded with the
    container pinned (`format`, as the door found it) or one of DEMUXERS. Past `max_seconds`
    decoding stops with AudioTooLong; all silence is SilentAudio."""
    chunks: list[np.ndarray] = []
    total, limit = 0, None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    try:
        with _reading(source) as fh, _open(fh, format) as container:
            if not container.streams.audio:
                raise UnsupportedAudio(f"the file has no audio stream; {SUPPORTED}")
            for frame in _frames(container):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
                    total += out.samples
                if limit is not None and total > limit:
                    raise AudioTooLong(
                        f"the audio is longer than the limit of {max_seconds:.0f} s; split it into shorter files"
                    )
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
    except (UnsupportedAudio, AudioTooLong, DecryptionError):
        raise
    except Exception as exc:
        raise UnsupportedAudio(f"the audio could not be decoded ({_reason(exc)})") from exc
    finally:
        # PyAV's resampler leaves reference cycles that only the collector frees
        # (faster-whisper#390). They are young: collecting the two young generations frees
        # them at a fraction of a full collection's cost (which scans every object of a
        # process holding a model: 35 of a 9.4 s clip's 56 ms of decoding). Measured over
        # 150 decodes: the same peak memory as a full collection each time.
        gc.collect(1)
    audio = (np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)).astype(np.float32) / 32768.0
    if audio.size == 0:
        raise UnsupportedAudio("the file contains no audio samples")
    if float(np.abs(audio).max()) < SILENCE:
        raise SilentAudio("the audio is silent (nothing louder than -60 dBFS); upload a recording with speech in it")
    return audio


def _frames(container: InputContainer) -> Iterator[AudioFrame]:
    """The audio stream's frames; a frame FFmpeg cannot decode is skipped, as faster-whisper does."""
    packets = container.demux(container.streams.audio[0])
    for packet in packets:
        try:
            yield from packet.decode()
        except av.error.InvalidDataError:
            continue


class _reading:
    """A path opened for reading (closed after), or a file object as it is (left open)."""

    def __init__(self, source: str | Path | BinaryIO):
        self.source = source
        self.opened: BinaryIO | None = None

    def __enter__(self) -> BinaryIO:
        source = self.source
        if not isinstance(source, (str, os.PathLike)):  # a file object (has `read`)
            return source
        self.opened = open(source, "rb")
        return self.opened

    def __exit__(self, *exc: object) -> None:
        if self.opened is not None:
            self.opened.close()


def _reason(exc: Exception) -> str:
    text = (getattr(exc, "strerror", None) or str(exc)).strip() or type(exc).__name__
    # FFmpeg errors repeat the file path; the client does not need our paths.
    return text.split(":", 1)[0][:200] if "/" in text else text[:200]
