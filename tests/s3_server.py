"""An S3 and SQS server on loopback for the S3 storage tests (test_s3, test_storage's s3
backend) and the SQS broker's (test_sqs, test_compat): moto's, in this process
(ThreadedMotoServer on 127.0.0.1 and a port of its own, one server answering every AWS API),
reached the way a deployment reaches AWS, through AWS's own variables (AWS_ENDPOINT_URL and the
rest), so the service's code runs as it would against S3 and SQS. conftest.py loads its
fixtures: s3_server (one per session), s3_env (the variables, set for one test), s3_bucket (a
new bucket), sqs_env (s3_env, where kombu's SQS transport can run: it needs pycurl too).

Without boto3 or moto (`make install` installs both, in the test extra), or pycurl for SQS,
the tests that need them are skipped, or fail when REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers import need_service

REGION = "eu-west-1"


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str]  # what a process needs to reach it: AWS_ENDPOINT_URL, the region, credentials

    def client(self, service: str = "s3") -> Any:
        """A client of the test's own, to look into the bucket (or the queues) past the service's code."""
        import boto3

        return boto3.session.Session(
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name=REGION,
        ).client(service, endpoint_url=self.endpoint)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    try:
        import boto3  # noqa: F401
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        need_service(f"the S3 tests need boto3 and moto[server] (`make install` installs them): {exc}")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    nothing = tmp_path_factory.mktemp("aws") / "none"  # no profile of the machine's may count
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": str(nothing),
        "AWS_SHARED_CREDENTIALS_FILE": str(nothing),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    yield S3Server(endpoint, env)
    server.stop()


@pytest.fixture()
def s3_env(s3_server, monkeypatch) -> S3Server:
    """AWS's variables pointing at the loopback server, for this test only."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture()
def sqs_env(s3_env, monkeypatch) -> S3Server:
    """s3_env, for SQS as the broker: the same server answers SQS's API. kombu's SQS transport
    needs pycurl as well (its asynchronous client)."""
    try:
        import pycurl  # noqa: F401
    except ImportError as exc:
        need_service(f"the SQS tests need pycurl (`make install` installs it, in the test extra): {exc}")
    monkeypatch.delenv("AWS_ENDPOINT_URL_SQS", raising=False)
    # the workers' polls are many requests: the server's line for each would fill a failure's report
    monkeypatch.setattr(logging.getLogger("werkzeug"), "level", logging.WARNING)
    return s3_env


@pytest.fixture()
def s3_bucket(s3_env) -> str:
    """A new, empty bucket on the loopback server (with the variables set): its name."""
    name = f"wq-test-{uuid.uuid4().hex[:12]}"
    s3_env.client().create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": REGION})
    return name


@dataclass
class Traffic:
    """The requests a boto3 client makes, recorded with botocore's events: each operation's
    parameters in order, and the body bytes each GetObject brought back."""

    calls: list[tuple[str, dict]] = field(default_factory=list)
    received: list[int] = field(default_factory=list)

    def watch(self, client: Any) -> Traffic:
        client.meta.events.register("provide-client-params.s3", self._called)
        client.meta.events.register("after-call.s3.GetObject", self._got)
        return self

    def _called(self, params, model, **_kw) -> None:
        self.calls.append((model.name, dict(params)))

    def _got(self, http_response, parsed, **_kw) -> None:
        self.received.append(int(parsed.get("ContentLength", 0)))

    def count(self) -> Counter:
        return Counter(name for name, _ in self.calls)

    def of(self, operation: str) -> list[dict]:
        return [params for name, params in self.calls if name == operation]

    def clear(self) -> None:
        self.calls.clear()
        self.received.clear()


@dataclass
class Stack:
    """A web app and a prepare and an inference worker of their own on S3 storage."""

    settings: Any
    rt: Any
    client: Any
    workers: list


@contextmanager
def s3_stack(settings, tmp_path, monkeypatch, storage: str, name: str, **overrides: Any) -> Iterator[Stack]:
    """Web and workers on `storage` (s3://BUCKET/PREFIX) with a broker and database of their own,
    so the session's workers, on the data dir, take none of these jobs; `overrides` go into
    the settings. Stops the workers and the broker on the way out."""
    import dataclasses

    from conftest import start_worker, stop_worker

    from config import INFERENCE_QUEUE, PREPARE_QUEUE
    from config.embedded import EmbeddedRedis
    from models.db import Database
    from tasks.app import celery_for
    from web import create_app

    broker = EmbeddedRedis(tmp_path / "redis")
    private = dataclasses.replace(
        settings,
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'data' / 'whisperq.db'}",
        broker_url=broker.start(),
        result_backend=None,
        storage=storage,
        **overrides,
    )
    env = {
        "CELERY_BROKER_URL": private.broker_url,
        "CELERY_RESULT_BACKEND": "",
        "DATABASE_URL": private.database_url,
        "WHISPERQ_DATA_DIR": str(private.data_dir),
        "WHISPERQ_STORAGE": storage,
    }
    monkeypatch.setenv("CELERY_BROKER_URL", private.broker_url)  # Celery reads it before its configuration
    Database(private.database_url).upgrade()
    celery = celery_for(private)
    workers: list = []
    try:
        for pool_name, queue, pool, threads in (
            ("prepare", PREPARE_QUEUE, "prefork", 1),
            ("infer", INFERENCE_QUEUE, "threads", 2),
        ):
            tag = uuid.uuid4().hex[:6]
            workers.append(
                start_worker(celery, tmp_path, f"{name}-{pool_name}-{tag}", queue, pool, threads, extra_env=env)
            )
        app = create_app({"SETTINGS": private, "TESTING": True})
        yield Stack(private, app.extensions["whisperq"], app.test_client(), workers)
    finally:
        for worker in workers:
            stop_worker(worker)
        broker.stop()
