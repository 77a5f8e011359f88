"""The synchronous baseline for bench/load.py: a Flask endpoint that runs the model inline,
as whisper services are commonly run. The same model and settings as the workers.

    gunicorn --workers 2 --worker-class gthread --threads 4 bench.sync_baseline:app
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

from flask import Flask, jsonify, request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from config import Settings
from models.registry.catalog import model_path
from models.speech import audio
from models.speech.engines import FasterWhisperEngine, usable_cores

app = Flask(__name__)
_engine = None
_lock = threading.Lock()


def engine() -> FasterWhisperEngine:
    global _engine
    with _lock:
        if _engine is None:
            settings = Settings.from_env({})
            # Two processes share the cores, as two inference processes would.
            _engine = FasterWhisperEngine(
                model_path(settings), cpu_threads=max(1, usable_cores() // 2), beam_size=settings.beam_size
            )
    return _engine


@app.post("/transcribe")
def transcribe():
    upload = request.files["file"]
    with tempfile.NamedTemporaryFile(suffix=Path(upload.filename or "a.bin").suffix) as tmp:
        upload.save(tmp.name)
        samples = audio.decode(tmp.name)
    result = engine().transcribe(samples, language="en")
    return jsonify({"text": result.text, "duration": result.duration})
