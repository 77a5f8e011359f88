"""The second host of tests/hosts.py: its own loopback and no way out, host 1's services
through the forwarders alone, none of host 1's hidden files, and nothing left behind."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import hosts
import pytest
from helpers import wait_until, worker_argv
from hosts import ROOT, HostUnavailable, SecondHost, second_host

PY = sys.executable


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _need_local(port: int, what: str) -> None:
    if not _listening(port):
        from helpers import need_service

        need_service(f"{what} is not listening on 127.0.0.1:{port}")


def _python(host: SecondHost, code: str, *args: str, **kwargs) -> dict:
    """Run `code` with this venv's Python on host 2; it prints one JSON object."""
    result = host.run([PY, "-c", code, *args], **kwargs)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


@pytest.fixture()
def host():
    """A second host that sees none of this machine's temp dirs (where tmp_path is)."""
    with second_host(hide=[tempfile.gettempdir()]) as h:
        yield h


CONNECT = """
import errno, json, socket, sys
def attempt(address, port):
    try:
        socket.create_connection((address, port), timeout=2).close()
        return "connected"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))
print(json.dumps({"loopback": attempt("127.0.0.1", 6379), "host1_direct": attempt(sys.argv[1], 6379),
                  "outside": attempt("203.0.113.1", 80),
                  "ipv6": open("/proc/sys/net/ipv6/conf/%s/disable_ipv6" % sys.argv[2]).read().strip()}))
"""


def test_host_2_has_its_own_loopback_and_no_route_out(host):
    """127.0.0.1:6379 on host 2 is its own loopback, not host 1's Redis; host 1's veth
    address serves only forwarded ports; anything else has no route, so nothing is sent."""
    _need_local(6379, "Redis")
    seen = _python(host, CONNECT, host.host1_address, host.device)
    assert seen == {"loopback": "ECONNREFUSED", "host1_direct": "ECONNREFUSED", "outside": "ENETUNREACH", "ipv6": "1"}
    subnet = ipaddress.ip_network(f"{host.address}/30", strict=False)
    assert subnet.subnet_of(hosts.SUBNET) and host.host1_address == str(subnet.network_address + 1)
    routes = [line.strip() for line in host.run(["ip", "-4", "route", "show"], check=True).stdout.splitlines()]
    assert routes == [f"{subnet} dev {host.device} proto kernel scope link src {host.address}"], "no default route"
    assert host.run(["ip", "-6", "addr", "show", "dev", host.device], check=True).stdout.strip() == ""


def test_redis_answers_through_the_forwarder(host):
    _need_local(6379, "Redis")
    url = host.url("redis://127.0.0.1:6379/0")
    assert url.startswith(f"redis://{host.host1_address}:")
    code = "import json, sys, redis; print(json.dumps({'ping': redis.Redis.from_url(sys.argv[1]).ping()}))"
    seen = _python(host, code, url)
    assert seen == {"ping": True}


