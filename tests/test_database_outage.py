"""The database away under the web the Procfile starts (gunicorn's gevent worker): every door
answers 503 `database_unavailable` with Retry-After (a wait, not a fault: no traceback), and
the web serves again once the database is back, without a restart.

The outage is PostgreSQL refusing the web's database (ALLOW_CONNECTIONS false, its sessions
ended), as a restart or a failover looks to a client; the cluster itself stays up for the rest
of the suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
import requests
from helpers import free_port, need_service, postgres_database, wait_until
from sqlalchemy import text

ROOT = Path(__file__).resolve().parent.parent
BROKER = "redis://127.0.0.1:6379/13"


@pytest.fixture()
def pg_database():
    with postgres_database("whisperq_outage") as (url, admin):
        name = url.rsplit("/", 1)[1]

        def outage(on: bool) -> None:
            with admin.connect() as conn:
                conn.execute(text(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS {"false" if on else "true"}'))
                if on:
                    conn.execute(
                        text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"), {"n": name}
                    )

        yield url, outage


def _procfile(process: str) -> str:
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.startswith(f"{process}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {process} line in the Procfile")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_every_door_answers_503_while_the_database_is_away_and_serves_again_after(pg_database, tmp_path):
    url, outage = pg_database
    try:
        redis.Redis.from_url(BROKER, socket_timeout=5).ping()
    except Exception as exc:
        need_service(f"Redis at 127.0.0.1:6379 ({exc.__class__.__name__})")
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "DATABASE_", "WHISPERQ_"))},
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DATABASE_URL": url,
        "CELERY_BROKER_URL": BROKER,
        "WHISPERQ_DATA_DIR": str(tmp_path / "var"),
        "WHISPERQ_ALLOW_ANONYMOUS": "1",
        "WHISPERQ_POLL_LIMIT": "false",
        "WHISPERQ_FETCH_ALLOW": "127.0.0.1:9",  # the job made once the database is back
        "HOST": "127.0.0.1",
        "PORT": str(port),
    }
    log = tmp_path / "web.log"
    web = subprocess.Popen(
        ["bash", "-c", f"exec {_procfile('web')}"],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    unknown = f"{base}/v1/jobs/{uuid.uuid4()}"

    def answers(status: int):
        def check():
            assert web.poll() is None, log.read_text()[-3000:]
            try:
                return requests.get(unknown, timeout=10).status_code == status
            except requests.ConnectionError:
                return False

        return check

    try:
        wait_until(answers(404), 120, "the web did not answer")  # reads the database: it is there
        outage(True)
        calls = {
            "job": lambda: requests.get(unknown, timeout=30),
            "upload": lambda: requests.post(
                f"{base}/v1/jobs", files={"file": ("a.wav", b"RIFF....WAVE")}, data={"language": "en"}, timeout=30
            ),
            "url": lambda: requests.post(f"{base}/v1/jobs", json={"audio_url": "http://127.0.0.1:9/a.wav"}, timeout=30),
            "batch": lambda: requests.post(
                f"{base}/v1/batches", json={"audio_urls": ["http://127.0.0.1:9/a.wav"]}, timeout=30
            ),
            "openai": lambda: requests.post(
                f"{base}/v1/audio/transcriptions",
                files={"file": ("a.wav", b"RIFF....WAVE")},
                data={"model": "whisper-1"},
                timeout=30,
            ),
        }
        for door, call in calls.items():
            resp = call()
            assert resp.status_code == 503, (door, resp.status_code, resp.text)
            assert resp.headers.get("Retry-After") == "5", (door, resp.headers)
            body = resp.json()["error"]
            assert body["code"] == "database_unavailable" and "unreachable" in body["message"], (door, body)
            if door == "openai":
                assert body["type"] == "server_error", body  # OpenAI's shape, which its client retries
        page = requests.get(unknown.replace("/v1/jobs/", "/jobs/"), headers={"Accept": "text/html"}, timeout=30)
        assert page.status_code == 503 and "unreachable" in page.text, (page.status_code, page.text[:300])
        outage(False)
        wait_until(answers(404), 60, "the web did not serve again once the database was back")
        made = requests.post(f"{base}/v1/jobs", json={"audio_url": "http://127.0.0.1:9/a.wav"}, timeout=30)
        assert made.status_code == 202, made.text
        output = log.read_text()
        assert "the database is unreachable on POST /v1/jobs" in output, output[-3000:]
        assert "unhandled error" not in output and "Traceback" not in output, output[-3000:]
    finally:
        outage(False)
        os.killpg(web.pid, signal.SIGTERM)
        try:
            web.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(web.pid, signal.SIGKILL)
        redis.Redis.from_url(BROKER).flushdb()  # the one job queued for no worker
