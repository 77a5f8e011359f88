"""`whisperq run` (what `make run` starts) on a machine with no services: embedded broker,
web, worker and Flower; a real upload comes back COMPLETED; SIGTERM stops everything."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import helpers
import pytest
import requests
from helpers import CLIPS, Receiver, free_port, word_error_rate
from stack import run_env, wait_for_stack

pytestmark = pytest.mark.integration


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def test_run_starts_the_whole_service_on_the_embedded_broker(tmp_path):
    port, flower = free_port(), free_port()
    env = run_env(tmp_path, port, drop=("WHISPERQ_LOG_FORMAT",), FLOWER_PORT=str(flower), WHISPERQ_SWEEP_INTERVAL="5")
    # Tracing on, as an operator turns it on: every process exports over OTLP/HTTP to a
    # collector (here a local receiver that keeps what it is sent).
    collector = Receiver({"/v1/traces": (200, {"Content-Type": "application/x-protobuf"}, b"")})
    collector.__enter__()
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=collector.url(""), OTEL_BSP_SCHEDULE_DELAY="200")
    log = tmp_path / "run.log"
    whisperq = Path(sys.executable).parent / "whisperq"
    proc = subprocess.Popen([str(whisperq), "run"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for_stack(lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 200, 60, "web", proc, log)
        assert f"http://127.0.0.1:{port}/" in log.read_text()  # the URLs are printed, and the inbox
        assert f"inbox        {tmp_path / 'var' / 'inbox'}" in log.read_text()
        clip = CLIPS["report.opus"]
        with clip["path"].open("rb") as fh:
            resp = requests.post(f"{base}/v1/jobs", files={"file": ("report.opus", fh)}, timeout=30)
        assert resp.status_code == 202, resp.text
        status_url = resp.headers["Location"]
        job = wait_for_stack(
            lambda: (j := requests.get(status_url, timeout=5).json())["status"] in ("COMPLETED", "FAILED") and j,
            120,
            "job",
            proc,
            log,
        )
        assert job["status"] == "COMPLETED", job
        assert word_error_rate(clip["text"], job["result"]["text"]) <= 0.2
        # One trace, read back from the collector, runs through the web, prepare and
        # inference processes: the upload's request and both tasks' runs.
        trace = wait_for_stack(lambda: job_trace(collector, job["job_id"]), 30, "the job's trace", proc, log)
        assert {"whisperq-web", "whisperq-prepare", "whisperq-inference"} <= {svc for svc, _ in trace}, trace
        assert {("whisperq-prepare", "run/whisperq.transcribe"), ("whisperq-inference", "run/whisperq.infer")} <= trace
        assert any(svc == "whisperq-web" and name.startswith("POST") for svc, name in trace), trace

        # Headers too large for gunicorn itself, or for the app: both answer in JSON.
        for size in (20_000, 40_000, 200_000):
            resp = requests.get(f"{base}/v1/jobs/{job['job_id']}", headers={"X-Padding": "a" * size}, timeout=10)
            assert resp.status_code == 431, (size, resp.status_code, resp.text[:200])
            assert resp.json()["error"]["code"] == "headers_too_large"
        assert requests.get(status_url, timeout=5).status_code == 200  # and it keeps serving

        # Flower, behind the password `whisperq run` generated and printed, sees the
        # workers and the task through its API; without the password it answers 401.
        password = re.search(r"user admin, password (\S+);", log.read_text()).group(1)
        flower_api, auth = f"http://127.0.0.1:{flower}/api", ("admin", password)
        wait_for_stack(
            lambda: requests.get(f"{flower_api}/workers", timeout=5).status_code == 401, 30, "flower", proc, log
        )
        assert requests.get(f"{flower_api}/tasks", timeout=5).status_code == 401
        assert requests.get(f"{flower_api}/workers", auth=("admin", "wrong"), timeout=5).status_code == 401
        wait_for_stack(
            lambda: (
                {
                    name.split("@")[0]
                    for name in requests.get(f"{flower_api}/workers?refresh=1", auth=auth, timeout=10).json()
                }
                >= {"prepare", "inference"}
            ),
            30,
            "flower workers",
            proc,
            log,
        )
        wait_for_stack(
            lambda: (
                requests.get(f"{flower_api}/tasks", auth=auth, timeout=5).json().get(job["job_id"], {}).get("state")
                == "SUCCESS"
            ),
            30,
            "flower tasks",
            proc,
            log,
        )
        # State persists under the data dir.
        assert list((tmp_path / "var").glob("flower.db*"))

        # Logs: one JSON object a line, naming the job; no transcript, no file name.
        records = [
            r
            for line in log.read_text().splitlines()
            if " | {" in line
            if (r := _json_or_none(line.split(" | ", 1)[1]))
        ]
        about = [r for r in records if r.get("job_id") == job["job_id"]]
        assert any(
            r.get("task") == "whisperq.infer"
            and r.get("queue") == "whisperq.inference"
            and r.get("attempt") == 1
            and r.get("task_id") == job["job_id"]
            for r in about
        ), about
        assert any(r.get("task") == "whisperq.transcribe" and r.get("queue") == "whisperq.prepare" for r in about), (
            about
        )
        assert any("succeeded in" in r["message"] and "omitted" in r["message"] for r in about), about
        text = log.read_text().lower()
        words = {w for w in re.findall(r"[a-z]+", job["result"]["text"].lower()) if len(w) >= 7}
        assert words and not [w for w in words if w in text], [w for w in words if w in text]
        assert "report.opus" not in text
        assert "setup plugin" not in text  # Alembic's start-up chatter is kept out (config.logs.QUIET)
        # The broker's data is kept under the data dir.
        assert (tmp_path / "var" / "redis" / "appendonly.aof").exists() or (
            tmp_path / "var" / "redis" / "appendonlydir"
        ).exists()

        # A program on this machine with no broker settings finding the stack by itself, and every
        # other way in: tests/test_conformance.py.

        # The pools run below the web's scheduling priority; a killed pool comes back by itself.
        survives_a_killed_pool(base, tmp_path / "var", proc, log)

        # 300 clients long-polling a job that does not change: under the gevent workers none
        # holds a thread, so the health check and an upload answer meanwhile.
        long_polls_hold_no_thread(base)

        # 64 OpenAI-style calls at once, each willing to wait for its transcript: only
        # WHISPERQ_SYNC_WAITS of them (per web process, one per client) hold a thread; the rest
        # answer 202 at once, so the health check and ordinary submissions keep answering.
        calls_answered_at_once(base)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    collector.__exit__(None, None, None)
    out = log.read_text()
    assert "Warm shutdown" in out
    # Nothing is left listening: web and the embedded broker are gone.
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/healthz", timeout=2)
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path / "var" / "redis")], capture_output=True, text=True).stdout
    assert leftover.strip() == "", f"embedded redis still running: {leftover}"
    assert not (tmp_path / "var" / "broker.url").exists()  # withdrawn with the stack
    assert code in (0, -15, 143), out[-3000:]


def job_trace(collector, job_id: str) -> set[tuple[str, str]] | None:
    """(service, span name) of every span in the trace of the task run that carries the
    job's id, from what the collector was sent; None until the web's, the prepare pool's and
    the inference pool's spans are all in."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    spans = []
    for _method, _path, _headers, body in list(collector.requests):
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), ""
            )
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: a.value.string_value for a in span.attributes}
                    spans.append((span.trace_id, service, span.name, attributes))
    ids = {trace for trace, _svc, name, attrs in spans if job_id in attrs.values()}
    if len(ids) != 1:
        return None
    found = {(svc, name) for trace, svc, name, _attrs in spans if trace in ids}
    # Spans are exported in batches: wait until each process's are in.
    return found if {"whisperq-web", "whisperq-prepare", "whisperq-inference"} <= {svc for svc, _ in found} else None


