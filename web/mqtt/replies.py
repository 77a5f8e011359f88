"""What the bridge's clients are owed (models.delivery.mqtt_replies), published at QoS 1 until
the broker has acknowledged it: each status change of a request's job, then its result.

Messages on a reply topic, all JSON objects with `type` and the request's `correlation_id`
(and, on MQTT v5, the same as the message's correlation data):

- `status`: the job is not finished; `job_id`, `status`, `stage`, `progress`, its place in
  the queue and its estimates, as GET /v1/jobs/<id> shows them, and `status_url`.
- `result`: the job finished (COMPLETED, FAILED, CANCELLED, EXPIRED): `job_id`, `status`
  and `job`, exactly the JSON of GET /v1/jobs/<id> (the transcript in `job.result`). It is
  the last message for the request; `status` DELETED with `job` null if the job was deleted.
- `error` (web.mqtt.requests.Refused): the request was refused; nothing was made.

At least once: a message the broker had not acknowledged when the bridge or the broker went
down is sent again, so a client may see one twice (the same `job_id` and `status`).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from flask import Flask

from models.delivery.mqtt_replies import PendingReply, mark_acknowledged, pending_replies
from models.errors import JobNotFound
from models.jobs.operations import get_job

from ..api import job_body

log = logging.getLogger(__name__)

GONE = "DELETED"
STATUS_FIELDS = (
    "job_id",
    "status",
    "stage",
    "progress",
    "attempts",
    "error",
    "next_attempt_at",
    "queue_position",
    "estimated_start_at",
    "estimated_finish_at",
    "status_url",
)


def status_message(body: dict, correlation_id: str) -> dict:
    return {"type": "status", "correlation_id": correlation_id, **{k: body.get(k) for k in STATUS_FIELDS}}


def result_message(body: dict | None, correlation_id: str, job_id: str) -> dict:
    return {
        "type": "result",
        "correlation_id": correlation_id,
        "job_id": job_id,
        "status": body["status"] if body is not None else GONE,
        "job": body,
    }


@contextmanager
def request_context(app: Flask) -> Iterator[None]:
    """A request context of the bridge's app, for the API's job body (its URLs)."""
    rt = app.extensions["whisperq"]
    with app.test_request_context("/v1/jobs", base_url=rt.settings.base_url()):
        yield


class Replier:
    """Publishes the pending replies, from the database, and marks each one acknowledged once the
    broker has acknowledged it. Runs in one thread (`tick`); `acknowledged` may be called from any."""

    def __init__(self, app: Flask, publish: Callable[[str, dict, str], int]):
        self.app, self.rt, self.publish = app, app.extensions["whisperq"], publish
        self._acks: queue.Queue = queue.Queue()
        self._inflight: dict[int, tuple[PendingReply, str, bool]] = {}  # message id -> (reply, status sent, final)
        self._sent: dict[str, tuple[str, str, str]] = {}  # reply id -> (status, job id, topic) published last

    @property
    def pending(self) -> int:
        """Replies published that the broker has not acknowledged yet."""
        return len(self._inflight)

    def acknowledged(self, mid: int, refused: str | None = None) -> None:
        """The broker's PUBACK for a message (`refused`: its reason code, where it refused it)."""
        self._acks.put((mid, refused))

    def tick(self) -> int:
        """Settle what the broker acknowledged, then publish each reply whose job has moved on;
        how many were published."""
        self.record_acknowledgements()
        published = 0
        for reply in pending_replies(self.rt):
            if self._sent.get(reply.id) == (reply.status or GONE, reply.job_id, reply.reply_topic):
                continue  # its current status is on its way
            message, status, final = self._message(reply)
            if self._sent.get(reply.id) == (status, reply.job_id, reply.reply_topic):
                continue
            mid = self.publish(reply.reply_topic, message, reply.correlation_id)
            self._inflight[mid] = (reply, status, final)
            self._sent[reply.id] = (status, reply.job_id, reply.reply_topic)
            published += 1
        return published

    def record_acknowledgements(self) -> None:
        """Mark acknowledged, in the database, each reply the broker has acknowledged since the last call."""
        while True:
            try:
                mid, refused = self._acks.get_nowait()
            except queue.Empty:
                return
            entry = self._inflight.pop(mid, None)
            if entry is None:
                continue  # an error reply (web.mqtt.bridge waits for those itself)
            reply, status, final = entry
            if refused:  # its topic is not the bridge's to publish on: sending it again would not help
                log.warning(
                    "job %s: the MQTT broker refused the reply on %s (%s); check its ACL",
                    reply.job_id,
                    reply.reply_topic,
                    refused,
                )
            mark_acknowledged(self.rt, reply, status, final)
            if final and self._sent.get(reply.id) == (status, reply.job_id, reply.reply_topic):
                del self._sent[reply.id]

    def _message(self, reply: PendingReply) -> tuple[dict, str, bool]:
        """The message for the job's state now (read afresh), its status, and whether it is the last."""
        with request_context(self.app):
            try:
                job = get_job(self.rt, reply.job_id)
            except JobNotFound:
                return result_message(None, reply.correlation_id, reply.job_id), GONE, True
            if job.state.finished:
                return result_message(job_body(job), reply.correlation_id, job.id), job.status, True
            return status_message(job_body(job, detail=False), reply.correlation_id), job.status, False
