"""The calls of whisperq.v1.Transcription. Submit and Upload turn what they received into a door
Submission (models.pipeline.door) and submit it through models.pipeline.intake, after the same
checks before the body that HTTP makes (the one door's gate: the client's rate, disk, queue, quota);
GetJob, Cancel and WatchJob read and change jobs as web.api does, scoped to the caller's key."""

from __future__ import annotations

import functools
import io
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from config.grpc import GrpcSettings
from models.access.apikeys import Principal
from models.errors import InvalidRequest
from models.jobs.operations import cancel_job, get_job
from models.pipeline import intake
from models.pipeline.door import Submission, client_bucket, gate
from models.pipeline.request import FIELDS
from models.runtime import Runtime
from models.storage import SealedSpool

from ..statuscache import StatusCache
from ..uploads import check_filename
from ..waits import JobWatch
from . import auth
from .errors import UploadTooLarge, status_of
from .holds import Holds
from .jobs import job_message
from .v1 import transcription_pb2 as pb
from .v1 import transcription_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

DOOR = "grpc"
WATCH_STEP = 10.0  # seconds a WatchJob waits for a change before it looks whether its client is still there


def _job_state(rt: Runtime, job: Any) -> str:
    from ..api import job_state  # the digest behind the HTTP ETag: what a long-poll waits on

    return job_state(rt, job)


def _answered(method: Callable) -> Callable:
    """A unary call: whatever it raises ends it with its status (web.rpc.errors)."""

    @functools.wraps(method)
    def call(self, request, context):
        try:
            return method(self, request, context)
        except Exception as exc:
            status = status_of(exc)
        context.abort_with_status(status)

    return call


def _streamed(method: Callable) -> Callable:
    """A server-streaming call: the same, for a generator."""

    @functools.wraps(method)
    def call(self, request, context):
        try:
            yield from method(self, request, context)
            return
        except Exception as exc:
            status = status_of(exc)
        context.abort_with_status(status)

    return call


def peer_address(context: grpc.ServicerContext) -> str:
    """The caller's address, without its port: what its rate counts under when it has no key."""
    peer = context.peer() or "unknown"  # ipv4:127.0.0.1:5000, ipv6:[::1]:5000, unix:/path
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        rest = rest.rsplit(":", 1)[0].strip("[]")
    return rest


def _fields(request: pb.SubmitRequest) -> dict[str, Any]:
    """The options that were set, as a form sends them (unset: the default, as a field left out)."""
    out: dict[str, Any] = {}
    for name in FIELDS:
        if request.HasField(name):
            value = getattr(request, name)
            out[name] = ("true" if value else "false") if isinstance(value, bool) else value
    return out


def _too_large(rt: Runtime) -> Callable[[], BaseException]:
    mb = rt.settings.max_upload_mb
    return lambda: UploadTooLarge(f"the upload is larger than the limit of {mb} MB (WHISPERQ_MAX_UPLOAD_MB)")


def _named(request: pb.SubmitRequest) -> str:
    name = request.filename
    if not name:
        raise InvalidRequest("filename is missing: give the file's name with its extension, such as call.mp3")
    check_filename(name)
    return name


def _sealed(spool: SealedSpool) -> SealedSpool:
    try:
        spool.finish()
        if spool.size == 0:
            raise InvalidRequest("the uploaded file is empty; choose a file with audio in it")
    except BaseException:
        spool.discard()
        raise
    return spool


