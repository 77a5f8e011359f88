"""The web worker the Procfile runs (gunicorn's gevent worker, web.server) patches the process
before anything of the app is imported: gunicorn's master imports only web.server, so a client
library that keeps its own reference to `ssl` (botocore, urllib3: S3 storage, SQS) is imported
after gevent's patch, never before it (it recursed on its first TLS context: a 500 on the first
upload to S3). The whole path, S3 through `whisperq run`, is tests/test_conformance.py's."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# What must not be imported before the worker patches: the app, the tasks (whose Celery proxies
# gevent's patch resolves as it scans for locks) and every client library that uses ssl.
NOT_BEFORE_THE_PATCH = ("web.app", "tasks", "models", "flask", "boto3", "botocore", "urllib3", "requests", "redis")


@pytest.mark.timeout(60)
def test_gunicorns_master_imports_nothing_of_the_app_before_the_gevent_worker_patches():
    code = (
        "import json, sys; import web.server; from config.logs import use_json, wants_json; "
        "web.server.JSONErrorGeventWorker; print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50, check=True)
    loaded = json.loads(out.stdout)
    early = sorted({m for m in loaded if m.split(".")[0] in NOT_BEFORE_THE_PATCH or m in NOT_BEFORE_THE_PATCH})
    assert not early, f"imported by gunicorn's master, before the worker's monkey.patch_all(): {early}"
