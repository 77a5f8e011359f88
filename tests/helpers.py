"""Helpers shared by the tests: fixture clips, word error rate, waiting for a condition (the HTTP
API's own helpers, waiting for a job included, are in api.py)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROOT = FIXTURES.parent.parent
CLIPS = {
    name: dict(meta, path=FIXTURES / name) for name, meta in json.loads((FIXTURES / "clips.json").read_text()).items()
}
# Long-form recordings (a minute or more, several windows) from the evaluation set that
# bench/make_recordings.py makes; the ones kept under tests/fixtures/.
LONG_FORM = {
    name: dict(meta, path=ROOT / meta["file"])
    for name, meta in json.loads((ROOT / "bench" / "recordings" / "recordings.json").read_text()).items()
    if meta["file"].startswith("tests/")
}
# The service may lose no more than this to faster-whisper's own batched pipeline (WER).
PIPELINE_MARGIN = 0.02

REQUIRE_SERVICES = os.environ.get("REQUIRE_SERVICES") == "1"
# A finished job's result as the API gives it: two segments a minute apart, the first with its
# words' times. The job page shows it the same way rendered on the server (test_pages) and
# updated by job.js (test_browser).
RESULT_WITH_WORDS = {
    "text": "Hello there. General Kenobi.",
    "language": "en",
    "segments": [
        {
            "start": 0.0,
            "end": 1.5,
            "text": " Hello there.",
            "words": [{"start": 0.0, "end": 0.6, "word": " Hello"}, {"start": 0.62, "end": 1.5, "word": " there."}],
        },
        {"start": 61.25, "end": 63.0, "text": " General Kenobi."},
    ],
}


def free_port() -> int:
    """A TCP port on loopback nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need_service(reason: str) -> None:
    """Skip a test whose service is missing, or fail it when REQUIRE_SERVICES=1 (CI)."""
    if REQUIRE_SERVICES:
        pytest.fail(f"required service unavailable: {reason}")
    pytest.skip(reason)


PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


@contextlib.contextmanager
def postgres_database(prefix: str):
    """A PostgreSQL database of the test's own on the machine's cluster: (its URL, an admin
    engine on the cluster); dropped after. Skipped (failed with REQUIRE_SERVICES=1) without one."""
    from sqlalchemy import create_engine, text

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        need_service(f"PostgreSQL at 127.0.0.1:5432 ({exc.__class__.__name__})")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", admin
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def flite(tmp: Path, voice: str, text: str) -> Path:
    """`text` spoken by flite's `voice` (slt, rms, awb, kal) into a WAV file under `tmp`; a test
    without flite (Debian: apt-get install flite) is skipped, or fails with REQUIRE_SERVICES=1."""
    import shutil
    import uuid

    if shutil.which("flite") is None:
        need_service("flite is not installed (Debian: apt-get install flite)")
    path = tmp / f"{voice}-{uuid.uuid4().hex[:8]}.wav"
    subprocess.run(["flite", "-voice", voice, "-t", text, "-o", str(path)], check=True, timeout=60)
    return path


def stored_files(settings) -> set[str]:
    """What uploads leave on disk: every file under the data dir's audio folder, and the upload
    spools in its tmp folder (not the workers' own temporary files there, which come and go
    while the session's workers prepare jobs)."""
    audio, tmp = settings.data_dir / "audio", settings.data_dir / "tmp"
    found = {str(p) for p in audio.rglob("*") if p.is_file()} if audio.exists() else set()
    return found | ({str(p) for p in tmp.glob("upload-*") if p.is_file()} if tmp.exists() else set())


def normalise(text: str) -> list[str]:
    """Words as ASR evaluations compare them: OpenAI's English normaliser (case, punctuation,
    numbers written as digits, British spellings as American), so "four hundred and twelve"
    and "412" are the same words."""
    return _normaliser()(text).split()


@functools.lru_cache(maxsize=1)
def _normaliser():
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def word_error_rate(reference: str, hypothesis: str) -> float:
    import jiwer

    return jiwer.wer(" ".join(normalise(reference)), " ".join(normalise(hypothesis)))


@functools.lru_cache(maxsize=1)
def _pipeline():
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    from models.speech.engines import bundled_model_path

    return BatchedInferencePipeline(
        WhisperModel(bundled_model_path(), device="cpu", compute_type="int8", cpu_threads=2)
    )


_pipeline_wers: dict[str, float] = {}


def pipeline_wer(key: str, samples, text: str, beam_size: int = 5) -> float:
    """The word error rate of faster-whisper's own BatchedInferencePipeline (batch 8) on
    `samples`, measured in this run (once per key): the bar the service is held to, on
    whatever CPU the tests run."""
    if key not in _pipeline_wers:
        segments, _info = _pipeline().transcribe(samples, language="en", beam_size=beam_size, batch_size=8)
        _pipeline_wers[key] = word_error_rate(text, " ".join(s.text for s in segments))
    return _pipeline_wers[key]


def long_recording(repeats: int = 3):
    """About 15 s × `repeats` of speech with pauses, longer than one 30 s window; and its text."""
    import numpy as np

    from models.speech import audio

    report, fox = audio.decode(CLIPS["report.opus"]["path"]), audio.decode(CLIPS["fox.flac"]["path"])
    pause, short = np.zeros(16000, dtype=np.float32), np.zeros(8000, dtype=np.float32)
    samples = np.concatenate([report, pause, fox, short] * repeats)
    text = " ".join([CLIPS["report.opus"]["text"], CLIPS["fox.flac"]["text"]] * repeats)
    return samples, text


