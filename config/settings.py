"""Settings read from the environment, validated once at start.

Every process (web, worker, CLI) builds one :class:`Settings` from the same variables, so a bad value
stops the process at start with a message that names the variable, instead of failing on the first job.
"""
from __future__ import annotations

import base64
import os
import secrets
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Mapping

from .allow import AllowRule
from .checks import check_model_path, check_values
from .env import ConfigError, Env, input_dirs as _input_dirs, hosts as _hosts
from .files import generated_secret, published_broker
from .priorities import PRIORITIES
from .registry import ModelSpec, Routes, find_model, parse_models, parse_routes

ENGINES = ("faster-whisper", "openai-whisper")
DEVICES = ("auto", "cpu", "cuda")
COMPUTE_TYPES = ("auto", "default", "int8", "int8_float16", "int8_float32", "int16", "float16", "bfloat16", "float32")
# Worker metrics ports: WHISPERQ_METRICS_PORT + 0..METRICS_PORT_SPAN-1 (see tasks.metrics).
METRICS_PORT_SPAN = 100
LOG_FORMATS = ("auto", "json", "text")
STORAGES = ("local", "postgres")


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    broker_url: str | None
    result_backend: str | None
    database_url: str
    storage: str  # where audio lives: local (the data dir) or postgres (large objects in DATABASE_URL)
    host: str
    port: int
    flower_port: int
    flower_address: str
    flower_basic_auth: str | None
    flower_broker_api: str | None
    log_format: str
    engine: str
    model_path: str | None
    # The models served, by name (config.registry), and the one a job gets when it names none.
    models: tuple[ModelSpec, ...]
    default_model: str
    device: str
    compute_type: str
    beam_size: int
    cpu_threads: int
    max_upload_mb: int
    max_batch_items: int
    max_batch_upload_mb: int
    max_audio_seconds: float
    url_audio_estimate_seconds: float
    default_language: str | None
    batch_size: int
    batch_wait_ms: int
    inference_slots: int
    max_attempts: int
    retry_base_seconds: float
    retry_max_seconds: float
    job_ttl_seconds: float
    sweep_interval_seconds: float
    admin_token: str | None
    queue_budget_seconds: float
    queue_budget_jobs: int
    queue_key_share: float
    high_reserve: float
    disk_floor_mb: int
    rate_limit: str | None
    redis_url: str | None
    sync_wait_seconds: float
    webhook_secret: str | None
    webhook_allow: tuple[AllowRule, ...]  # non-public hosts webhooks may go to (config.allow)
    fetch_allow: tuple[AllowRule, ...]  # non-public hosts audio may be fetched from
    webhook_timeout_seconds: float
    webhook_retry_base_seconds: float
    webhook_retry_window_seconds: float
    webhook_max_inline_bytes: int
    fetch_timeout_seconds: float
    public_url: str | None
    metrics_port: int
    metrics_address: str  # where workers serve /metrics (tasks.metrics): loopback unless set
    alert_queue_age_seconds: float
    alert_queue_depth: int
    alert_failure_rate: float
    alert_dead_letters: int
    alert_disk_free_bytes: int
    # Security and tenancy (see models.access.apikeys, models.security.crypto, models.maintenance.retention).
    allow_anonymous: bool
    secret_key: str | None
    metrics_token: str | None
    encryption_keys: str | None
    allow_plaintext_rows: bool  # data from before encryption reads (models.security.crypto): to rotate it
    audio_retention_seconds: float | None
    result_retention_seconds: float | None
    retention_interval_seconds: float
    rate_limit_premium: str | None
    rate_limit_standard: str | None
    rate_limit_batch: str | None
    poll_limit: bool  # a status poll faster than its Retry-After gets 429 (web.pollrate)
    input_grants: tuple[tuple[str | None, Path], ...]  # WHISPERQ_INPUT_DIRS: (key or None for shared, dir)
    anonymous_max_priority: str
    sync_waits: int
    max_audio_seconds_premium: float
    max_audio_seconds_standard: float
    max_audio_seconds_batch: float
    sync_waits_per_client: int
    allowed_hosts: tuple[str, ...] | None
    # Monthly audio quotas per tier, in hours (None: off; see models.access.quotas).
    quota_hours_premium: float | None
    quota_hours_standard: float | None
    quota_hours_batch: float | None
    routes: Routes = Routes()  # aliases (A/B by weight) and shadow decoding (config.registry)
    claim_lease_seconds: float = 60.0  # an inference claim's lease, renewed while it runs (models.jobs.claims)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> "Settings":
        env = Env(os.environ if environ is None else environ)
        data_dir = Path(env.str("WHISPERQ_DATA_DIR", "./var")).expanduser().resolve()
        values = dict(
            data_dir=data_dir,
            # Unset: the broker a stack running on this data dir published (`whisperq run`'s embedded one).
            broker_url=env.url("CELERY_BROKER_URL", None, schemes=BROKER_SCHEMES) or published_broker(data_dir),
            result_backend=env.str("CELERY_RESULT_BACKEND", None),
            database_url=env.url(
                "DATABASE_URL", f"sqlite:///{data_dir / 'whisperq.db'}", schemes=DATABASE_SCHEMES
            ),
            storage=env.choice("WHISPERQ_STORAGE", "local", STORAGES),
            host=env.str("HOST", "127.0.0.1"),
            port=env.int("PORT", 8000, low=1, high=65535),
            flower_port=env.int("FLOWER_PORT", 5555, low=1, high=65535),
            flower_address=env.str("FLOWER_ADDRESS", "127.0.0.1"),
            flower_basic_auth=env.basic_auth("FLOWER_BASIC_AUTH"),
            flower_broker_api=env.url("FLOWER_BROKER_API", None, schemes=("http", "https")),
            log_format=env.choice("WHISPERQ_LOG_FORMAT", "auto", LOG_FORMATS),
            engine=env.choice("WHISPERQ_ENGINE", "faster-whisper", ENGINES),
            model_path=env.str("WHISPERQ_MODEL", None),
            device=env.choice("WHISPERQ_DEVICE", "auto", DEVICES),
            compute_type=env.choice("WHISPERQ_COMPUTE_TYPE", "auto", COMPUTE_TYPES),
            beam_size=env.int("WHISPERQ_BEAM_SIZE", 5, low=1, high=20),
            cpu_threads=env.int("WHISPERQ_CPU_THREADS", 0, low=0, high=1024),
            max_upload_mb=env.int("WHISPERQ_MAX_UPLOAD_MB", 200, low=1, high=10_000),
            max_batch_items=env.int("WHISPERQ_MAX_BATCH_ITEMS", 100, low=1, high=10_000),
            max_batch_upload_mb=env.int("WHISPERQ_MAX_BATCH_UPLOAD_MB", 1024, low=1, high=1_000_000),
            max_audio_seconds=env.float("WHISPERQ_MAX_AUDIO_SECONDS", 4 * 3600.0, low=1.0),
            # What a job by URL counts against the queue budget and its key's quota until its
            # audio is fetched and measured (the fetch checks the real length against both).
            url_audio_estimate_seconds=env.float("WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS", 600.0, low=0.0),
            default_language=env.language("WHISPERQ_DEFAULT_LANGUAGE", None),
            batch_size=env.int("WHISPERQ_BATCH_SIZE", 0, low=0, high=256),  # 0: by device (models.speech.engines)
            batch_wait_ms=env.int("WHISPERQ_BATCH_WAIT_MS", 50, low=0, high=60_000),
            inference_slots=env.int("WHISPERQ_INFERENCE_SLOTS", 8, low=1, high=1024),
            max_attempts=env.int("WHISPERQ_MAX_ATTEMPTS", 3, low=1, high=100),
            retry_base_seconds=env.float("WHISPERQ_RETRY_BASE_SECONDS", 2.0, low=0.0),
            retry_max_seconds=env.float("WHISPERQ_RETRY_MAX_SECONDS", 300.0, low=0.0),
            job_ttl_seconds=env.float("WHISPERQ_JOB_TTL", 24 * 3600.0, low=1.0),
            sweep_interval_seconds=env.float("WHISPERQ_SWEEP_INTERVAL", 30.0, low=1.0),
            claim_lease_seconds=env.float("WHISPERQ_CLAIM_LEASE_SECONDS", 60.0, low=3.0),
            admin_token=env.str("WHISPERQ_ADMIN_TOKEN", None),
            queue_budget_seconds=env.float("WHISPERQ_QUEUE_BUDGET_SECONDS", 8 * 3600.0, low=1.0),
            queue_budget_jobs=env.int("WHISPERQ_QUEUE_BUDGET_JOBS", 10_000, low=1, high=10**9),
            queue_key_share=min(1.0, env.float("WHISPERQ_QUEUE_KEY_SHARE", 0.5, low=0.01)),
            high_reserve=env.float("WHISPERQ_HIGH_RESERVE", 0.2, low=0.0),
            disk_floor_mb=env.int("WHISPERQ_DISK_FLOOR_MB", 1024, low=0, high=10**9),
            rate_limit=env.rate("WHISPERQ_RATE_LIMIT", "off"),
            redis_url=env.url("WHISPERQ_REDIS_URL", None, schemes=("redis", "rediss", "unix")),
            sync_wait_seconds=env.float("WHISPERQ_SYNC_WAIT_SECONDS", 60.0, low=0.0),
            webhook_secret=env.webhook_secret("WHISPERQ_WEBHOOK_SECRET"),
            webhook_allow=env.allow("WHISPERQ_WEBHOOK_ALLOW"),
            fetch_allow=env.allow("WHISPERQ_FETCH_ALLOW"),
            webhook_timeout_seconds=env.float("WHISPERQ_WEBHOOK_TIMEOUT", 10.0, low=0.1),
            webhook_retry_base_seconds=env.float("WHISPERQ_WEBHOOK_RETRY_BASE_SECONDS", 5.0, low=0.0),
            webhook_retry_window_seconds=env.float("WHISPERQ_WEBHOOK_RETRY_WINDOW", 24 * 3600.0, low=0.0),
            webhook_max_inline_bytes=env.int("WHISPERQ_WEBHOOK_MAX_INLINE_BYTES", 262144, low=0, high=64 * 1024 * 1024),
            fetch_timeout_seconds=env.float("WHISPERQ_FETCH_TIMEOUT", 120.0, low=1.0),
            public_url=env.url("WHISPERQ_PUBLIC_URL", None, schemes=("http", "https")),
            metrics_port=env.int("WHISPERQ_METRICS_PORT", 0, low=0, high=65535 - METRICS_PORT_SPAN),
            metrics_address=env.str("WHISPERQ_METRICS_ADDRESS", "127.0.0.1").strip(),
            alert_queue_age_seconds=env.float("WHISPERQ_ALERT_QUEUE_AGE_SECONDS", 600.0, low=0.0),
            alert_queue_depth=env.int("WHISPERQ_ALERT_QUEUE_DEPTH", 1000, low=0, high=10**9),
            alert_failure_rate=env.float("WHISPERQ_ALERT_FAILURE_RATE", 0.05, low=0.0),
            alert_dead_letters=env.int("WHISPERQ_ALERT_DEAD_LETTERS", 1, low=0, high=10**9),
            alert_disk_free_bytes=env.int("WHISPERQ_ALERT_DISK_FREE_BYTES", 5 * 1024**3, low=0, high=2**62),
            allow_anonymous=env.bool("WHISPERQ_ALLOW_ANONYMOUS", False),
            secret_key=env.str("WHISPERQ_SECRET_KEY", None),
            metrics_token=env.str("WHISPERQ_METRICS_TOKEN", None),
            encryption_keys=env.encryption_keys("WHISPERQ_ENCRYPTION_KEYS"),
            allow_plaintext_rows=env.bool("WHISPERQ_ALLOW_PLAINTEXT_ROWS", False),
            audio_retention_seconds=env.duration("WHISPERQ_AUDIO_RETENTION", 3600.0),
            result_retention_seconds=env.duration("WHISPERQ_RESULT_RETENTION", 7 * 24 * 3600.0),
            retention_interval_seconds=env.float("WHISPERQ_RETENTION_INTERVAL", 300.0, low=1.0),
            rate_limit_premium=env.rate("WHISPERQ_RATE_LIMIT_PREMIUM", "600/minute"),
            rate_limit_standard=env.rate("WHISPERQ_RATE_LIMIT_STANDARD", "120/minute"),
            rate_limit_batch=env.rate("WHISPERQ_RATE_LIMIT_BATCH", "60/minute"),
            poll_limit=env.bool("WHISPERQ_POLL_LIMIT", True),
            input_grants=_input_dirs(env.str("WHISPERQ_INPUT_DIRS", None), data_dir),
            max_audio_seconds_premium=env.float("WHISPERQ_MAX_AUDIO_SECONDS_PREMIUM", 4 * 3600.0, low=1.0),
            max_audio_seconds_standard=env.float("WHISPERQ_MAX_AUDIO_SECONDS_STANDARD", 4 * 3600.0, low=1.0),
            max_audio_seconds_batch=env.float("WHISPERQ_MAX_AUDIO_SECONDS_BATCH", 4 * 3600.0, low=1.0),
            sync_waits=env.int("WHISPERQ_SYNC_WAITS", 2, low=0, high=10_000),
            sync_waits_per_client=env.int("WHISPERQ_SYNC_WAITS_PER_CLIENT", 1, low=0, high=10_000),
            anonymous_max_priority=env.choice("WHISPERQ_ANONYMOUS_MAX_PRIORITY", "normal", PRIORITIES),
            allowed_hosts=_hosts(env.str("WHISPERQ_ALLOWED_HOSTS", None)),
            quota_hours_premium=env.hours("WHISPERQ_QUOTA_HOURS_PREMIUM"),
            quota_hours_standard=env.hours("WHISPERQ_QUOTA_HOURS_STANDARD"),
            quota_hours_batch=env.hours("WHISPERQ_QUOTA_HOURS_BATCH"),
        )
        check_values(values)
        values["models"] = parse_models(
            env.str("WHISPERQ_MODELS", None), engine=values["engine"], compute_type=values["compute_type"],
            beam_size=values["beam_size"], model_path=values["model_path"], engines=ENGINES, compute_types=COMPUTE_TYPES)
        values["routes"], values["default_model"] = parse_routes(
            env.str("WHISPERQ_ALIASES", None), env.str("WHISPERQ_SHADOW", None), env.str("WHISPERQ_DEFAULT_MODEL", None),
            values["models"])
        values.update(overrides)
        settings = cls(**values)
        check_model_path(settings)
        return settings

    def model(self, name: str | None = None) -> ModelSpec:
        """A served model by name (None or OpenAI's whisper-1: the default); UnknownModel otherwise."""
        return find_model(self.models, self.default_model, name)

    def choose(self, requested: str | None, job_id: str) -> tuple[str, str | None, str | None]:
        """A job's model, alias and shadow candidate (Routes.choose): fixed by its id."""
        return self.routes.choose(self.models, self.default_model, requested, job_id)

    def served_hosts(self) -> tuple[str, ...] | None:
        """The Host names requests may name (None: any). By default, loopback names when the
        service listens on loopback, plus WHISPERQ_PUBLIC_URL's host: a page on another site
        whose name a DNS rebinding points at 127.0.0.1 then reaches nothing. Listening beyond
        loopback with no WHISPERQ_ALLOWED_HOSTS or WHISPERQ_PUBLIC_URL, any name is served."""
        from urllib.parse import urlsplit

        if self.allowed_hosts is not None:
            return None if "*" in self.allowed_hosts else self.allowed_hosts
        public = (urlsplit(self.public_url).hostname or "",) if self.public_url else ()
        if self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127."):
            return ("localhost", "127.0.0.1", "::1", self.host.lower()) + public
        if public:
            return ("localhost", "127.0.0.1", "::1") + public + ((self.host.lower(),) if self.host not in ("0.0.0.0", "::") else ())
        return None

    @property
    def max_upload_bytes(self) -> int:
        return self.max_upload_mb * 1024 * 1024

    @property
    def max_batch_upload_bytes(self) -> int:
        return self.max_batch_upload_mb * 1024 * 1024

    @property
    def unfetched_audio_seconds(self) -> float:
        """What a job by URL counts as, until its audio is fetched (WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS,
        at most WHISPERQ_MAX_AUDIO_SECONDS)."""
        return min(self.url_audio_estimate_seconds, self.max_audio_seconds)

    def audio_limit(self, tier: str | None) -> float:
        """The longest audio a job may have: WHISPERQ_MAX_AUDIO_SECONDS, or less for its key's
        tier (WHISPERQ_MAX_AUDIO_SECONDS_<TIER>)."""
        return min(self.max_audio_seconds, getattr(self, f"max_audio_seconds_{tier}", None) or self.max_audio_seconds)

    def prepare_time_limit(self, audio_seconds: float | None) -> float:
        """Hard limit for decoding and splitting: far faster than real time on any CPU."""
        return 120.0 + 0.25 * (audio_seconds if audio_seconds is not None else self.max_audio_seconds)

    def time_limit(self, audio_seconds: float | None) -> float:
        """Hard limit for one job, growing with its audio: the wait in the batcher behind
        other jobs plus its own inference, with room for a slow CPU."""
        return 300.0 + 2.0 * (audio_seconds if audio_seconds is not None else self.max_audio_seconds)

    def base_url(self) -> str:
        """Where clients reach the API, for links sent outside a request (webhooks)."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    def celery_broker_url(self) -> str:
        if not self.broker_url:
            raise ConfigError(
                f"CELERY_BROKER_URL is not set and no service runs on the data dir {self.data_dir}: start the service "
                "with `make run` (which starts an embedded Redis that local callers find by themselves), point "
                "WHISPERQ_DATA_DIR at the running service's data dir, or set CELERY_BROKER_URL to "
                "redis://HOST:6379/0 or amqp://USER:PASS@HOST:5672//"
            )
        return self.broker_url

    def celery_result_backend(self) -> str:
        if self.result_backend:
            return self.result_backend
        broker = self.celery_broker_url()
        if broker.startswith(("redis", "rediss")):
            return broker
        # RabbitMQ: keep results in the database. The rpc:// backend sends a result to the
        # publisher's reply queue, which a retry or a requeue from another process loses.
        return "db+" + self.database_url

    def webhook_signing_secret(self) -> str:
        """WHISPERQ_WEBHOOK_SECRET, or else one generated once into the data dir, so that
        every process sharing the data dir signs with the same key."""
        if self.webhook_secret:
            return self.webhook_secret
        return generated_secret(self.data_dir / "webhook-secret",
                                lambda: "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode())

    def session_secret(self) -> str:
        """WHISPERQ_SECRET_KEY (signs the web page's session cookie), or one generated once
        into the data dir."""
        return self.secret_key or generated_secret(self.data_dir / "session-secret", lambda: secrets.token_urlsafe(32))

    def describe(self) -> dict[str, str]:
        """Settings as strings with passwords masked, for logs and `whisperq config`."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("admin_token", "webhook_secret", "secret_key", "metrics_token", "encryption_keys") and value:
                value = "***"
            elif f.name == "flower_basic_auth" and value:
                value = ",".join(pair.split(":", 1)[0] + ":***" for pair in value.split(","))
            elif isinstance(value, tuple):
                value = ",".join(str(v) for v in value)
            out[f.name] = _mask(str(value)) if value is not None else ""
        return out


BROKER_SCHEMES = ("redis", "rediss", "redis+socket", "amqp", "amqps", "pyamqp", "memory")
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg", "postgresql+psycopg2", "postgres")


def _mask(text: str) -> str:
    if "://" in text and "@" in text:
        scheme, rest = text.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        if ":" in creds:
            creds = creds.split(":", 1)[0] + ":***"
        return f"{scheme}://{creds}@{host}"
    return text
