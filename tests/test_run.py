"""`whisperq run` (what `make run` starts) on a machine with no services: embedded broker,
web, worker and Flower; a real upload comes back COMPLETED; SIGTERM stops everything."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from helpers import CLIPS, word_error_rate

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, timeout: float, what: str, proc: subprocess.Popen, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"whisperq run exited early:\n{log.read_text()}"
        try:
            value = check()
            if value:
                return value
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} not ready within {timeout} s:\n{log.read_text()[-4000:]}")


def test_run_starts_the_whole_service_on_the_embedded_broker(tmp_path):
    port, flower = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL")}
    env.update(WHISPERQ_DATA_DIR=str(tmp_path / "var"), PORT=str(port), FLOWER_PORT=str(flower))
    log = tmp_path / "run.log"
    whisperq = Path(sys.executable).parent / "whisperq"
    proc = subprocess.Popen([str(whisperq), "run"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 200, 60, "web", proc, log)
        assert f"http://127.0.0.1:{port}/" in log.read_text()  # the URLs are printed
        clip = CLIPS["report.opus"]
        with clip["path"].open("rb") as fh:
            resp = requests.post(f"{base}/v1/jobs", files={"file": ("report.opus", fh)}, timeout=30)
        assert resp.status_code == 202, resp.text
        status_url = resp.headers["Location"]
        job = wait_until(
            lambda: (j := requests.get(status_url, timeout=5).json())["status"] in ("COMPLETED", "FAILED") and j,
            120, "job", proc, log,
        )
        assert job["status"] == "COMPLETED", job
        assert word_error_rate(clip["text"], job["result"]["text"]) <= 0.2

        # Headers too large for gunicorn itself, or for the app: both answer in JSON.
        for size in (20_000, 40_000, 200_000):
            resp = requests.get(f"{base}/v1/jobs/{job['job_id']}", headers={"X-Padding": "a" * size}, timeout=10)
            assert resp.status_code == 431, (size, resp.status_code, resp.text[:200])
            assert resp.json()["error"]["code"] == "headers_too_large"
        assert requests.get(status_url, timeout=5).status_code == 200  # and it keeps serving

        # Flower sees the worker and the task.
        workers = wait_until(
            lambda: requests.get(f"http://127.0.0.1:{flower}/workers?json=1", timeout=5).json()["data"], 30, "flower", proc, log
        )
        names = {w["hostname"].split("@")[0] for w in workers}
        assert {"prepare", "inference"} <= names, names
        tasks = wait_until(
            lambda: requests.get(
                f"http://127.0.0.1:{flower}/tasks/datatable",
                params={"draw": 1, "start": 0, "length": 10, "search[value]": "", "order[0][column]": 0,
                        "order[0][dir]": "desc", "columns[0][data]": "name"},
                timeout=5,
            ).json()["data"],
            30, "flower tasks", proc, log,
        )
        assert any(t["uuid"] == job["job_id"] and t["state"] == "SUCCESS" for t in tasks)
        # The broker's data is kept under the data dir.
        assert (tmp_path / "var" / "redis" / "appendonly.aof").exists() or (tmp_path / "var" / "redis" / "appendonlydir").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    out = log.read_text()
    assert "Warm shutdown" in out
    # Nothing is left listening: web and the embedded broker are gone.
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/healthz", timeout=2)
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "var" / "redis")], capture_output=True, text=True).stdout
    assert leftover.strip() == "", f"embedded redis still running: {leftover}"
    assert code in (0, -15, 143), out[-3000:]


def test_run_refuses_a_bad_setting_with_its_name(tmp_path):
    env = dict(os.environ, WHISPERQ_DATA_DIR=str(tmp_path), PORT="eighty")
    out = subprocess.run([str(Path(sys.executable).parent / "whisperq"), "run"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "PORT='eighty' is not a whole number" in out.stderr
