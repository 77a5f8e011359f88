"""The gRPC server: whisperq.v1.Transcription (web.rpc.service), the standard health service
(grpc.health.v1.Health: SERVING while the database answers) and server reflection, on
WHISPERQ_GRPC_ADDRESS:WHISPERQ_GRPC_PORT (127.0.0.1:50051), with TLS where
WHISPERQ_GRPC_TLS_CERT and WHISPERQ_GRPC_TLS_KEY name PEM files (config.grpc)."""

from __future__ import annotations

import logging
import signal
import threading
from concurrent import futures

import grpc
from flask import Flask
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from config import Settings
from config.grpc import GrpcSettings
from models.runtime import Runtime

from .service import Transcription
from .v1 import transcription_pb2 as pb
from .v1 import transcription_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Transcription"].full_name  # whisperq.v1.Transcription
MAX_MESSAGE = 4 * 1024 * 1024  # a message's bytes either way, gRPC's default: audio over it goes by Upload
HEALTH_STEP = 5.0  # seconds between looks at the database for the health service's watchers
DRAIN_SECONDS = 10.0  # calls in flight get this long after SIGTERM


class Health(health.HealthServicer):
    """grpc.health.v1.Health whose status is the database's: looked at on every Check, and every
    HEALTH_STEP for Watch."""

    def __init__(self, rt: Runtime):
        super().__init__()
        self.rt = rt
        self.stopped = threading.Event()

    def refresh(self) -> None:
        try:
            self.rt.db.ping()
            status = health_pb2.HealthCheckResponse.SERVING
        except Exception as exc:
            log.warning("gRPC health: the database is unreachable (%s)", type(exc).__name__)
            status = health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE):
            self.set(name, status)

    def Check(self, request, context):
        if request.service in ("", SERVICE):
            self.refresh()
        return super().Check(request, context)

    def keep(self) -> None:
        while not self.stopped.wait(HEALTH_STEP):
            self.refresh()


class Server:
    """A started server: `port` is the one bound (WHISPERQ_GRPC_PORT=0: any free one)."""

    def __init__(self, server: grpc.Server, port: int, health_servicer: Health, service: Transcription):
        self.server, self.port, self.health, self.service = server, port, health_servicer, service

    def stop(self, grace: float | None = None) -> None:
        self.health.stopped.set()
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()

    def wait(self) -> None:
        self.server.wait_for_termination()


def start(rt: Runtime, grpc_settings: GrpcSettings) -> Server:
    """Build and start the server over `rt` (a runtime with its broker, as create_app wires it)."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
        ("grpc.so_reuseport", 0),
        # Keepalive: a peer that vanished (a lost host, a cut network) is found out and its
        # calls end; a client may ping no more often than every 30 s; an idle connection goes.
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 30_000),
        ("grpc.max_connection_idle_ms", 300_000),
    ]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=grpc_settings.threads, thread_name_prefix="grpc"),
        options=options,
        # Past this many calls in progress (running or waiting for a thread), a new one is
        # refused at once (RESOURCE_EXHAUSTED) rather than queued without end.
        maximum_concurrent_rpcs=2 * grpc_settings.threads,
    )
    service = Transcription(rt, grpc_settings)
    pb_grpc.add_TranscriptionServicer_to_server(service, server)
    health_servicer = Health(rt)
    health_servicer.refresh()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if grpc_settings.reflection:  # WHISPERQ_GRPC_REFLECTION: off unless an operator turns it on
        reflection.enable_server_reflection((SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    if grpc_settings.tls:
        assert grpc_settings.tls_cert is not None and grpc_settings.tls_key is not None
        credentials = grpc.ssl_server_credentials(
            [(grpc_settings.tls_key.read_bytes(), grpc_settings.tls_cert.read_bytes())]
        )
        port = server.add_secure_port(grpc_settings.target, credentials)
    else:
        port = server.add_insecure_port(grpc_settings.target)
    if not port:
        raise RuntimeError(
            f"the gRPC server could not listen on {grpc_settings.target}: is the port taken? Set "
            "WHISPERQ_GRPC_PORT to a free one"
        )
    server.start()
    threading.Thread(target=health_servicer.keep, name="grpc-health", daemon=True).start()
    return Server(server, port, health_servicer, service)


def runtime_of(app: Flask) -> Runtime:
    return app.extensions["whisperq"]


def serve(settings: Settings, grpc_settings: GrpcSettings | None = None) -> None:
    """Run the server in the foreground until SIGTERM or SIGINT; calls in flight get DRAIN_SECONDS."""
    from web import create_app

    grpc_settings = grpc_settings or GrpcSettings.from_env()
    app = create_app({"SETTINGS": settings})  # the runtime with its broker, as the web and the MQTT bridge have it
    running = start(runtime_of(app), grpc_settings)
    log.info(
        "gRPC server listening on %s:%s (%s)",
        grpc_settings.address,
        running.port,
        "TLS" if grpc_settings.tls else "plaintext",
    )
    print(
        f"whisperq gRPC on {grpc_settings.address}:{running.port} ({'TLS' if grpc_settings.tls else 'plaintext'})",
        flush=True,
    )
    stopping = threading.Event()

    def stop(_signum, _frame) -> None:
        stopping.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    stopping.wait()
    running.stop(DRAIN_SECONDS)
