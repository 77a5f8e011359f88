"""The gRPC door's settings (`whisperq grpc`, docs/clients/grpc.md). Only the gRPC server reads
them; like Settings, a bad value stops it at start with a message naming the variable and
saying what to set it to. (The service's other settings, the limits and keys, are Settings'.)"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .env import ConfigError, Env

PORT_VARIABLE = "WHISPERQ_GRPC_PORT"
ADDRESS_VARIABLE = "WHISPERQ_GRPC_ADDRESS"
CERT_VARIABLE = "WHISPERQ_GRPC_TLS_CERT"
KEY_VARIABLE = "WHISPERQ_GRPC_TLS_KEY"
THREADS_VARIABLE = "WHISPERQ_GRPC_THREADS"
STREAMS_VARIABLE = "WHISPERQ_GRPC_STREAMS"
PER_CLIENT_VARIABLE = "WHISPERQ_GRPC_STREAMS_PER_CLIENT"
IDLE_VARIABLE = "WHISPERQ_GRPC_IDLE_SECONDS"
CALL_SECONDS_VARIABLE = "WHISPERQ_GRPC_CALL_SECONDS"
READS_VARIABLE = "WHISPERQ_GRPC_READ_RATE"
PLAINTEXT_VARIABLE = "WHISPERQ_GRPC_PLAINTEXT"
REFLECTION_VARIABLE = "WHISPERQ_GRPC_REFLECTION"
DEFAULT_PORT = 50051
DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_THREADS = 32
DEFAULT_PER_CLIENT = 4
DEFAULT_IDLE = 30.0
DEFAULT_CALL = 3600.0
DEFAULT_READS = "20/second"


@dataclass(frozen=True)
class GrpcSettings:
    address: str  # an IP address or host name to listen on; 127.0.0.1 (loopback) by default
    port: int  # 0: any free port (tests)
    tls_cert: Path | None = None  # PEM certificate chain, with tls_key: TLS on
    tls_key: Path | None = None
    # Calls served at once (each WatchJob or Upload holds one while it lasts); more wait.
    threads: int = DEFAULT_THREADS
    # Streams (Upload, WatchJob) open at once, server-wide (default: half the threads, so that
    # unary calls and health checks always find one) and per client (a key, else an address).
    streams: int = DEFAULT_THREADS // 2
    streams_per_client: int = DEFAULT_PER_CLIENT
    idle_seconds: float = DEFAULT_IDLE  # an Upload that sends nothing this long is ended
    call_seconds: float = DEFAULT_CALL  # the longest any call lasts (a WatchJob ends then: watch again)
    read_rate: str | None = DEFAULT_READS  # GetJob, WatchJob and Cancel per client; None: unlimited
    reflection: bool = False  # server reflection (grpcurl's `list`): an operator turns it on

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    @property
    def target(self) -> str:
        """host:port for grpc's add_*_port (an IPv6 address in brackets)."""
        host = self.address
        try:
            if ipaddress.ip_address(host).version == 6:
                host = f"[{host}]"
        except ValueError:
            pass
        return f"{host}:{self.port}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GrpcSettings:
        env = Env(os.environ if environ is None else environ)
        address = (env.str(ADDRESS_VARIABLE, DEFAULT_ADDRESS) or DEFAULT_ADDRESS).strip()
        if address.startswith("[") and address.endswith("]"):
            address = address[1:-1]
        if not address or (any(c in address for c in "/ :") and not _is_ip(address)):
            raise ConfigError(
                f"{ADDRESS_VARIABLE}={address!r} is not an address to listen on: set it to an IP "
                f"address such as {DEFAULT_ADDRESS} (loopback, the default), 0.0.0.0 (every interface) "
                "or a host name"
            )
        port = env.int(PORT_VARIABLE, DEFAULT_PORT, 0, 65535)
        threads = env.int(THREADS_VARIABLE, DEFAULT_THREADS, 2, 10_000)
        streams = env.int(STREAMS_VARIABLE, threads // 2, 1, threads - 1)
        per_client = env.int(PER_CLIENT_VARIABLE, min(DEFAULT_PER_CLIENT, streams), 1, streams)
        idle = env.float(IDLE_VARIABLE, DEFAULT_IDLE, 1.0)
        call = env.float(CALL_SECONDS_VARIABLE, DEFAULT_CALL, 10.0)
        reads = (env.str(READS_VARIABLE, DEFAULT_READS) or "").strip() or None
        if reads is not None and reads.lower() not in ("off", "none"):
            _check_rate(reads)
        else:
            reads = None
        cert, key = _pem(env, CERT_VARIABLE), _pem(env, KEY_VARIABLE)
        if (cert is None) != (key is None):
            given, missing = (CERT_VARIABLE, KEY_VARIABLE) if cert is not None else (KEY_VARIABLE, CERT_VARIABLE)
            raise ConfigError(
                f"{given} is set but {missing} is not: set both, {CERT_VARIABLE} to the PEM certificate "
                f"chain and {KEY_VARIABLE} to its PEM private key, for TLS (or neither, for plaintext)"
            )
        if cert is None and not _loopback(address) and not env.bool(PLAINTEXT_VARIABLE, False):
            raise ConfigError(
                f"{ADDRESS_VARIABLE}={address} listens beyond this machine, and the gRPC door would carry API keys "
                f"and audio in plaintext: set {CERT_VARIABLE} and {KEY_VARIABLE} for TLS, or {PLAINTEXT_VARIABLE}=true "
                "where a proxy or a service mesh in front of it does TLS"
            )
        return cls(
            address=address,
            port=port,
            tls_cert=cert,
            tls_key=key,
            threads=threads,
            streams=streams,
            streams_per_client=per_client,
            idle_seconds=idle,
            call_seconds=call,
            read_rate=reads,
            reflection=env.bool(REFLECTION_VARIABLE, False),
        )


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _check_rate(rate: str) -> None:
    from limits import parse

    try:
        parse(rate)
    except ValueError:
        raise ConfigError(
            f"{READS_VARIABLE}={rate!r} is not a rate: set it to N/second, N/minute (as `limits` reads them), or off"
        ) from None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _pem(env: Env, name: str) -> Path | None:
    value = env.str(name, None)
    if value is None or not value.strip():
        return None
    path = Path(value.strip()).expanduser()
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"{name}={value!r} cannot be read ({exc.strerror or exc}): set it to the path of a PEM "
            "file the gRPC server can read"
        ) from None
    if b"-----BEGIN " not in text:
        raise ConfigError(
            f"{name}={value!r} is not a PEM file (no '-----BEGIN' line): set it to the path of a PEM "
            f"{'certificate chain' if name == CERT_VARIABLE else 'private key'}"
        )
    return path