def supervised_pid(data_dir: Path, name: str) -> int:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "supervisorctl"), "-c", str(data_dir / "supervisord.conf"), "pid", name],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    return int(out) if out.isdigit() else 0


def niceness(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def survives_a_killed_pool(base: str, data_dir: Path, proc, log: Path) -> None:
    """SIGKILL of the inference process with jobs in it (as the OOM killer would): the API
    keeps answering, supervisord starts the pool again, and every job completes."""
    pids = {name: supervised_pid(data_dir, name) for name in ("web", "prepare", "inference")}
    assert all(pids.values()), pids
    assert niceness(pids["web"]) == 0 and niceness(pids["prepare"]) == niceness(pids["inference"]) == 10, pids
    clip = CLIPS["report.opus"]

    def upload():
        with clip["path"].open("rb") as fh:
            resp = requests.post(f"{base}/v1/jobs", files={"file": ("report.opus", fh)}, timeout=30)
        assert resp.status_code == 202, resp.text
        return resp.headers["Location"]

    jobs = [upload() for _ in range(3)]
    wait_for_stack(
        lambda: any(requests.get(u, timeout=5).json()["stage"] == "infer" for u in jobs),
        60,
        "a job in inference",
        proc,
        log,
    )
    os.kill(pids["inference"], signal.SIGKILL)
    assert requests.get(f"{base}/healthz", timeout=5).status_code == 200
    jobs.append(upload())  # the door keeps taking work
    wait_for_stack(
        lambda: supervised_pid(data_dir, "inference") not in (0, pids["inference"]),
        60,
        "the inference pool back",
        proc,
        log,
    )
    done = [
        wait_for_stack(
            lambda u=u: (j := requests.get(u, timeout=5).json())["status"] in ("COMPLETED", "FAILED") and j,
            180,
            "a job after the kill",
            proc,
            log,
        )
        for u in jobs
    ]
    assert [j["status"] for j in done] == ["COMPLETED"] * len(jobs), done
    assert all(word_error_rate(clip["text"], j["result"]["text"]) <= 0.2 for j in done)
    assert supervised_pid(data_dir, "web") == pids["web"]  # the web was never restarted


def long_polls_hold_no_thread(base: str) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    release = threading.Event()

    def slow(handler, _receiver):  # the audio server that never finishes sending
        release.wait(60)
        handler.send_response(503)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    with Receiver({"/slow.flac": slow}) as origin:
        resp = requests.post(f"{base}/v1/jobs", json={"audio_url": origin.url("/slow.flac")}, timeout=10)
        assert resp.status_code == 202, resp.text
        status_url = resp.headers["Location"]
        helpers.wait_until(lambda: origin.requests, 30, "the fetch began (the job holds still from then)")
        first = requests.get(status_url, timeout=10)
        tag = first.headers["ETag"]

        def poll(_n):
            return requests.get(f"{status_url}?wait=8", headers={"If-None-Match": tag}, timeout=30).status_code

        with ThreadPoolExecutor(300) as pool:
            polls = [pool.submit(poll, n) for n in range(300)]
            time.sleep(2)
            probes = [requests.get(f"{base}/healthz", timeout=5).status_code for _ in range(5)]
            with CLIPS["fox.flac"]["path"].open("rb") as fh:
                upload = requests.post(f"{base}/v1/jobs", files={"file": ("fox.flac", fh)}, timeout=5)
            codes = [p.result() for p in polls]
        release.set()
    assert probes == [200] * 5 and upload.status_code == 202, (probes, upload.text)
    assert codes == [304] * 300, sorted(set(codes))
    for url in (status_url, upload.headers["Location"]):
        requests.delete(url, timeout=10)


def calls_answered_at_once(base: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    audio = CLIPS["fox.flac"]["path"].read_bytes()

    def call(_n):
        resp = requests.post(
            f"{base}/v1/audio/transcriptions",
            files={"file": ("fox.flac", audio)},
            data={"model": "whisper-1"},
            timeout=120,
        )
        return resp.status_code, resp.json()

    with ThreadPoolExecutor(64) as pool:
        calls = [pool.submit(call, n) for n in range(64)]
        time.sleep(1.0)  # the calls are in: the ones allowed to wait are waiting
        probes = [requests.get(f"{base}/healthz", timeout=10).status_code for _ in range(5)]
        with CLIPS["fox.flac"]["path"].open("rb") as fh:
            ordinary = requests.post(f"{base}/v1/jobs", files={"file": ("fox.flac", fh)}, timeout=10)
        answers = [c.result() for c in calls]
    assert probes == [200] * 5 and ordinary.status_code == 202, (probes, ordinary.text)
    codes = [code for code, _ in answers]
    assert set(codes) <= {200, 202}, codes
    # One client (this address): at most one wait per web process (the Procfile runs two).
    assert codes.count(200) <= 2 and codes.count(202) >= 62, codes
    for _code, body in answers:  # leave no queue behind for the shutdown
        if body.get("status_url"):
            requests.delete(body["status_url"], timeout=10)
    requests.delete(ordinary.headers["Location"], timeout=10)


def test_run_refuses_a_bad_setting_with_its_name(tmp_path):
    env = dict(os.environ, WHISPERQ_DATA_DIR=str(tmp_path), PORT="eighty")
    out = subprocess.run(
        [str(Path(sys.executable).parent / "whisperq"), "run"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode != 0
    assert "PORT='eighty' is not a whole number" in out.stderr


def test_supervisords_socket_stays_within_a_sockets_path_length(tmp_path):
    from web.supervise import SOCKET_PATH_MAX, config_text, socket_path

    assert socket_path(tmp_path) == tmp_path / "supervisor.sock"
    deep = tmp_path / ("d" * 120) / "var"
    deep.mkdir(parents=True)
    sock = socket_path(deep)
    assert len(str(sock)) <= SOCKET_PATH_MAX and sock == socket_path(deep)  # the same for supervisorctl
    assert oct(sock.parent.stat().st_mode & 0o777) == "0o700"
    assert f"file={sock}" in config_text([("web", "true")], tmp_path, deep)
    sock.parent.rmdir()


def start_run(tmp_path: Path, **settings) -> tuple[subprocess.Popen, str, Path]:
    """`whisperq run` on a data dir of its own, as `make run` starts it; (process, base URL, log)."""
    port = free_port()
    env = run_env(tmp_path, port, drop=("OTEL_EXPORTER_OTLP_ENDPOINT",), **settings)
    log = tmp_path / "run.log"
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "whisperq"), "run"], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    return proc, f"http://127.0.0.1:{port}", log


def stop_run(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def upload(base: str, name: str) -> str:
    with CLIPS[name]["path"].open("rb") as fh:
        resp = requests.post(f"{base}/v1/jobs", files={"file": (name, fh)}, timeout=30)
    assert resp.status_code == 202, resp.text
    return resp.headers["Location"]


def finished(status_url: str) -> dict | None:
    resp = requests.get(status_url, timeout=5)
    assert resp.status_code in (200, 503), resp.text  # 503: a moment without the database or broker
    job = resp.json()
    return job if resp.status_code == 200 and job["status"] in ("COMPLETED", "FAILED") else None


@pytest.mark.timeout(600)  # two stack starts' worth: a lost message waits out the sweeper's grace
def test_a_killed_embedded_broker_comes_back_and_every_job_completes(tmp_path):
    """SIGKILL of the embedded Redis (as the OOM killer would) with jobs queued and running:
    supervisord starts it again on the same port, password and append-only file, the pools and
    the web reconnect by themselves, every job completes and new uploads are taken."""
    # A message the kill lost is sent again once the sweeper's grace has passed: 10 s here, not 60.
    proc, base, log = start_run(tmp_path, WHISPERQ_SWEEP_INTERVAL="5", WHISPERQ_SWEEP_GRACE="10")
    data = tmp_path / "var"
    try:
        wait_for_stack(lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 200, 90, "web", proc, log)
        url = (data / "broker.url").read_text().strip()
        broker = supervised_pid(data, "broker")
        assert broker and (data / "redis" / "redis.pid").read_text().strip() == str(broker)
        jobs = [upload(base, "report.opus") for _ in range(4)] + [upload(base, "fox.flac")]
        wait_for_stack(
            lambda: any(requests.get(u, timeout=5).json()["status"] != "PENDING" for u in jobs),
            60,
            "a job started",
            proc,
            log,
        )
        os.kill(broker, signal.SIGKILL)
        wait_for_stack(lambda: supervised_pid(data, "broker") not in (0, broker), 60, "the broker back", proc, log)
        assert (data / "broker.url").read_text().strip() == url  # same address and password: clients reconnect
        wait_for_stack(
            lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 200, 120, "ready again", proc, log
        )
        jobs.append(upload(base, "fox.flac"))  # the door takes work again, with no restart of the web
        done = [wait_for_stack(lambda u=u: finished(u), 240, "a job after the broker's kill", proc, log) for u in jobs]
        assert [j["status"] for j in done] == ["COMPLETED"] * len(jobs), done
        for job in done:
            name = job["filename"]
            assert word_error_rate(CLIPS[name]["text"], job["result"]["text"]) <= 0.2, job
        assert "exited: broker (terminated by SIGKILL; not expected)" in log.read_text()
    finally:
        stop_run(proc)
    assert proc.returncode in (0, -15, 143), log.read_text()[-3000:]


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone
    except OSError:
        return False


@pytest.mark.timeout(300)
def test_nothing_outlives_a_killed_run_and_the_next_run_starts(tmp_path):
    """SIGKILL of `whisperq run` itself: supervisord, the embedded Redis, the web, the pools and
    their children all stop within a bounded time, and a new run on the same data dir starts."""
    proc, base, log = start_run(tmp_path)
    try:
        wait_for_stack(lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 200, 90, "web", proc, log)
        stack = descendants(proc.pid)
        broker = supervised_pid(tmp_path / "var", "broker")
        assert broker in stack and supervised_pid(tmp_path / "var", "inference") in stack
        assert len(stack) >= 8, stack  # supervisord, the broker, web (and its workers), the pools, Flower, beat
        proc.kill()
        proc.wait()
        # Each process drains in turn: idle, seconds each.
        helpers.wait_until(lambda: not any(alive(p) for p in stack), 120, "every process of the killed run gone")
        with pytest.raises(requests.ConnectionError):
            requests.get(f"{base}/healthz", timeout=2)
    finally:
        stop_run(proc)
    again, base, log = start_run(tmp_path)  # the same data dir: its lock and files are free again
    try:
        wait_for_stack(
            lambda: requests.get(f"{base}/readyz", timeout=2).status_code == 200, 90, "web again", again, log
        )
    finally:
        stop_run(again)


def test_a_run_stops_what_a_killed_run_left_and_refuses_a_second_run(tmp_path):
    """The data dir's supervisord from a run killed outright (its pid file still there) is
    stopped before a new run starts; a live run's data dir is refused to a second one."""
    from web.supervise import claim

    fake = tmp_path / "bin" / "supervisord"  # stands in for the orphan: a supervisord of this data dir's configuration
    fake.parent.mkdir()
    fake.write_text("import time\nprint('up', flush=True)\nwhile True:\n    time.sleep(1)\n")
    orphan = subprocess.Popen(
        [sys.executable, str(fake), "-c", str(tmp_path / "supervisord.conf")], stdout=subprocess.PIPE, text=True
    )
    assert orphan.stdout.readline() == "up\n"  # running, under its command line
    (tmp_path / "supervisord.pid").write_text(f"{orphan.pid}\n")
    try:
        held = claim(tmp_path)
        assert orphan.wait(30) == -signal.SIGTERM
        with pytest.raises(RuntimeError, match="another `whisperq run` is running on the data dir"):
            claim(tmp_path)
        held.close()
        claim(tmp_path).close()  # free again once the run is gone
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
