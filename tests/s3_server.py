"""An S3 server on loopback for the S3 storage tests (test_s3, test_storage's s3 backend):
moto's, in this process (ThreadedMotoServer on 127.0.0.1 and a port of its own), reached the
way a deployment reaches S3, through AWS's own variables (AWS_ENDPOINT_URL and the rest), so
the service's code runs as it would against S3. conftest.py loads its fixtures: s3_server
(one per session), s3_env (the variables, set for one test), s3_bucket (a new bucket).

Without boto3 or moto (`make install` installs both, in the test extra) the tests that need
them are skipped, or fail when REQUIRE_SERVICES=1.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from helpers import need_service

REGION = "eu-west-1"


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str]  # what a process needs to reach it: AWS_ENDPOINT_URL, the region, credentials

    def client(self) -> Any:
        """A client of the test's own, to look into the bucket past the service's code."""
        import boto3

        return boto3.session.Session(
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name=REGION,
        ).client("s3", endpoint_url=self.endpoint)


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
