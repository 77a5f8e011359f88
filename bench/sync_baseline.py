"""The synchronous baseline for bench/load.py: a Flask endpoint that runs the model inline,
as whisper services are commonly run. The same model and settings as the workers.

    gunicorn --workers 2 --worker-class gthread --threads 4 bench.sync_baseline:app

SYNC_ENGINE says what runs inside the request: `whisperq` (default) this project's engine,
its windows read without timestamp tokens, one engine thread per process (run two);
`faster-whisper` faster-whisper's own `WhisperModel.transcribe(path)` on every core, one
request at a time behind a lock, as whisper-asr-webservice's faster-whisper engine runs it
(run one process). Both read the settings the service reads (the environment's
WHISPERQ_MODELS, WHISPERQ_DEVICE, WHISPERQ_COMPUTE_TYPE, WHISPERQ_BEAM_SIZE).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from pathlib import Path

from flask import Flask, jsonify, request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from config import Settings
from models.registry.catalog import model_path
from models.speech import audio
from models.speech.engines import FasterWhisperEngine, resolve_device, usable_cores

app = Flask(__name__)
ENGINE = os.environ.get("SYNC_ENGINE", "whisperq")
if ENGINE not in ("whisperq", "faster-whisper"):
    raise SystemExit(f"SYNC_ENGINE={ENGINE!r}: say whisperq or faster-whisper")
_engine = None
_beam = 5
_lock = threading.Lock()
_model_lock = threading.Lock()  # faster-whisper: one transcription at a time


def engine():
    global _engine, _beam
    with _lock:
        if _engine is None:
            settings = Settings.from_env()
            _beam = settings.beam_size
            if ENGINE == "faster-whisper":
                from faster_whisper import WhisperModel

                device, compute = resolve_device(settings.device, settings.compute_type)
                _engine = WhisperModel(
                    model_path(settings), device=device, compute_type=compute, cpu_threads=usable_cores()
                )
            else:  # two processes share the cores, as two inference processes would
                _engine = FasterWhisperEngine(
                    model_path(settings),
                    device=settings.device,
                    compute_type=settings.compute_type,
                    cpu_threads=max(1, usable_cores() // 2),
                    beam_size=settings.beam_size,
                )
    return _engine


@app.post("/transcribe")
def transcribe():
    upload = request.files["file"]
    with tempfile.NamedTemporaryFile(suffix=Path(upload.filename or "a.bin").suffix) as tmp:
        upload.save(tmp.name)
        if ENGINE == "faster-whisper":
            model = engine()
            with _model_lock:
                segments, info = model.transcribe(tmp.name, beam_size=_beam, language="en")
                text = "".join(s.text for s in segments).strip()
            return jsonify({"text": text, "duration": info.duration})
        samples = audio.decode(tmp.name)
    result = engine().transcribe(samples, language="en")
    return jsonify({"text": result.text, "duration": result.duration})
