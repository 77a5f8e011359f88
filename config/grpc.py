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
DEFAULT_PORT = 50051
DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_THREADS = 32


@dataclass(frozen=True)
class GrpcSettings:
    address: str  # an IP address or host name to listen on; 127.0.0.1 (loopback) by default
    port: int  # 0: any free port (tests)
    tls_cert: Path | None = None  # PEM certificate chain, with tls_key: TLS on
    tls_key: Path | None = None
    # Calls served at once (each WatchJob holds one while it follows its job); more wait.
    threads: int = DEFAULT_THREADS

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
        threads = env.int(THREADS_VARIABLE, DEFAULT_THREADS, 1, 10_000)
        cert, key = _pem(env, CERT_VARIABLE), _pem(env, KEY_VARIABLE)
        if (cert is None) != (key is None):
            given, missing = (CERT_VARIABLE, KEY_VARIABLE) if cert is not None else (KEY_VARIABLE, CERT_VARIABLE)
            raise ConfigError(
                f"{given} is set but {missing} is not: set both, {CERT_VARIABLE} to the PEM certificate "
                f"chain and {KEY_VARIABLE} to its PEM private key, for TLS (or neither, for plaintext)"
            )
        return cls(address=address, port=port, tls_cert=cert, tls_key=key, threads=threads)


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
