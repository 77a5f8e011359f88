"""The one retry policy (models.retry): what is retried, how long the waits are, when it
gives up. The tasks, the sweeper, preparation and the webhooks all ask it."""

import random
from datetime import UTC, datetime, timedelta

import pytest

from config import Settings
from models.errors import (
    AttemptsExhausted,
    JobCancelled,
    JobExpired,
    JobTimeLimitExceeded,
    PermanentJobError,
    TransientJobError,
)
from models.retry import RetryPolicy, Verdict, classify, classify_status


@pytest.mark.parametrize(
    "exc, verdict",
    [
        (PermanentJobError("missing file"), Verdict.PERMANENT),
        (JobExpired("expired"), Verdict.PERMANENT),
        (JobCancelled("cancelled"), Verdict.PERMANENT),
        (AttemptsExhausted("lost three times"), Verdict.EXHAUSTED),
        (TransientJobError("storage hiccup"), Verdict.TRANSIENT),
        (JobTimeLimitExceeded("time limit"), Verdict.TRANSIENT),
        (MemoryError(), Verdict.TRANSIENT),  # what the service cannot tell apart is tried again
        (ConnectionResetError(), Verdict.TRANSIENT),
    ],
)
def test_failures_are_classified(exc, verdict):
    assert classify(exc) is verdict


@pytest.mark.parametrize(
    "status, verdict",
    [
        (429, Verdict.TRANSIENT),
        (500, Verdict.TRANSIENT),
        (503, Verdict.TRANSIENT),
        (400, Verdict.PERMANENT),
        (401, Verdict.PERMANENT),
        (404, Verdict.PERMANENT),
        (410, Verdict.PERMANENT),
    ],
)
def test_http_answers_are_classified(status, verdict):
    assert classify_status(status) is verdict


def _settings(tmp_path, monkeypatch, **env) -> Settings:
    monkeypatch.setenv("WHISPERQ_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings.from_env()


def test_jobs_get_their_attempts_with_full_jitter_up_to_the_cap(tmp_path, monkeypatch):
    policy = RetryPolicy.for_jobs(
        _settings(
            tmp_path,
            monkeypatch,
            WHISPERQ_MAX_ATTEMPTS="4",
            WHISPERQ_RETRY_BASE_SECONDS="2",
            WHISPERQ_RETRY_MAX_SECONDS="10",
        )
    )
    rng = random.Random(7)
    for attempts, ceiling in [(1, 2), (2, 4), (3, 8)]:
        waits = [policy.backoff(attempts, rng) for _ in range(2000)]
        assert all(0 <= w <= ceiling for w in waits)
        assert min(waits) < 0.1 * ceiling and max(waits) > 0.9 * ceiling  # the whole range, not a fixed step
    assert max(policy.backoff(30, rng) for _ in range(500)) <= 10  # capped
    assert [policy.next_delay(n) is None for n in range(1, 6)] == [False, False, False, True, True]


def test_webhooks_retry_for_a_time_not_a_count(tmp_path, monkeypatch):
    policy = RetryPolicy.for_webhooks(_settings(tmp_path, monkeypatch, WHISPERQ_WEBHOOK_RETRY_WINDOW="600"))
    first = datetime(2026, 1, 1, tzinfo=UTC)
    assert policy.next_delay(500, first, first + timedelta(seconds=599)) is not None
    assert policy.next_delay(1, first, first + timedelta(seconds=601)) is None
    assert max(policy.backoff(60) for _ in range(300)) <= 3600


def test_the_runtime_hands_out_the_jobs_policy(tmp_path, monkeypatch):
    from models.runtime import Runtime

    rt = Runtime(_settings(tmp_path, monkeypatch, WHISPERQ_MAX_ATTEMPTS="5"))
    assert rt.job_retries == RetryPolicy.for_jobs(rt.settings) and rt.job_retries.max_attempts == 5
    assert rt.job_retries.exhausted(5) and not rt.job_retries.exhausted(4)
