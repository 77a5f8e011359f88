"""A real second host for multi-host tests: a network namespace, a mount namespace and a
hostname of its own on this machine, so that a worker started there shares nothing with the
test process (host 1) but what goes over the wire.

Addresses: each SecondHost takes the first free /30 of 198.18.0.0/15 (RFC 2544, for
benchmarks; routed nowhere), under a lock shared by the runs on this machine: its first
address is host 1's end of a veth pair, in the root namespace, the second is host 2's end,
inside (198.18.0.1 and 198.18.0.2 for the first host, 198.18.0.5 and .6 for a second one at
the same time). The namespace is `wq-<pid>-<n>`, the veth ends `wq-<pid>-<n>h` (host 1) and
`...g` (guest), the hostname inside the namespace's name. Host 2 has its own loopback (up)
and no default route: it reaches its own 127.0.0.0/8 and host 1's veth address, nothing
else (anything else fails with ENETUNREACH, before a packet is sent); IPv6 is off on both
veth ends, so not even link-local traffic goes out. Host 1's services listen on
127.0.0.1 only: `forward(port)` starts a TCP forwarder in this process, listening on host 1's
veth address (bound to the veth, serving host 2's address alone) and connecting to
127.0.0.1:port; `url(url)` rewrites a loopback redis://, amqp://, postgresql+psycopg:// URL
to go through one.

Files: host 2's processes run in a mount namespace of the host's own (made once, entered by
each process), in which the directories given as `hide` (host 1's data dir, its temp dirs),
/dev/shm and the local services' Unix socket directories lie under empty tmpfs mounts, and
`data_dir` is an empty tmpfs that host 2's processes share and host 1 never sees.

Guarantees: `popen()` execs through to the command (its pid is the command's), in a process
group of its own, and its kill() (SIGKILL) kills that whole group; on exit, also on an
exception, every process in the namespace is killed, the forwarders are stopped, the veth
and the namespace deleted. A namespace left by a run that died (its pid gone) is removed
when the next SecondHost starts. Where no namespace can be made (not root, no `ip`), entering
raises HostUnavailable, which `second_host()` turns into a skip, or a failure when
REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
SUBNET = ipaddress.ip_network("198.18.0.0/15")
PREFIX = "wq"
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)([hg]?)$")
# Shared by every run on the machine: two runs at once must not take the same /30.
LOCK = Path("/run/lock/whisperq-hosts.lock")
# A second machine has none of these: host 1's shared memory (billiard's semaphores) and the
# Unix sockets its local services listen on (libpq's default /run/postgresql), which would
# reach host 1's services without going over the veth.
ALWAYS_HIDDEN = ("/dev/shm", "/run/postgresql", "/run/mysqld", "/run/redis", "/run/rabbitmq", "/run/mosquitto")
DEFAULT_PORTS = {
    "redis": 6379,
    "rediss": 6379,
    "amqp": 5672,
    "pyamqp": 5672,
    "amqps": 5671,
    "postgresql": 5432,
    "postgres": 5432,
}
# The settings' URLs that `env()` sends through forwarders (config/settings.py).
URL_VARIABLES = ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL", "WHISPERQ_REDIS_URL")
LOOPBACK_NAMES = ("127.0.0.1", "localhost")
SO_BINDTODEVICE = getattr(socket, "SO_BINDTODEVICE", 25)

_counter = itertools.count(1)
_live: dict[str, SecondHost] = {}


class HostUnavailable(RuntimeError):
    """No second host can be made here: not root, a tool missing, namespaces refused."""


class HostProcess(subprocess.Popen):
    """A process on host 2: the leader of its own process group, so that kill() (SIGKILL)
    takes its children with it (a prefork worker's pool), as a machine that dies would."""

    def send_signal(self, sig: int) -> None:
        if sig != signal.SIGKILL:
            return super().send_signal(sig)
        self.poll()
        if self.returncode is not None:
            return  # reaped: its pid may belong to someone else now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)  # the leader is alive or a zombie: the group is ours


class _Forwarders:
    """TCP forwarders on host 1's veth address to 127.0.0.1, on an asyncio loop in a thread
    of their own: one thread serves any number of connections, and EOF in one direction is
    passed on (shutdown SHUT_WR) while the other direction keeps going."""

    def __init__(self, name: str, listen: str, device: str, peer: str):
        self.listen, self.device, self.peer = listen, device, peer
        self.ports: dict[int, int] = {}  # 127.0.0.1 port -> port on `listen`
        self.refused = 0  # connections from anything but host 2's address
        self.errors: list[str] = []
        self._servers: list[asyncio.AbstractServer] = []
        self._transports: set[asyncio.BaseTransport] = set()
        self._tasks: set[asyncio.Task] = set()
        self._lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(lambda loop, context: self.errors.append(str(context.get("message"))))
        self.thread = threading.Thread(target=self._run, name=f"{name}-forwarders", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.close()

    def forward(self, port: int) -> int:
        with self._lock:
            if port not in self.ports:
                self.ports[port] = asyncio.run_coroutine_threadsafe(self._start(port), self.loop).result(10)
            return self.ports[port]

    async def _start(self, port: int) -> int:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # Only what comes in over the veth: not host 1's own processes, not eth0.
            sock.setsockopt(socket.SOL_SOCKET, SO_BINDTODEVICE, self.device.encode())
            sock.bind((self.listen, 0))
            sock.listen(512)
            sock.setblocking(False)
            server = await asyncio.start_server(lambda r, w: self._serve(r, w, port), sock=sock)
        except BaseException:
            sock.close()
            raise
        self._servers.append(server)
        return sock.getsockname()[1]

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, port: int) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        self._transports.add(client_w.transport)
        upstream_w = None
        try:
            if (client_w.get_extra_info("peername") or ("",))[0] != self.peer:
                self.refused += 1
                return
            try:
                upstream_r, upstream_w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
            except (TimeoutError, OSError):
                return
            self._transports.add(upstream_w.transport)
            await asyncio.gather(
                self._pipe(client_r, upstream_w, client_w), self._pipe(upstream_r, client_w, upstream_w)
            )
            # Both directions at EOF: what is still buffered goes out before the FIN.
            for writer in (client_w, upstream_w):
                writer.close()
            await asyncio.wait_for(
                asyncio.gather(client_w.wait_closed(), upstream_w.wait_closed(), return_exceptions=True), 10
            )
        except (TimeoutError, asyncio.CancelledError, OSError):
            pass
        finally:
            for writer in (client_w, upstream_w):
                if writer is not None:
                    writer.transport.abort()  # closed already, or reset: a shutdown, a timeout
                    self._transports.discard(writer.transport)
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            if not writer.transport.is_closing():
                writer.write_eof()  # a half-close: the other direction goes on
        except (ConnectionError, OSError):
            # A reset on one side: reset the other, so its direction ends too.
            writer.transport.abort()
            other.transport.abort()

    async def _shutdown(self) -> None:
        for server in self._servers:
            server.close()
        for transport in list(self._transports):
            transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()

    def stop(self) -> None:
        if not self.thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise HostUnavailable(f"a second host needs `{name}` on PATH")
    return path


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([_tool("ip"), *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def _alive(pid: int) -> bool:
    """Running, not a zombie (a dead child that nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _namespace_pids(name: str) -> set[int]:
    """Every live process whose network namespace is `name`'s (zombies have none)."""
    try:
        target = os.stat(f"/run/netns/{name}")
    except FileNotFoundError:
        return set()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            found.add(int(entry))
    return found


def _kill_namespace(name: str, timeout: float = 10.0, reap=lambda: None) -> None:
    deadline = time.monotonic() + timeout
    while pids := _namespace_pids(name):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        reap()
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {sorted(pids)} in namespace {name} survived SIGKILL")
        time.sleep(0.02)  # between rounds of SIGKILL: the loop waits for the namespace to empty


def _ours(name: str) -> bool:
    """Made by a SecondHost of a process that still runs (this one, while it holds it)."""
    match = _NAME.match(name)
    if match is None:
        return True  # not one of ours at all: leave it alone
    pid = int(match.group(1))
    if pid == os.getpid():
        return f"{PREFIX}-{pid}-{match.group(2)}" in _live
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_stale() -> list[str]:
    """Delete what SecondHosts of runs that died left: their processes, namespaces, veths
    and data mount points. Returns the namespaces removed."""
    removed = []
    for line in _ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if _NAME.match(name) and not _ours(name):
            _kill_namespace(name)
            _ip("link", "del", f"{name}h", check=False)
            _ip("netns", "del", name, check=False)
            removed.append(name)
    for line in _ip("-o", "link", "show").stdout.splitlines():
        fields = line.split(":")
        link = fields[1].strip().split("@")[0] if len(fields) > 1 else ""
        if _NAME.match(link) and link.endswith("h") and not _ours(link):
            _ip("link", "del", link, check=False)
    for mount_point in Path(tempfile.gettempdir()).glob(f"{PREFIX}-*-*-data"):
        if _NAME.match(mount_point.name[: -len("-data")]) and not _ours(mount_point.name[: -len("-data")]):
            shutil.rmtree(mount_point, ignore_errors=True)
    return removed


def _free_subnet() -> ipaddress.IPv4Network:
    """The first /30 of SUBNET on which no interface here has an address (call under LOCK)."""
    used = set()
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            address = ipaddress.ip_interface(fields[fields.index("inet") + 1]).ip
            if address in SUBNET:
                used.add(ipaddress.ip_network(f"{address}/30", strict=False))
    for subnet in SUBNET.subnets(new_prefix=30):
        if subnet not in used:
            return subnet
    raise HostUnavailable(f"no free /30 left in {SUBNET}")


def _hidden(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """The directories to hide, resolved, each once, none under another (hidden with it)."""
    out: list[Path] = []
    for path in sorted({Path(os.path.realpath(p)) for p in paths}, key=lambda p: len(p.parts)):
        if path == ROOT or path in ROOT.parents:
            raise ValueError(f"hiding {path} would hide the repository and its virtualenv from host 2")
        if not path.is_dir():
            # One made later would be host 1's, seen by host 2: make it first.
            raise ValueError(f"cannot hide {path}: no such directory (yet)")
        if not any(parent in out for parent in path.parents):
            out.append(path)
    return out


def _not_in(*namespaces: str) -> str:
    """A shell line that stops a script unless it runs outside these namespaces ("mnt:[...]"):
    a tmpfs or a hostname meant for host 2 must never land on host 1."""
    tests = " && ".join(f'[ "$(readlink /proc/self/ns/{ns.split(":")[0]})" != {shlex.quote(ns)} ]' for ns in namespaces)
    return f"{tests} || {{ echo 'not in a namespace of its own' >&2; exit 97; }}"


def _namespace(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def _tmpfs(path: Path, mode: int | None = None) -> str:
    """A shell line mounting an empty tmpfs on `path`, with the owner and mode (or `mode`)
    that host 1's directory has there."""
    st = path.stat() if path.exists() else None
    options = f"mode={mode if mode is not None else (st.st_mode & 0o7777 if st else 0o700):o}"
    if st is not None and mode is None:
        options += f",uid={st.st_uid},gid={st.st_gid}"
    return f"mount -t tmpfs -o {options} {PREFIX}-tmpfs {shlex.quote(str(path))}"


class SecondHost:
    """Host 2: see the module's docstring. `hide` are host 1's directories its processes
    must not see; `data_dir` is where they get an empty, shared, private one (default: a
    new path), mounted over whatever host 1 has there (made, empty, where host 1 has
    nothing and no hidden directory covers it)."""

    def __init__(self, hide: Sequence[str | os.PathLike] = (), data_dir: str | os.PathLike | None = None):
        self._pid = os.getpid()  # a forked child's exit must not take its parent's host down
        self.name = f"{PREFIX}-{self._pid}-{next(_counter)}"
        if len(self.name) + 1 > 15:
            raise HostUnavailable(f"namespace name {self.name} too long for its veth's names")
        self.hostname = self.name
        self.hidden = _hidden([*hide, *(p for p in ALWAYS_HIDDEN if os.path.isdir(p))])
        self._own_data_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.gettempdir()) / f"{self.name}-data"
        self.host1_device, self.device = f"{self.name}h", f"{self.name}g"
        self.host1_address = self.address = ""
        self.anchor: subprocess.Popen | None = None
        self.forwarders: _Forwarders | None = None
        self.processes: list[HostProcess] = []
        self._made_namespace = False

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> SecondHost:
        if os.geteuid() != 0:
            raise HostUnavailable("a second host needs root (network and mount namespaces)")
        for tool in ("ip", "unshare", "nsenter", "bash"):
            _tool(tool)
        _live[self.name] = self
        try:
            self._start()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._teardown()

    def _start(self) -> None:
        remove_stale()
        LOCK.parent.mkdir(parents=True, exist_ok=True)
        with open(LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            subnet = _free_subnet()
            result = _ip("netns", "add", self.name, check=False)
            if result.returncode != 0:
                raise HostUnavailable(f"cannot make a network namespace: {result.stderr.strip()}")
            self._made_namespace = True
            _ip("link", "add", self.host1_device, "type", "veth", "peer", "name", self.device, "netns", self.name)
            self.host1_address, self.address = (str(subnet.network_address + i) for i in (1, 2))
            # IPv6 off before the links come up: no link-local address, no router solicitation.
            if os.path.exists(f"/proc/sys/net/ipv6/conf/{self.host1_device}"):
                Path(f"/proc/sys/net/ipv6/conf/{self.host1_device}/disable_ipv6").write_text("1")
                subprocess.run(
                    [
                        _tool("ip"),
                        "netns",
                        "exec",
                        self.name,
                        "sh",
                        "-c",
                        f"echo 1 > /proc/sys/net/ipv6/conf/{self.device}/disable_ipv6",
                    ],
                    check=True,
                    capture_output=True,
                    timeout=30,
                )
            _ip("addr", "add", f"{self.host1_address}/30", "dev", self.host1_device)
            _ip("-n", self.name, "addr", "add", f"{self.address}/30", "dev", self.device)
        _ip("link", "set", self.host1_device, "up")
        _ip("-n", self.name, "link", "set", self.device, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")
        self.forwarders = _Forwarders(self.name, self.host1_address, self.host1_device, self.address)
        self._start_anchor()

    def _start_anchor(self) -> None:
        """The process that holds host 2's mount and UTS namespaces, which popen() enters:
        its hidden directories and its data dir are the same for all its processes."""
        if self._own_data_dir:
            self.data_dir.mkdir(mode=0o700)
        lines = [
            "set -e",
            _not_in(_namespace("self", "mnt"), _namespace("self", "uts")),
            *(_tmpfs(path) for path in self.hidden),
            f"mkdir -p {shlex.quote(str(self.data_dir))}",
            _tmpfs(self.data_dir, mode=0o700),
            f"echo {self.hostname} > /proc/sys/kernel/hostname",
            "echo ready",
            "exec sleep infinity </dev/null >/dev/null 2>&1",
        ]
        self.anchor = subprocess.Popen(
            [
                _tool("ip"),
                "netns",
                "exec",
                self.name,
                _tool("unshare"),
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "--",
                _tool("bash"),
                "-c",
                "\n".join(lines),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        ready, _, _ = select.select([self.anchor.stdout], [], [], 30)
        line = self.anchor.stdout.readline() if ready else b""
        self.anchor.stdout.close()
        if line.strip() != b"ready":
            self.anchor.kill()
            self.anchor.wait(10)
            error = self.anchor.stderr.read().decode(errors="replace").strip()
            self.anchor.stderr.close()
            raise RuntimeError(f"host 2's mount namespace failed: {error}")
        self.anchor.stderr.close()

    def _reap(self) -> None:
        for proc in [*self.processes, *([self.anchor] if self.anchor else [])]:
            proc.poll()

    def _teardown(self) -> None:
        errors = []
        survivors = False
        for proc in [*self.processes, *([self.anchor] if self.anchor else [])]:
            proc.kill()  # what we started, by its group, whichever namespace it is in now
        try:
            if self._made_namespace:
                _kill_namespace(self.name, reap=self._reap)
        except Exception as exc:
            errors.append(exc)
            survivors = True  # the namespace stays, so the next SecondHost finds and kills them
        for proc in [*self.processes, *([self.anchor] if self.anchor else [])]:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired as exc:
                errors.append(exc)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        if self.forwarders is not None:
            try:
                self.forwarders.stop()
            except Exception as exc:
                errors.append(exc)
        if self._made_namespace and not survivors:
            for args in (("link", "del", self.host1_device), ("netns", "del", self.name)):
                result = _ip(*args, check=False)
                if result.returncode != 0 and "Cannot find device" not in result.stderr:
                    errors.append(RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}"))
            self._made_namespace = False
        if self._own_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        _live.pop(self.name, None)
        if errors:
            raise RuntimeError(f"second host {self.name} not cleaned up: {errors}")

    # -- network ---------------------------------------------------------------------------
    def forward(self, port: int) -> tuple[str, int]:
        """(address, port) on host 1's veth end through which host 2 reaches 127.0.0.1:port."""
        if self.forwarders is None:
            raise RuntimeError("the second host is not started")
        return self.host1_address, self.forwarders.forward(port)

    def url(self, url: str) -> str:
        """`url` (redis://, amqp://, postgresql+psycopg://, db+postgresql://, ...) at
        127.0.0.1 or localhost, as host 2 reaches it: through a forwarder."""
        parts = urlsplit(url)
        if parts.hostname not in LOOPBACK_NAMES:
            raise ValueError(f"{url.split('@')[-1]!r}: host 2 reaches host 1's loopback services only")
        port = parts.port
        if port is None:
            known = [DEFAULT_PORTS[p] for p in parts.scheme.split("+") if p in DEFAULT_PORTS]
            if not known:
                raise ValueError(f"no port in {parts.scheme}:// URL and no default known for it")
            port = known[0]
        address, forwarded = self.forward(port)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@{address}:{forwarded}" if "@" in parts.netloc else f"{address}:{forwarded}"
        prefix = f"{parts.scheme}://{parts.netloc}"
        assert url.startswith(prefix), url
        return f"{parts.scheme}://{netloc}{url[len(prefix) :]}"

    def env(self, base: dict[str, str] | None = None, **overrides: str) -> dict[str, str]:
        """An environment for whisperq on host 2: `base` (this process's) with its loopback
        broker, result backend, database and Redis URLs through forwarders, and
        WHISPERQ_DATA_DIR at host 2's data dir; then `overrides`."""
        env = dict(os.environ if base is None else base)
        for variable in URL_VARIABLES:
            value = env.get(variable)
            if value and urlsplit(value).hostname in LOOPBACK_NAMES:
                env[variable] = self.url(value)
        env["WHISPERQ_DATA_DIR"] = str(self.data_dir)
        env.update(overrides)
        return env

    # -- processes -------------------------------------------------------------------------
    def popen(
        self,
        argv: Sequence[str | os.PathLike],
        env: dict[str, str] | None = None,
        hide: Sequence[str | os.PathLike] = (),
        cwd: str | os.PathLike = ROOT,
        stdout=None,
        stderr=None,
        cpus: str | None = None,
        **kwargs,
    ) -> HostProcess:
        """Start `argv` on host 2 (in its network, mount and UTS namespaces; `hide`: more of
        host 1's directories hidden for this process alone; `cpus`: taskset's CPU list) and
        return it: its pid is argv's, its kill() kills its process group (an os.kill of
        the pid alone leaves its children until the host exits)."""
        if self.anchor is None or self.anchor.poll() is not None:
            raise RuntimeError(f"second host {self.name} is not running")
        cwd = os.path.abspath(cwd)
        command = [_tool("nsenter"), f"--target={self.anchor.pid}", "--net", "--mount", "--uts", f"--wdns={cwd}", "--"]
        # Not those under a directory the whole host hides already: host 2 has nothing there.
        extra = [p for p in _hidden(hide) if not any(h == p or h in p.parents for h in self.hidden)]
        if extra:
            script = [
                "set -e",
                _not_in(_namespace("self", "mnt"), _namespace(self.anchor.pid, "mnt")),
                *(_tmpfs(path) for path in extra),
                f"cd -- {shlex.quote(cwd)}",
                'exec "$@"',
            ]
            command += [
                _tool("unshare"),
                "--mount",
                "--propagation",
                "private",
                "--",
                _tool("bash"),
                "-c",
                "\n".join(script),
                "bash",
            ]
        if cpus is not None:
            command += [_tool("taskset"), "-c", cpus]
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        proc = HostProcess(
            [*command, *map(os.fspath, argv)], env=env, stdout=stdout, stderr=stderr, start_new_session=True, **kwargs
        )
        self.processes.append(proc)
        return proc

    def run(
        self, argv: Sequence[str | os.PathLike], timeout: float = 30.0, check: bool = False, **kwargs
    ) -> subprocess.CompletedProcess:
        """A short command on host 2, its output captured as text (as subprocess.run)."""
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("text", True)
        proc = self.popen(argv, **kwargs)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result

    def pids(self) -> set[int]:
        """The live processes on host 2, less the one that holds its namespaces."""
        return _namespace_pids(self.name) - ({self.anchor.pid} if self.anchor else set())


@contextmanager
def second_host(**kwargs) -> Iterator[SecondHost]:
    """A SecondHost for a test: skipped where none can be made, failed with REQUIRE_SERVICES=1."""
    from helpers import need_service

    host = SecondHost(**kwargs)
    try:
        host.__enter__()
    except HostUnavailable as exc:
        need_service(f"no second host: {exc}")
    try:
        yield host
    finally:
        host.__exit__(None, None, None)


@atexit.register
def _teardown_all() -> None:
    """A host whose context was never left (an interrupted run) goes when the process does."""
    for host in [host for host in _live.values() if host._pid == os.getpid()]:
        with contextlib.suppress(Exception):
            host._teardown()