def long_form(name: str):
    """(samples, text) of a long-form recording: `long_recording(4)` or a LONG_FORM name."""
    if name == "long_recording(4)":
        return long_recording(repeats=4)
    from models.speech import audio

    return audio.decode(LONG_FORM[name]["path"]), LONG_FORM[name]["text"]


def write_wav(path: Path, samples) -> Path:
    """16 kHz mono 16-bit WAV from float samples."""
    import wave

    import numpy as np

    pcm = np.clip(np.round(samples * 32767), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return path


def worker_argv(name: str, queue: str, pool: str = "prefork", concurrency: int = 1) -> list[str]:
    """A Celery worker of this project consuming `queue`, as `name@<host>` (whose pings a test
    waits for); no mingle or gossip, so it starts without waiting on the others."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tasks.worker",
        "worker",
        "--pool",
        pool,
        "--concurrency",
        str(concurrency),
        "--queues",
        queue,
        "--hostname",
        f"{name}@%h",
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        "INFO",
    ]


def self_signed(folder: Path, host: str) -> tuple[Path, Path]:
    """A certificate for `host` (its CN and subjectAltName) and its key, made by openssl into
    `folder` (cert.pem, key.pem) and good for a day: what a test's own TLS server presents,
    the certificate also being the CA its client trusts."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            f"/CN={host}",
            "-addext",
            f"subjectAltName=DNS:{host}",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


class Receiver:
    """A real HTTP(S) server on 127.0.0.1 in a thread. `routes` maps a path to
    (status, headers, body) or to a function of the request handler."""

    def __init__(self, routes: dict, tls: ssl.SSLContext | None = None):
        self.requests: list = []  # (method, path, headers, body)
        self.release = threading.Event()  # set at exit, so slow routes end
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append((self.command, self.path, self.headers, body))
                route = routes.get(self.path.split("?")[0], (404, {}, b"no such route"))
                if callable(route):
                    return route(self, outer)
                status, headers, content = route
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = handle_one

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.handle_error = lambda request, address: None
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def url(self, path: str, host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class LiveServer:
    """A Flask app served over real HTTP on 127.0.0.1 in a thread; `url` is its base URL."""

    def __init__(self, app):
        from werkzeug.serving import make_server

        self.httpd = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"

    def __enter__(self) -> LiveServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()


def wait_until(check, timeout: float, what: str, interval: float = 0.1):
    """`check()`'s first true value, looked for every `interval` seconds; AssertionError saying
    `what` did not happen after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)  # the poll's interval: the loop waits for `check`
    raise AssertionError(f"{what} within {timeout} s")


def task_ends(log: str, task: str, task_id: str) -> int:
    """How many times a worker's log (`log`) says it finished running `task` for this id:
    Celery's own line for each end (succeeded, raised, retried, ignored, rejected), never
    written before the task's work is done."""
    import re

    return len(re.findall(rf"Task {re.escape(task)}\[{re.escape(task_id)}\] (?!received)", log))


def wait_for_line(worker, line: str, timeout: float = 120.0) -> None:
    """Until a pool's log has `line`: the event that proves a message was taken and handled."""
    wait_until(lambda: line in worker.output(), timeout, f"no {line!r} in the workers' logs")


def make_job(rt, spooled=None, **fields):
    """A PENDING job as the door records one (models.jobs.operations.create_job), from one
    dict of its options (JobOptions' fields) and where its audio is."""
    import dataclasses

    from models.jobs.operations import create_job
    from models.jobs.record import JobOptions

    names = {f.name for f in dataclasses.fields(JobOptions)}
    options = JobOptions(**{k: v for k, v in fields.items() if k in names})
    return create_job(rt, spooled, options, **{k: v for k, v in fields.items() if k not in names})


def proto_stubs(out: Path):
    """(messages, service stubs) of the gRPC door, generated from its .proto into `out` as a
    client of its own would generate them (python -m grpc_tools.protoc), not the server's."""
    import importlib
    import sys
    from importlib.resources import files

    from grpc_tools import protoc

    proto_root = ROOT / "web" / "rpc" / "proto"
    argv = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{files('grpc_tools') / '_proto'}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        "whisperq/v1/transcription.proto",
    ]
    assert protoc.main(argv) == 0
    sys.path.insert(0, str(out))
    try:
        for name in [m for m in sys.modules if m == "whisperq" or m.startswith("whisperq.")]:
            del sys.modules[name]  # another run's stubs: these are generated afresh
        messages = importlib.import_module("whisperq.v1.transcription_pb2")
        services = importlib.import_module("whisperq.v1.transcription_pb2_grpc")
    finally:
        sys.path.remove(str(out))
    assert Path(messages.__file__).is_relative_to(out)
    return messages, services


def signed(task: str, args: list, kwargs: dict | None = None) -> dict:
    """What Task.apply needs to run `task` in this process as a worker runs a message the
    service sent itself: its signature in the headers (models.security.signing)."""
    from models.security.signing import HEADER, sign

    return {"headers": {HEADER: sign(task, args, kwargs or {})}}
