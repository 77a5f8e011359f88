"""What keeps one caller from holding the gRPC door: every stream (Upload, WatchJob) holds one of
the server's threads while it lasts, so streams are capped server-wide (below the threads, so
unary calls and health checks always find one) and per client (its key, else its address); an
Upload that sends nothing for a while, and any call past its longest, is ended; and reads
(GetJob, WatchJob, Cancel) are rated per client, in this process's memory (`limits`).

A refusal is RESOURCE_EXHAUSTED with a time to come back (web.rpc.errors), as HTTP's 429."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from config.grpc import GrpcSettings
from models.access.admission import RateLimited
from models.errors import WhisperqError


class TooManyStreams(WhisperqError):
    code = "too_many_streams"
    http_status = 429

    def __init__(self, message: str):
        super().__init__(message)
        self.retry_after = 1


class Holds:
    def __init__(self, settings: GrpcSettings):
        self.settings = settings
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}
        self._total = 0
        self._reads: Any = None
        if settings.read_rate is not None:
            from limits import parse
            from limits.storage import MemoryStorage
            from limits.strategies import MovingWindowRateLimiter

            self._rate = parse(settings.read_rate)
            self._reads = MovingWindowRateLimiter(MemoryStorage())

    @contextmanager
    def stream(self, client: str) -> Iterator[None]:
        """Hold one of the streams for `client` while the block runs; TooManyStreams when the
        server's, or the client's, are all taken."""
        s = self.settings
        with self._lock:
            if self._open.get(client, 0) >= s.streams_per_client:
                raise TooManyStreams(
                    f"this client has {s.streams_per_client} streams open (WHISPERQ_GRPC_STREAMS_PER_CLIENT); "
                    "end one, or wait for a job with GetJob"
                )
            most = min(s.streams, s.threads - 1)  # a thread is always left for unary calls
            if self._total >= most:
                raise TooManyStreams(f"the server has {most} streams open (WHISPERQ_GRPC_STREAMS); try again")
            self._open[client] = self._open.get(client, 0) + 1
            self._total += 1
        try:
            yield
        finally:
            with self._lock:
                self._total -= 1
                self._open[client] -= 1
                if not self._open[client]:
                    del self._open[client]

    def read(self, client: str) -> None:
        """Count one read of `client`; RateLimited past WHISPERQ_GRPC_READ_RATE."""
        if self._reads is None:
            return
        if not self._reads.hit(self._rate, client):
            reset = max(1, int(self._reads.get_window_stats(self._rate, client).reset_time - time.time()) + 1)
            raise RateLimited(
                f"too many reads from this client: the limit is {self.settings.read_rate} (WHISPERQ_GRPC_READ_RATE); "
                f"try again in {reset} s, or follow a job with WatchJob",
                reset,
                {},
            )

    def watched(self, chunks: Iterator[Any], context: Any) -> Iterator[Any]:
        """The chunks of a client stream; the call is cancelled once none has come for
        WHISPERQ_GRPC_IDLE_SECONDS, or it has lasted WHISPERQ_GRPC_CALL_SECONDS."""
        s, started = self.settings, time.monotonic()
        last, done = [started], threading.Event()

        def watchdog() -> None:
            while not done.wait(min(1.0, s.idle_seconds / 4)):
                now = time.monotonic()
                if now - last[0] > s.idle_seconds or now - started > s.call_seconds:
                    context.cancel()
                    return

        threading.Thread(target=watchdog, name="grpc-idle", daemon=True).start()
        try:
            for chunk in chunks:
                last[0] = time.monotonic()
                yield chunk
        finally:
            done.set()
