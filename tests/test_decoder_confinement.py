"""The decoder reads the upload's own bytes and nothing else.

An attack corpus, through the real API and real workers: playlists (HLS), concat scripts
and SDP session descriptions, under many names and by audio_url, pointing at a local
file and at a loopback HTTP server that counts its requests. Each is refused at the door
or transcribed as the bytes it carries; none reads the file or makes a request.
"""

from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
from api import upload, wait_for_job
from helpers import CLIPS, Receiver

from models.errors import SilentAudio, UnsupportedAudio
from models.speech import audio

pytestmark = pytest.mark.integration

SECRET_WORDS = {"quick", "brown", "fox", "lazy", "river"}  # fox.flac, the file an attack wants read


def tone_mp3(seconds: float = 2.0) -> bytes:
    """Real MP3 frames (a tone): what a door that sniffs content sees after a playlist."""
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp3") as out:
        stream = out.add_stream("libmp3lame", rate=16000, layout="mono")
        t = np.arange(int(16000 * seconds)) / 16000
        frame = av.AudioFrame.from_ndarray(
            (0.3 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2")[None], format="s16", layout="mono"
        )
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


def hls(target: str) -> bytes:
    return (
        b"#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n#EXTINF:10.0,\n"
        + target.encode()
        + b"\n#EXT-X-ENDLIST\n"
    )


def concat(target: str) -> bytes:
    return f"ffconcat version 1.0\nfile '{target}'\n".encode()


def sdp(port: int) -> bytes:
    return (
        f"v=0\no=- 0 0 IN IP4 127.0.0.1\ns=x\nc=IN IP4 127.0.0.1\nt=0 0\n"
        f"m=audio {port} RTP/AVP 0\na=rtpmap:0 PCMU/8000\n"
    ).encode()


@pytest.fixture()
def secret(tmp_path):
    path = tmp_path / "secret.flac"
    shutil.copy(CLIPS["fox.flac"]["path"], path)
    return path


@pytest.fixture()
def counter():
    with Receiver(
        {"/secret.flac": (200, {"Content-Type": "audio/flac"}, CLIPS["fox.flac"]["path"].read_bytes())}
    ) as rx:
        yield rx


def attacks(secret, counter) -> dict[str, bytes]:
    carrier = tone_mp3()
    http = counter.url("/secret.flac")
    return {
        "hls-file+mp3": hls(f"file://{secret}") + carrier,
        "hls-path+mp3": hls(str(secret)) + carrier,
        "hls-http+mp3": hls(http) + carrier,
        "hls-file": hls(f"file://{secret}"),
        "hls-http": hls(http),
        "concat-file": concat(str(secret)),
        "concat-http": concat(http),
        "sdp": sdp(counter.port),
    }


NAMES = ("talk.m3u8", "talk.m3u", "talk.hls", "talk.mp3", "talk.ffconcat", "talk.sdp", "talk")


def test_the_door_reads_no_other_file_and_makes_no_request(secret, counter):
    """models.speech.audio on its own, for every attack and name: refused, or the carrier's tone."""
    for kind, data in attacks(secret, counter).items():
        for name in NAMES:
            try:
                info = audio.probe(io.BytesIO(data))
            except (UnsupportedAudio, SilentAudio):
                continue
            assert info.format == "mp3" and info.duration < 3, (kind, name, info)
            samples = audio.decode(io.BytesIO(data), format=info.format)
            assert len(samples) < 16000 * 3, (kind, name)
    assert counter.requests == []


def test_a_pinned_container_is_never_another(secret):
    data = hls(f"file://{secret}") + tone_mp3()
    with pytest.raises(UnsupportedAudio):
        audio.decode(io.BytesIO(data), format="hls")
    with pytest.raises(UnsupportedAudio):
        audio.decode(io.BytesIO(CLIPS["fox.flac"]["path"].read_bytes()), format="concat")
    # A FLAC read as the Ogg the door did not find fails, it does not guess again.
    with pytest.raises(UnsupportedAudio):
        audio.decode(io.BytesIO(CLIPS["fox.flac"]["path"].read_bytes()), format="ogg")


def test_uploads_under_any_name_are_refused_or_read_as_their_own_bytes(client, worker, secret, counter):
    jobs = []
    for kind, data in attacks(secret, counter).items():
        for name in NAMES:
            resp = upload(client, name, data=data)
            if resp.status_code == 202:
                jobs.append((kind, name, resp.get_json()["job_id"]))
            else:
                assert resp.status_code in (415, 422), (kind, name, resp.get_json())
    assert jobs, "the carriers are real MP3: some uploads are taken, and must be read as MP3"
    for kind, name, job_id in jobs:
        job = wait_for_job(client, job_id, timeout=180)
        said = set((job.get("result") or {}).get("text", "").lower().replace(".", " ").replace(",", " ").split())
        assert not said & SECRET_WORDS, (kind, name, job["result"])
        assert job["status"] in ("COMPLETED", "FAILED"), job
        assert job["audio_duration"] is None or job["audio_duration"] < 3, (kind, name, job["audio_duration"])
    assert counter.requests == []


def test_audio_urls_serving_playlists_read_nothing_else(client, worker, secret, counter):
    carrier = tone_mp3()
    routes = {
        f"/{kind}/{name}": (200, {"Content-Type": "application/vnd.apple.mpegurl"}, data)
        for kind, data in attacks(secret, counter).items()
        for name in ("talk.m3u8", "talk.mp3")
    }
    routes["/plain.mp3"] = (200, {"Content-Type": "audio/mpeg"}, carrier)
    with Receiver(routes) as server:
        ids = {}
        for path in routes:
            resp = client.post("/v1/jobs", json={"audio_url": server.url(path)})
            assert resp.status_code == 202, resp.get_json()
            ids[path] = resp.get_json()["job_id"]
        for path, job_id in ids.items():
            job = wait_for_job(client, job_id, timeout=180)
            said = (job.get("result") or {}).get("text", "").lower()
            assert not any(w in said for w in SECRET_WORDS), (path, job)
            if job["status"] == "FAILED":
                assert "audio" in job["error"], job["error"]
    # Every job has ended (COMPLETED or FAILED for good): no decoder of theirs is left to fetch anything.
    assert counter.requests == []
    assert ids["/plain.mp3"] and wait_for_job(client, ids["/plain.mp3"])["status"] in ("COMPLETED", "FAILED")


def test_the_store_keeps_no_client_suffix(client, worker, settings):
    resp = upload(client, filename="talk.m3u8")
    assert resp.status_code == 202, resp.get_json()
    job = wait_for_job(client, resp.get_json()["job_id"])
    assert job["status"] == "COMPLETED" and job["filename"] == "talk.m3u8"  # shown back as given
    names = [p.name for p in (settings.data_dir / "audio").rglob("*") if p.is_file()]
    assert not any("." in n for n in names), names