def test_postgresql_answers_through_the_forwarder_and_not_by_its_socket(host):
    _need_local(5432, "PostgreSQL")
    url = host.url("postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    assert url == f"postgresql+psycopg://postgres@{host.host1_address}:{host.forward(5432)[1]}/postgres"
    code = """
import json, os, sys, psycopg
with psycopg.connect(sys.argv[1].replace("+psycopg", "", 1), connect_timeout=5) as conn:
    one = conn.execute("SELECT 1").fetchone()[0]
try:
    psycopg.connect("dbname=postgres user=postgres", connect_timeout=2).close()  # the Unix socket
    socket = "connected"
except psycopg.OperationalError:
    socket = "refused"
print(json.dumps({"one": one, "socket": socket, "dir": os.listdir("/run/postgresql")}))
"""
    assert _python(host, code, url) == {"one": 1, "socket": "refused", "dir": []}


def test_rabbitmq_answers_through_the_forwarder(host):
    _need_local(5672, "RabbitMQ")
    url = host.url("amqp://guest:guest@localhost:5672//")
    assert url == f"amqp://guest:guest@{host.host1_address}:{host.forward(5672)[1]}//"
    code = """
import json, sys, kombu
with kombu.Connection(sys.argv[1], connect_timeout=5) as conn:
    conn.connect()
    print(json.dumps({"connected": conn.connected}))
"""
    assert _python(host, code, url) == {"connected": True}


def test_host_2_sees_the_repo_but_not_the_hidden_dirs(host, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("host 1 only")
    code = """
import json, os, sys
data = sys.argv[3]
open(os.path.join(data, "written-on-host-2"), "w").write("x")
print(json.dumps({"secret": os.path.exists(sys.argv[1]), "tmp": sorted(os.listdir(sys.argv[2])),
                  "repo": os.path.exists("setup.cfg"), "cwd": os.getcwd(), "python": os.path.exists(sys.executable),
                  "data": sorted(os.listdir(data)), "data_mode": oct(os.stat(data).st_mode & 0o777),
                  "shm": os.listdir("/dev/shm")}))
"""
    Path("/dev/shm/wq-test-host-1-only").write_text("x")
    try:
        seen = _python(host, code, str(secret), tempfile.gettempdir(), str(host.data_dir))
    finally:
        os.unlink("/dev/shm/wq-test-host-1-only")
    assert seen == {
        "secret": False,
        "tmp": [host.data_dir.name],
        "repo": True,
        "cwd": str(ROOT),
        "python": True,
        "data": ["written-on-host-2"],
        "data_mode": "0o700",
        "shm": [],
    }
    # Host 2's data dir is shared by its processes and never reaches host 1's disk.
    again = _python(host, "import json, os, sys; print(json.dumps(os.listdir(sys.argv[1])))", str(host.data_dir))
    assert again == ["written-on-host-2"]
    assert host.run(["true"], hide=[tmp_path]).returncode == 0, "hidden already, with the temp dir"
    assert list(host.data_dir.iterdir()) == []
    assert secret.read_text() == "host 1 only"


def test_a_directory_hidden_from_one_process_only(tmp_path):
    with second_host() as host:  # the temp dirs visible on this host
        (tmp_path / "mine").write_text("x")
        code = "import json, os, sys; print(json.dumps(os.listdir(sys.argv[1])))"
        assert _python(host, code, str(tmp_path)) == ["mine"]
        assert _python(host, code, str(tmp_path), hide=[tmp_path]) == []
        with pytest.raises(ValueError, match="no such directory"):
            host.popen(["true"], hide=[tmp_path / "not-yet"])
    with pytest.raises(ValueError, match="repository"):
        SecondHost(hide=[ROOT.parent])


def test_url_and_env_rewrite_loopback_urls_only(host):
    address, redis_port = host.forward(6379)
    assert host.forward(6379) == (address, redis_port), "one forwarder per port"
    assert host.url("redis://:s3cr@t@127.0.0.1:6379/0") == f"redis://:s3cr@t@{address}:{redis_port}/0"
    pg = host.forward(5432)[1]
    assert (
        host.url("db+postgresql+psycopg://u:p@localhost/whisperq?sslmode=disable")
        == f"db+postgresql+psycopg://u:p@{address}:{pg}/whisperq?sslmode=disable"
    )
    for url in ("redis://10.1.2.3:6379/0", "sqlite:////tmp/whisperq.db", "http://example.com/"):
        with pytest.raises(ValueError):
            host.url(url)
    env = host.env(
        {
            "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
            "DATABASE_URL": "sqlite:////x/whisperq.db",
            "PATH": "/usr/bin",
        },
        WHISPERQ_EXTRA="1",
    )
    assert env == {
        "CELERY_BROKER_URL": f"redis://{address}:{redis_port}/0",
        "DATABASE_URL": "sqlite:////x/whisperq.db",
        "PATH": "/usr/bin",
        "WHISPERQ_DATA_DIR": str(host.data_dir),
        "WHISPERQ_EXTRA": "1",
    }


class _HalfCloseServer:
    """On 127.0.0.1: odd connections read to EOF and answer the digest of what came;
    even ones send a greeting and shut their side first, then read to EOF."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        self.received: list[str] = []
        self.threads: list[threading.Thread] = []
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.accepter.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            first = conn.recv(1)
            if first == b"G":
                conn.sendall(b"hello " * 1000)
                conn.shutdown(socket.SHUT_WR)
            digest = hashlib.sha256(first)
            while chunk := conn.recv(65536):
                digest.update(chunk)
            self.received.append(digest.hexdigest())
            if first != b"G":
                conn.sendall(digest.hexdigest().encode())

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


HALF_CLOSE_CLIENTS = """
import hashlib, json, socket, sys, threading
address, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
results = [None] * n
socks = [socket.create_connection((address, port), timeout=20) for _ in range(n)]  # all open at once
def talk(i):
    sock = socks[i]
    payload = (b"G" if i % 2 else b"D") + bytes([i]) * (200_000 + i)
    if i % 2:
        sock.sendall(b"G")
        greeting = b""
        while chunk := sock.recv(65536):  # the server shut its side; ours is still open
            greeting += chunk
        sock.sendall(payload[1:])
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""
        results[i] = {"greeting": greeting == b"hello " * 1000, "sent": hashlib.sha256(payload).hexdigest()}
    else:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)  # ours shut: the answer must still come back
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        results[i] = {"answer": answer.decode(), "sent": hashlib.sha256(payload).hexdigest()}
    sock.close()
threads = [threading.Thread(target=talk, args=(i,)) for i in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(results))
"""


def test_forwarders_pass_half_closes_on_many_connections_at_once(host):
    server = _HalfCloseServer()
    try:
        address, port = host.forward(server.port)
        results = _python(host, HALF_CLOSE_CLIENTS, address, str(port), "40", timeout=60)
        for thread in server.threads:
            thread.join(5)
    finally:
        server.close()
    assert len(results) == 40
    for i, result in enumerate(results):
        if i % 2:
            assert result["greeting"] is True
        else:
            assert result["answer"] == result["sent"]
    assert sorted(server.received) == sorted(r["sent"] for r in results)
    assert host.forwarders.errors == []


def test_a_forwarder_serves_host_2_alone(host):
    """Not host 1's own processes, which reach the veth's address too (through lo): the
    forwarder closes what does not come from host 2's address before connecting on. (What
    comes in on eth0 its listener, bound to the veth, never sees.)"""
    server = _HalfCloseServer()
    try:
        address, port = host.forward(server.port)
        with socket.create_connection((address, port), timeout=2) as sock:
            sock.settimeout(2)
            assert sock.recv(1) == b""
        wait_until(lambda: host.forwarders.refused == 1, 5, "the forwarder did not count the refusal")
        assert server.threads == []  # the forwarder has dealt with the connection: it never reached the server
    finally:
        server.close()


def test_nothing_is_left_after_exit():
    _need_local(6379, "Redis")
    fds_before = set(os.listdir("/proc/self/fd"))
    threads_before = set(threading.enumerate())
    with second_host(hide=[tempfile.gettempdir()]) as host:
        name, device, data_dir = host.name, host.host1_device, host.data_dir
        url = host.url("redis://127.0.0.1:6379/0")
        # A client holding a connection through the forwarder, and one process in the background.
        holder = host.popen(
            [
                PY,
                "-c",
                "import redis, sys, time; r = redis.Redis.from_url(sys.argv[1]); r.ping(); "
                "print('up', flush=True); time.sleep(600)",
                url,
            ],
            stdout=subprocess.PIPE,
        )
        assert holder.stdout.readline() == b"up\n"
        host.popen(["sh", "-c", "sleep 600 & exec sleep 600"])
        pids = wait_until(
            lambda: len(found := host.pids() | {host.anchor.pid}) >= 4 and found,
            5,
            "the background processes did not start",
        )
        assert name in _netns() and _link_exists(device) and data_dir.is_dir()
        forwarder_thread = host.forwarders.thread
    assert name not in _netns()
    assert not _link_exists(device)
    assert not data_dir.exists()
    assert not forwarder_thread.is_alive()
    assert [pid for pid in pids if hosts._alive(pid)] == []
    assert set(threading.enumerate()) - threads_before == set()
    assert set(os.listdir("/proc/self/fd")) - fds_before == set(), "a socket or pipe left open"
    assert name not in hosts._live


def test_an_exception_inside_still_cleans_up():
    with pytest.raises(ZeroDivisionError), second_host() as host:
        name, proc = host.name, host.popen(["sleep", "600"])
        _ = 1 / 0
    assert name not in _netns()
    assert proc.returncode is not None and not hosts._alive(proc.pid)


def test_kill_9_of_a_process_kills_it_and_its_children(host):
    code = (
        "import json, subprocess, os, time; child = subprocess.Popen(['sleep', '600']); "
        "print(json.dumps([os.getpid(), child.pid]), flush=True); time.sleep(600)"
    )
    proc = host.popen([PY, "-c", code], stdout=subprocess.PIPE)
    own, child = json.loads(proc.stdout.readline())
    assert own == proc.pid, "the Popen's pid is the command's: nothing between them"
    assert host.pids() == {own, child}
    proc.kill()
    assert proc.wait(5) == -9
    wait_until(
        lambda: not hosts._alive(own) and not hosts._alive(child), 5, "the command or its child outlived the kill"
    )
    assert host.pids() == set()


def test_a_process_pinned_to_a_core(host):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU here: nothing to pin to")
    proc = host.popen(
        [PY, "-c", "import os, json; print(json.dumps([os.getpid(), sorted(os.sched_getaffinity(0))]))"],
        stdout=subprocess.PIPE,
        cpus="1",
    )
    out, _ = proc.communicate(timeout=30)
    assert json.loads(out) == [proc.pid, [1]]


def test_a_crashed_runs_namespace_is_removed_at_the_next_start():
    """A run killed with its host up leaves a namespace, a veth, a process and a mount point;
    its pid (beyond pid_max here, so certainly gone) marks them as stale."""
    pid = int(Path("/proc/sys/kernel/pid_max").read_text())
    stale = f"wq-{pid}-1"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    leftover = None
    try:
        subprocess.run(
            ["ip", "link", "add", f"{stale}h", "type", "veth", "peer", "name", f"{stale}g", "netns", stale], check=True
        )
        leftover = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "600"], start_new_session=True)
        mount_point = Path(tempfile.gettempdir()) / f"{stale}-data"
        mount_point.mkdir(exist_ok=True)
        wait_until(lambda: hosts._namespace_pids(stale), 5, "the leftover process did not start in its namespace")
        with second_host() as host:
            assert stale not in _netns()
            assert not _link_exists(f"{stale}h")
            assert leftover.wait(5) == -9
            assert not mount_point.exists()
            assert host.name in _netns()
    finally:
        if leftover is not None and leftover.poll() is None:
            leftover.kill()
            leftover.wait()
        subprocess.run(["ip", "link", "del", f"{stale}h"], capture_output=True)
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)


def test_no_namespace_is_a_skip_or_under_require_services_a_failure(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(HostUnavailable, match="root"):
        SecondHost().__enter__()
    with pytest.raises((pytest.skip.Exception, pytest.fail.Exception), match="no second host"), second_host():
        pass
    assert not [name for name in hosts._live if name.startswith(f"wq-{os.getpid()}-")]


@pytest.mark.integration
def test_a_celery_worker_on_host_2_answers_over_host_1s_broker(celery_app):
    """What the harness is for: a prefork worker on host 2, on host 1's broker through a
    forwarder, under a hostname of its own; kill -9 takes its pool with it."""
    from config import PREPARE_QUEUE

    with second_host(hide=[tempfile.gettempdir()]) as host:
        log = Path(tempfile.mkdtemp()) / "prepare-h2.log"
        proc = host.popen(
            worker_argv("prepare-h2", PREPARE_QUEUE, concurrency=2),
            env=host.env(),
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            cpus="0",
        )
        try:
            deadline, nodes = time.monotonic() + 60, []
            while not nodes and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()
                nodes = [
                    n for reply in celery_app.control.ping(timeout=1.0) for n in reply if n.startswith("prepare-h2@")
                ]
            assert nodes == [f"prepare-h2@{host.hostname}"], log.read_text()
            pool = host.pids()
            assert proc.pid in pool and len(pool) == 3, "the worker and its two pool processes"
            proc.kill()
            proc.wait(5)
            wait_until(lambda: not [pid for pid in pool if hosts._alive(pid)], 5, "the worker's pool outlived it")
            assert host.pids() == set()
        finally:
            shutil.rmtree(log.parent, ignore_errors=True)
