"""A job as the Job message: the body of GET /v1/jobs/<id> (the record, its place in the queue
and its estimates) under the same names, `job_id` as `id`; the links and webhook deliveries of
the HTTP body stay HTTP's. A field of the body the message has no room for is an error, not
dropped: the .proto grows with the view (tests/test_grpc.py builds a job with every analysis)."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format

from models.jobs.eta import estimate
from models.jobs.record import Job
from models.runtime import Runtime

from .v1 import transcription_pb2 as pb


def job_body(rt: Runtime, job: Job) -> dict[str, Any]:
    """What web.api.job_body shows of the job, as JSON values."""
    body = job.to_dict()
    body.update(estimate(rt, job))
    return json.loads(json.dumps(body, default=str))


def job_message(rt: Runtime, job: Job) -> pb.Job:
    return message_of(job_body(rt, job))


# The HTTP body's own: links, and the webhook deliveries of a job with a callback_url.
HTTP_ONLY = ("status_url", "cancel_url", "transcript_url", "transcript_urls", "webhook_deliveries")


def message_of(body: dict[str, Any]) -> pb.Job:
    fields = {k: v for k, v in body.items() if k not in HTTP_ONLY}
    fields["id"] = fields.pop("job_id")
    if isinstance(fields.get("result"), dict):
        fields["result"] = {k: v for k, v in fields["result"].items() if k != "job_id"}  # the job's own id
    return json_format.ParseDict(fields, pb.Job())