class Transcription(pb_grpc.TranscriptionServicer):
    def __init__(self, rt: Runtime, settings: GrpcSettings | None = None):
        self.rt = rt
        self.settings = settings or GrpcSettings(address="127.0.0.1", port=0)
        self.holds = Holds(self.settings)  # streams capped, idle uploads ended, reads rated (web.rpc.holds)
        self.watch = JobWatch(_job_state, StatusCache())  # one reader for every WatchJob of this server

    # -- who, and what is refused before the audio is read ---------------------------------------

    def _who(self, context: grpc.ServicerContext) -> Principal:
        return auth.principal(self.rt, context.invocation_metadata())

    def _reader(self, context: grpc.ServicerContext) -> Principal:
        """The caller of a read (GetJob, WatchJob, Cancel), its read counted at its rate."""
        who = self._who(context)
        self.holds.read(client_bucket(who, peer_address(context)))
        return who

    def _admit(self, who: Principal, context: grpc.ServicerContext, request: pb.SubmitRequest) -> None:
        key = request.idempotency_key if request.HasField("idempotency_key") else None
        gate(self.rt, who, peer_address(context), DOOR, key)

    def _submit(self, who: Principal, request: pb.SubmitRequest, **audio: Any) -> pb.Job:
        sub = Submission(
            who,
            DOOR,
            fields=_fields(request),
            idempotency_key=(request.idempotency_key if request.HasField("idempotency_key") else None),
            **audio,
        )
        job, _ = intake.submit(self.rt, sub)
        return job_message(self.rt, job)

    # -- the calls -------------------------------------------------------------------------------

    @_answered
    def Submit(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> pb.Job:
        who = self._who(context)
        self._admit(who, context, request)
        source = request.WhichOneof("source")
        if source == "audio_url":
            if not request.audio_url.strip():
                raise InvalidRequest("audio_url is empty: give the http(s) URL of the audio, or send its bytes")
            return self._submit(who, request, audio_url=request.audio_url.strip())
        if source != "audio":
            raise InvalidRequest(
                "no audio: send the file's bytes in `audio` (with its `filename`), or its URL in "
                "`audio_url`; for a file over 4 MiB call Upload"
            )
        name = _named(request)
        spool = self.rt.storage.spool(
            io.BytesIO(request.audio), limit=self.rt.settings.max_upload_bytes, too_large=_too_large(self.rt)
        )
        return self._submit(who, request, upload=_sealed(spool), filename=name)

    @_answered
    def Upload(self, request_iterator: Iterator[pb.UploadChunk], context: grpc.ServicerContext) -> pb.Job:
        who = self._who(context)
        with self.holds.stream(client_bucket(who, peer_address(context))):
            return self._upload(who, self.holds.watched(request_iterator, context), context)

    def _upload(self, who: Principal, request_iterator: Iterator[pb.UploadChunk], context: grpc.ServicerContext):
        first = next(request_iterator, None)
        if first is None or not first.HasField("head"):
            raise InvalidRequest("the first chunk must carry `head`: the file's name and the job's options")
        head = first.head
        if head.WhichOneof("source") is not None:
            raise InvalidRequest(
                "an upload's `head` names no audio: send the file's bytes in each chunk's `data` "
                "(call Submit for an audio_url)"
            )
        name = _named(head)
        self._admit(who, context, head)  # before any audio is read, as HTTP does
        spool = SealedSpool(
            self.rt.storage.tmp_dir, limit=self.rt.settings.max_upload_bytes, too_large=_too_large(self.rt)
        )
        try:
            spool.write(first.data)
            for chunk in request_iterator:
                if chunk.HasField("head"):
                    raise InvalidRequest("only the first chunk carries `head`; the others carry `data` only")
                spool.write(chunk.data)
        except BaseException:
            spool.discard()
            raise
        return self._submit(who, head, upload=_sealed(spool), filename=name)

    @_answered
    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.Job:
        who = self._reader(context)
        return job_message(self.rt, get_job(self.rt, request.id, owner=auth.scope(who)))

    @_answered
    def Cancel(self, request: pb.CancelRequest, context: grpc.ServicerContext) -> pb.Job:
        who = self._reader(context)
        # CANCELLED at once if it was waiting; a running job stops at its next window.
        return job_message(self.rt, cancel_job(self.rt, request.id, owner=auth.scope(who)))

    @_streamed
    def WatchJob(self, request: pb.WatchJobRequest, context: grpc.ServicerContext) -> Iterator[pb.Job]:
        who = self._reader(context)
        with self.holds.stream(client_bucket(who, peer_address(context))):
            yield from self._watch(who, request, context)

    def _watch(self, who: Principal, request: pb.WatchJobRequest, context: grpc.ServicerContext) -> Iterator[pb.Job]:
        owner, sent = auth.scope(who), None
        ends = time.monotonic() + self.settings.call_seconds  # then the client watches again
        while context.is_active() and time.monotonic() < ends:
            job = get_job(self.rt, request.id, owner=owner)  # NOT_FOUND once it is deleted, too
            state = _job_state(self.rt, job)
            if state != sent:
                yield job_message(self.rt, job)
                sent = state
            if job.state.finished:
                return
            # Woken by the one reader (web.waits) when the job's state moves from `state`.
            self.watch.wait(self.rt, request.id, state, WATCH_STEP)
