"""Settings read from the environment, validated once at start.

Every process (web, worker, CLI) builds one :class:`Settings` from the same variables, so a bad value
stops the process at start with a message that names the variable, instead of failing on the first job.
Each field is declared once (config.declare.setting): its variable, how it is read, its default and
bounds, and the sentence the configuration reference (`python -m config.reference`) shows for it.
"""

from __future__ import annotations

import base64
import importlib.util
import ipaddress
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .allow import AllowRule
from .checks import check_model_path, check_values, share
from .declare import Values, Var, declared, read_all, setting
from .env import LEGACY_ALLOW, ConfigError, Env
from .env import hosts as _hosts
from .env import input_dirs as _input_dirs
from .files import generated_secret, published_broker
from .priorities import PRIORITIES
from .registry import ModelSpec, Routes, find_model, parse_models, parse_routes
from .s3_sources import SOURCE_FORM as S3_SOURCE_FORM
from .s3_sources import anonymous_sources as _anonymous_s3_sources
from .secrets import check_basic_auth, check_encryption_keys, check_secret, check_url

ENGINES = ("faster-whisper", "openai-whisper")
DEVICES = ("auto", "cpu", "cuda")
COMPUTE_TYPES = ("auto", "default", "int8", "int8_float16", "int8_float32", "int16", "float16", "bfloat16", "float32")
# Worker metrics ports: WHISPERQ_METRICS_PORT + 0..METRICS_PORT_SPAN-1 (see tasks.metrics).
METRICS_PORT_SPAN = 100
LOG_FORMATS = ("auto", "json", "text")
STORAGES = ("local", "postgres")  # and s3://BUCKET/PREFIX (s3_location)
S3_FORM = "s3://BUCKET/PREFIX"
S3_INSTALL = "pip install 'whisperq[s3]' (in a checkout: .venv/bin/pip install -e '.[s3]')"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX_PART = re.compile(r"[A-Za-z0-9!_.*'()-]+")  # S3's characters safe in a key
BROKER_SCHEMES = ("redis", "rediss", "redis+socket", "amqp", "amqps", "pyamqp", "sqs", "memory")
SQS_INSTALL = "pip install 'whisperq[sqs]' (in a checkout: .venv/bin/pip install -e '.[sqs]')"
_SQS_PREFIX = re.compile(r"[A-Za-z0-9_-]{0,40}")
DATABASE_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg", "postgresql+psycopg2", "postgres")
HOURS_4 = 4 * 3600.0
DAY = 24 * 3600.0


def _models(value: str | None, values: Values) -> tuple[ModelSpec, ...]:
    return parse_models(
        value,
        engine=values["engine"],
        compute_type=values["compute_type"],
        beam_size=values["beam_size"],
        model_path=values["model_path"],
        engines=ENGINES,
        compute_types=COMPUTE_TYPES,
    )


def _routes(env: Env, values: Values) -> tuple[Routes, str]:
    """WHISPERQ_ALIASES and WHISPERQ_SHADOW (the routes), with WHISPERQ_DEFAULT_MODEL, which may name an alias."""
    return parse_routes(
        env.str("WHISPERQ_ALIASES", None),
        env.str("WHISPERQ_SHADOW", None),
        env.str("WHISPERQ_DEFAULT_MODEL", None),
        values["models"],
    )


def s3_location(url: str) -> tuple[str, str]:
    """(bucket, prefix) of WHISPERQ_STORAGE=s3://BUCKET/PREFIX, the prefix without slashes at
    its ends ("" for none); ValueError saying what is wrong and what to write instead."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "s3":
        raise ValueError(f"is not an {S3_FORM} URL")
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket or ":" in bucket:
        raise ValueError(
            "carries credentials or a port; name only the bucket and give the credentials and an endpoint "
            "the AWS way (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile or a role; AWS_ENDPOINT_URL)"
        )
    if not bucket:
        raise ValueError("names no bucket")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket or _is_address(bucket):
        raise ValueError(
            f"names {bucket!r}, which is not an S3 bucket name (3 to 63 lowercase letters, digits, dots and "
            "hyphens, starting and ending with a letter or digit)"
        )
    prefix = prefix.strip("/")
    parts = prefix.split("/") if prefix else []
    if any(part in ("", ".", "..") or not _PREFIX_PART.fullmatch(part) for part in parts):
        raise ValueError(
            f"has the prefix {prefix!r}; a prefix is folder names of letters, digits and !_.*'()- "
            "separated by single slashes (whisperq/audio), without . or .. parts"
        )
    return bucket, prefix


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _storage(env: Env, _values: Values) -> str:
    """WHISPERQ_STORAGE: local, postgres, or s3://BUCKET/PREFIX (written back without a
    trailing slash), which needs boto3."""
    name = "WHISPERQ_STORAGE"
    value = env.raw(name)
    if value is None:
        return "local"
    if value.lower() in STORAGES:
        return value.lower()
    if not value.lower().startswith("s3://"):
        raise ConfigError(f"{name}={value!r} is not one of: {', '.join(STORAGES)}, {S3_FORM}; set it to one of them")
    try:
        bucket, prefix = s3_location(value)
    except ValueError as exc:
        shown = value if "@" not in value else "s3://…@…"
        raise ConfigError(f"{name}={shown!r} {exc}; set it to {S3_FORM} (or s3://BUCKET for none)") from None
    if importlib.util.find_spec("boto3") is None:
        raise ConfigError(f"{name}={value!r} keeps audio in S3 through boto3, which is not installed: {S3_INSTALL}")
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


def _check_broker(name: str, value: str | None) -> None:
    """CELERY_BROKER_URL: the placeholder check of every URL; an sqs:// URL names nothing but
    the scheme (AWS's own variables give the rest) and needs boto3 and pycurl."""
    check_url(name, value)
    if not value or value.split("://", 1)[0].lower() != "sqs":
        return
    if value.split("://", 1)[1].strip("/"):
        raise ConfigError(
            f"{name}=sqs://… names a host or credentials; write sqs:// alone and give the credentials, region "
            "and endpoint the AWS way (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile or a role; "
            "AWS_DEFAULT_REGION; AWS_ENDPOINT_URL_SQS or AWS_ENDPOINT_URL for a server other than AWS's)"
        )
    missing = [m for m in ("boto3", "pycurl") if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"{name}=sqs:// needs {' and '.join(missing)} (kombu's SQS transport), which "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {SQS_INSTALL}"
        )


def _sqs_prefix(value: str, _values: Values) -> str:
    if not _SQS_PREFIX.fullmatch(value):
        raise ConfigError(
            f"WHISPERQ_SQS_QUEUE_PREFIX={value!r} is not a queue name prefix; use at most 40 letters, digits, "
            "hyphens and underscores (prod-)"
        )
    return value


def _account(value: str, _values: Values) -> str | None:
    value = value.strip()
    if value and not (len(value) == 12 and value.isdigit()):
        raise ConfigError(
            f"WHISPERQ_S3_EXPECTED_OWNER={value!r} is not an AWS account id: set it to the 12 digits of the "
            "account that owns the buckets (`aws sts get-caller-identity`), or leave it unset"
        )
    return value or None


def _tier_audio(tier: str) -> Any:
    return setting(
        f"WHISPERQ_MAX_AUDIO_SECONDS_{tier.upper()}",
        "float",
        group="Limits & queue",
        default=HOURS_4,
        low=1.0,
        doc=f"The longest audio, in seconds, a key of the {tier} tier may upload or have fetched by URL "
        "(at most WHISPERQ_MAX_AUDIO_SECONDS).",
    )


def _tier_rate(tier: str, default: str) -> Any:
    return setting(
        f"WHISPERQ_RATE_LIMIT_{tier.upper()}",
        "rate",
        group="Quotas & rates",
        default=default,
        doc=f"Submissions per API key of the {tier} tier per window, such as {default}; off for no limit.",
    )


def _tier_quota(tier: str) -> Any:
    return setting(
        f"WHISPERQ_QUOTA_HOURS_{tier.upper()}",
        "hours",
        group="Quotas & rates",
        shown_default="off",
        doc=f"Hours of audio each key of the {tier} tier may have transcribed per calendar month (UTC); "
        "past it, submissions get 429 quota_exceeded until the first of next month.",
    )


_ALLOW_FORM = (
    "networks, addresses or host names, each with an optional :PORT, comma separated (10.1.2.3:8443,[fd00::/8]:443)"
)


@dataclass(frozen=True)
class Settings:
    # --- storage & data
    data_dir: Path = setting(  # noqa: RUF009 (a Field, as field() gives)
        "WHISPERQ_DATA_DIR",
        group="Storage & data",
        default="./var",
        then=lambda value, _: Path(value).expanduser().resolve(),
        type_name="directory",
        form="a directory (made 0700 where the service creates it)",
        doc="Where uploaded audio (with local storage), upload spools, the SQLite database, the embedded broker and "
        "Flower's state live; every process of one deployment must name the same directory.",
    )
    # Unset: the broker a stack running on this data dir published (`whisperq run`'s embedded one).
    broker_url: str | None = setting(
        "CELERY_BROKER_URL",
        "url",
        group="Broker & database",
        schemes=BROKER_SCHEMES,
        check=_check_broker,
        then=lambda value, values: value or published_broker(values["data_dir"]),
        shown_default="unset: the embedded Redis `whisperq run` starts on WHISPERQ_DATA_DIR",
        doc="The Celery broker every process shares, such as redis://HOST:6379/0 or amqp://USER:PASS@HOST:5672//, "
        "or sqs:// for Amazon SQS (the sqs extra; AWS's own variables give region, credentials and endpoint).",
    )
    result_backend: str | None = setting(
        "CELERY_RESULT_BACKEND",
        group="Broker & database",
        check=check_url,
        shown_default="the broker for Redis, db+DATABASE_URL for RabbitMQ and SQS",
        form="a Celery result backend URL",
        doc="Where transcribe.delay().get() finds results; unset it to use the default.",
    )
    database_url: str = setting(
        "DATABASE_URL",
        "url",
        group="Broker & database",
        schemes=DATABASE_SCHEMES,
        check=check_url,
        default=lambda values: f"sqlite:///{values['data_dir'] / 'whisperq.db'}",
        shown_default="sqlite:///$WHISPERQ_DATA_DIR/whisperq.db",
        doc="The database of jobs, keys and transcripts: SQLite in the data dir, or "
        "postgresql+psycopg://USER@HOST:5432/DB for several hosts.",
    )
    # where audio lives: local (the data dir), postgres (large objects in DATABASE_URL) or
    # s3://BUCKET/PREFIX (objects in S3 or a store that speaks its API: models.storage.s3)
    storage: str = setting(
        "WHISPERQ_STORAGE",
        "choice",
        group="Storage & data",
        default="local",
        choices=STORAGES,
        parse=_storage,
        form=f"{', '.join(STORAGES)}, or {S3_FORM}",
        doc="Where audio and prepared samples live: local (the data dir, a shared mount for several hosts), "
        "postgres (large objects in DATABASE_URL's PostgreSQL) or s3://BUCKET/PREFIX (objects in S3 or an "
        "S3-compatible store, sealed like the others; needs the s3 extra, `pip install 'whisperq[s3]'`, and "
        "takes its endpoint, region and credentials from AWS's own variables below).",
        also=(
            Var(
                "AWS_ENDPOINT_URL",
                "Storage & data",
                "URL",
                "unset: AWS's S3",
                "an http:// or https:// URL",
                "With s3:// storage: an S3-compatible store's endpoint (MinIO, Ceph, a cloud's S3 API), read by "
                "boto3; leave it unset on AWS.",
            ),
            Var(
                "AWS_DEFAULT_REGION",
                "Storage & data",
                "text",
                "unset: the profile's, or us-east-1",
                "a region name (eu-central-1)",
                "With s3:// storage: the bucket's region, read by boto3.",
            ),
            Var(
                "AWS_ACCESS_KEY_ID",
                "Storage & data",
                "text",
                "unset: boto3's credentials chain (AWS_PROFILE, an instance or pod role)",
                "an access key id, with AWS_SECRET_ACCESS_KEY",
                "With s3:// storage: the credentials, read by boto3 like the rest of its chain; they need "
                "s3:GetObject, s3:PutObject, s3:DeleteObject and s3:ListBucket on the bucket and prefix.",
            ),
        ),
    )
    # --- web
    host: str = setting(
        "HOST", group="Web", default="127.0.0.1", form="an address", doc="The address the web process listens on."
    )
    port: int = setting(
        "PORT", "int", group="Web", default=8000, low=1, high=65535, doc="The port the web process listens on."
    )
    flower_port: int = setting(
        "FLOWER_PORT", "int", group="Web", default=5555, low=1, high=65535, doc="Flower's port (`whisperq flower`)."
    )
    flower_address: str = setting(
        "FLOWER_ADDRESS",
        group="Web",
        default="127.0.0.1",
        form="an address",
        doc="The address Flower listens on; an address other machines reach needs FLOWER_BASIC_AUTH.",
    )
    flower_max_tasks: int = setting(
        "FLOWER_MAX_TASKS",
        "int",
        group="Web",
        default=10_000,
        low=100,
        high=1_000_000,
        doc="The most finished tasks Flower keeps in memory (about 4 KiB each; Flower's own default, "
        "100,000, grows it by about 400 MiB on a busy day).",
    )
    flower_basic_auth: str | None = setting(
        "FLOWER_BASIC_AUTH",
        "basic_auth",
        group="Web",
        secret=True,
        check=check_basic_auth,
        shown_default="unset (`whisperq run` generates admin:<random>)",
        doc="Flower's logins; each password at least 16 characters; masked in `whisperq config`.",
    )
    flower_broker_api: str | None = setting(
        "FLOWER_BROKER_API",
        "url",
        group="Web",
        schemes=("http", "https"),
        check=check_url,
        shown_default="derived from CELERY_BROKER_URL on RabbitMQ",
        doc="RabbitMQ's management API for Flower's broker tab.",
    )
    log_format: str = setting(
        "WHISPERQ_LOG_FORMAT",
        "choice",
        group="Logs & tracing",
        default="auto",
        choices=LOG_FORMATS,
        doc="How processes log: json, text, or auto (JSON unless stderr is a terminal).",
    )
    # --- models & engine
    engine: str = setting(
        "WHISPERQ_ENGINE",
        "choice",
        group="Models & engine",
        default="faster-whisper",
        choices=ENGINES,
        doc="The engine of models that name none: faster-whisper, or openai-whisper (needs the [openai-whisper] "
        "extra and PyTorch).",
    )
    model_path: str | None = setting(
        "WHISPERQ_MODEL",
        group="Models & engine",
        type_name="path",
        shown_default="the bundled tiny.en",
        form="a CTranslate2 model directory, or (openai-whisper) a .pt checkpoint",
        doc="The one model served when WHISPERQ_MODELS is unset; point it at a CTranslate2 Whisper model directory "
        "(with model.bin) or, with WHISPERQ_ENGINE=openai-whisper, an openai-whisper checkpoint.",
    )
    # The models served, by name (config.registry), and the one a job gets when it names none.
    models: tuple[ModelSpec, ...] = setting(
        "WHISPERQ_MODELS",
        group="Models & engine",
        late=True,
        then=_models,
        type_name="model list",
        shown_default="one model: tiny.en (or WHISPERQ_MODEL)",
        form="NAME=WEIGHTS[;engine=…][;compute=…][;beam=…], comma separated; WEIGHTS bundled:tiny.en, bundled:base "
        "or an absolute path",
        doc="The models served, by name; each model other than the default has its own inference queue "
        "(whisperq.inference.NAME).",
    )
    default_model: str = setting(
        "WHISPERQ_DEFAULT_MODEL",
        group="Models & engine",
        late=True,
        parse=lambda env, values: _routes(env, values)[1],
        type_name="model or alias name",
        shown_default="the first of WHISPERQ_MODELS",
        form="a name of WHISPERQ_MODELS or WHISPERQ_ALIASES",
        doc="The model (or alias) a job gets when it names none; its queue is whisperq.inference.",
    )
    device: str = setting(
        "WHISPERQ_DEVICE",
        "choice",
        group="Models & engine",
        default="auto",
        choices=DEVICES,
        doc="Where inference runs: auto (CUDA when there is one), cpu or cuda.",
    )
    compute_type: str = setting(
        "WHISPERQ_COMPUTE_TYPE",
        "choice",
        group="Models & engine",
        default="auto",
        choices=COMPUTE_TYPES,
        doc="The weights' number type: auto is float16 on CUDA and int8 on a CPU.",
    )
    beam_size: int = setting(
        "WHISPERQ_BEAM_SIZE",
        "int",
        group="Models & engine",
        default=5,
        low=1,
        high=20,
        doc="Beam search width of models that name none.",
    )
    cpu_threads: int = setting(
        "WHISPERQ_CPU_THREADS",
        "int",
        group="Models & engine",
        default=0,
        low=0,
        high=1024,
        shown_default="0 (faster-whisper: 1 per batch; openai-whisper: every usable core)",
        doc="CPU threads per running batch; the usable cores divided by it is how many batches run at once.",
    )
    # --- limits & queue
    max_upload_mb: int = setting(
        "WHISPERQ_MAX_UPLOAD_MB",
        "int",
        group="Limits & queue",
        default=200,
        low=1,
        high=10_000,
        doc="The largest upload, in MB; larger ones get 413.",
    )
    max_batch_items: int = setting(
        "WHISPERQ_MAX_BATCH_ITEMS",
        "int",
        group="Limits & queue",
        default=100,
        low=1,
        high=10_000,
        doc="The most audio URLs or files in one POST /v1/batches; more get 400.",
    )
    max_batch_upload_mb: int = setting(
        "WHISPERQ_MAX_BATCH_UPLOAD_MB",
        "int",
        group="Limits & queue",
        default=1024,
        low=1,
        high=1_000_000,
        doc="The largest multipart POST /v1/batches, all its files together, in MB (each file also at most "
        "WHISPERQ_MAX_UPLOAD_MB); larger ones get 413.",
    )
    max_audio_seconds: float = setting(
        "WHISPERQ_MAX_AUDIO_SECONDS",
        "float",
        group="Limits & queue",
        default=HOURS_4,
        low=1.0,
        doc="The longest audio, in seconds: longer gets 413 at the door or fails while decoded; also sets Redis's "
        "visibility_timeout.",
    )
    # What a job by URL counts against the queue budget and its key's quota until its
    # audio is fetched and measured (the fetch checks the real length against both).
    url_audio_estimate_seconds: float = setting(
        "WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS",
        "float",
        group="Limits & queue",
        default=600.0,
        low=0.0,
        doc="Seconds of audio a job by URL counts as against the queue budget, its key's share and quota until its "
        "audio is fetched and measured (at most WHISPERQ_MAX_AUDIO_SECONDS).",
    )
    default_language: str | None = setting(
        "WHISPERQ_DEFAULT_LANGUAGE",
        "language",
        group="Models & engine",
        shown_default="unset (detect)",
        doc="The language of requests that name none; unset, it is detected.",
    )
    # --- batching & workers
    batch_size: int = setting(
        "WHISPERQ_BATCH_SIZE",
        "int",
        group="Batching & workers",
        default=0,
        low=0,
        high=256,
        shown_default="0 (by device: 2 on a CPU, 16 on a GPU)",  # models.speech.engines
        doc="The most audio windows in one inference call.",
    )
    batch_wait_ms: int = setting(
        "WHISPERQ_BATCH_WAIT_MS",
        "int",
        group="Batching & workers",
        default=50,
        low=0,
        high=60_000,
        doc="The longest a window waits, in milliseconds, for its batch to fill.",
    )
    inference_slots: int = setting(
        "WHISPERQ_INFERENCE_SLOTS",
        "int",
        group="Batching & workers",
        default=8,
        low=1,
        high=1024,
        doc="Jobs an inference process holds at once (its threads and prefetch): about (parallel batches + 1) × "
        "batch size.",
    )
    # --- retries & sweeps
    max_attempts: int = setting(
        "WHISPERQ_MAX_ATTEMPTS",
        "int",
        group="Retries & sweeps",
        default=3,
        low=1,
        high=100,
        doc="Attempts before a job goes to the dead-letter queue.",
    )
    retry_base_seconds: float = setting(
        "WHISPERQ_RETRY_BASE_SECONDS",
        "float",
        group="Retries & sweeps",
        default=2.0,
        low=0.0,
        doc="Retry backoff base, in seconds (full jitter, doubling).",
    )
    retry_max_seconds: float = setting(
        "WHISPERQ_RETRY_MAX_SECONDS",
        "float",
        group="Retries & sweeps",
        default=300.0,
        low=0.0,
        doc="Retry backoff cap, in seconds.",
    )
    job_ttl_seconds: float = setting(
        "WHISPERQ_JOB_TTL",
        "float",
        group="Retries & sweeps",
        default=DAY,
        low=1.0,
        doc="Seconds a job may wait for its first start before it is EXPIRED.",
    )
    sweep_interval_seconds: float = setting(
        "WHISPERQ_SWEEP_INTERVAL",
        "float",
        group="Retries & sweeps",
        default=30.0,
        low=1.0,
        doc="Seconds between sweeper passes (the beat process).",
    )
    sweep_grace_seconds: float = setting(
        "WHISPERQ_SWEEP_GRACE",
        "float",
        group="Retries & sweeps",
        default=60.0,
        low=1.0,
        high=3600.0,
        doc="Seconds a job's message may be neither queued nor held by a worker before the sweeper sends it "
        "again (a worker that took it moments ago may not have answered the sweeper's probe yet).",
    )
    admin_token: str | None = setting(
        "WHISPERQ_ADMIN_TOKEN",
        group="Security & keys",
        secret=True,
        check=check_secret,
        type_name="secret",
        form="a random value of 16+ characters",
        doc="A bearer token that acts as an admin key (every job, /v1/admin/…); masked in `whisperq config`.",
    )
    queue_budget_seconds: float = setting(
        "WHISPERQ_QUEUE_BUDGET_SECONDS",
        "float",
        group="Limits & queue",
        default=8 * 3600.0,
        low=1.0,
        doc="Seconds of audio waiting beyond which submissions get 429.",
    )
    queue_budget_jobs: int = setting(
        "WHISPERQ_QUEUE_BUDGET_JOBS",
        "int",
        group="Limits & queue",
        default=10_000,
        low=1,
        high=10**9,
        doc="Jobs waiting beyond which submissions get 429.",
    )
    queue_key_share: float = setting(
        "WHISPERQ_QUEUE_KEY_SHARE",
        "float",
        group="Limits & queue",
        default=0.5,
        low=0.01,
        then=lambda value, _: min(1.0, value),
        form="0.01 to 1 (more counts as 1)",
        doc="The share of the queue budget one API key may hold; 1 for no per-key limit.",
    )
    high_reserve: float = setting(
        "WHISPERQ_HIGH_RESERVE",
        "float",
        group="Limits & queue",
        default=0.2,
        low=0.0,
        form="0 to less than 1",
        check=share("the share of the queue budget kept for priority high", below_one=True),
        doc="The share of the queue budget only priority high may use.",
    )
    disk_floor_mb: int = setting(
        "WHISPERQ_DISK_FLOOR_MB",
        "int",
        group="Limits & queue",
        default=1024,
        low=0,
        high=10**9,
        doc="Free space in the data dir, in MB, below which submissions get 503 and /readyz fails.",
    )
    rate_limit: str | None = setting(
        "WHISPERQ_RATE_LIMIT",
        "rate",
        group="Quotas & rates",
        default="off",
        doc="Submissions per anonymous client (by address) per window, such as 120/minute; off for no limit.",
    )
    redis_url: str | None = setting(
        "WHISPERQ_REDIS_URL",
        "url",
        group="Broker & database",
        schemes=("redis", "rediss", "unix"),
        check=check_url,
        shown_default="the broker when it is Redis",
        doc="Where rate-limit counts are kept.",
    )
    sync_wait_seconds: float = setting(
        "WHISPERQ_SYNC_WAIT_SECONDS",
        "float",
        group="Limits & queue",
        default=60.0,
        low=0.0,
        doc="How long /v1/audio/transcriptions waits for the transcript before answering 202.",
    )
    webhook_secret: str | None = setting(
        "WHISPERQ_WEBHOOK_SECRET",
        "webhook_secret",
        group="Webhooks & fetching",
        secret=True,
        check=check_secret,
        shown_default="generated into the data dir",
        doc="The key that signs webhooks, the same in every process; masked in `whisperq config`.",
    )
    # non-public hosts webhooks may go to (config.allow)
    webhook_allow: tuple[AllowRule, ...] = setting(
        "WHISPERQ_WEBHOOK_ALLOW",
        "allow",
        group="Webhooks & fetching",
        shown_default="none",
        form=_ALLOW_FORM,
        doc="Non-public hosts webhooks may be sent to (public ones always may).",
        also=(
            Var(
                LEGACY_ALLOW,
                "Webhooks & fetching",
                "network list",
                "none",
                "networks, comma separated",
                "Earlier versions' single list; it still counts for webhooks and fetches alike: move it to "
                "WHISPERQ_WEBHOOK_ALLOW and WHISPERQ_FETCH_ALLOW.",
            ),
        ),
    )
    # non-public hosts audio may be fetched from
    fetch_allow: tuple[AllowRule, ...] = setting(
        "WHISPERQ_FETCH_ALLOW",
        "allow",
        group="Webhooks & fetching",
        shown_default="none",
        form=_ALLOW_FORM,
        doc="Non-public hosts audio_url may fetch from (public ones always may).",
    )
    webhook_timeout_seconds: float = setting(
        "WHISPERQ_WEBHOOK_TIMEOUT",
        "float",
        group="Webhooks & fetching",
        default=10.0,
        low=0.1,
        doc="Seconds for one webhook attempt, connection included.",
    )
    webhook_retry_base_seconds: float = setting(
        "WHISPERQ_WEBHOOK_RETRY_BASE_SECONDS",
        "float",
        group="Webhooks & fetching",
        default=5.0,
        low=0.0,
        doc="Webhook backoff base, in seconds (full jitter, doubling, capped at an hour).",
    )
    webhook_retry_window_seconds: float = setting(
        "WHISPERQ_WEBHOOK_RETRY_WINDOW",
        "float",
        group="Webhooks & fetching",
        default=DAY,
        low=0.0,
        doc="Seconds after which a failing webhook is given up.",
    )
    webhook_max_inline_bytes: int = setting(
        "WHISPERQ_WEBHOOK_MAX_INLINE_BYTES",
        "int",
        group="Webhooks & fetching",
        default=262144,
        low=0,
        high=64 * 1024 * 1024,
        doc="Larger transcripts, in bytes, are left out of the webhook body (the receiver fetches transcript_url).",
    )
    fetch_timeout_seconds: float = setting(
        "WHISPERQ_FETCH_TIMEOUT",
        "float",
        group="Webhooks & fetching",
        default=120.0,
        low=1.0,
        doc="Seconds to fetch one audio_url.",
    )
    public_url: str | None = setting(
        "WHISPERQ_PUBLIC_URL",
        "url",
        group="Web",
        schemes=("http", "https"),
        shown_default="http://$HOST:$PORT",
        doc="The API's address as clients see it, for links in webhooks (and a name WHISPERQ_ALLOWED_HOSTS allows).",
    )
    # --- metrics & alerts
    metrics_port: int = setting(
        "WHISPERQ_METRICS_PORT",
        "int",
        group="Metrics & alerts",
        default=0,
        low=0,
        high=65535 - METRICS_PORT_SPAN,
        shown_default="0 (off)",
        doc="Base port of the workers' own /metrics: prepare +0, inference +1, notify +2, further workers from +3.",
    )
    # where workers serve /metrics (tasks.metrics): loopback unless set
    metrics_address: str = setting(
        "WHISPERQ_METRICS_ADDRESS",
        group="Metrics & alerts",
        default="127.0.0.1",
        then=lambda value, _: value.strip(),
        form="an IP address",
        doc="Where workers serve their /metrics, which takes no token.",
    )
    alert_queue_age_seconds: float = setting(
        "WHISPERQ_ALERT_QUEUE_AGE_SECONDS",
        "float",
        group="Metrics & alerts",
        default=600.0,
        low=0.0,
        doc="Alert when a queue's oldest job has waited longer, in seconds.",
    )
    alert_queue_depth: int = setting(
        "WHISPERQ_ALERT_QUEUE_DEPTH",
        "int",
        group="Metrics & alerts",
        default=1000,
        low=0,
        high=10**9,
        doc="Alert when more messages than this wait in a queue for 5 minutes.",
    )
    alert_failure_rate: float = setting(
        "WHISPERQ_ALERT_FAILURE_RATE",
        "float",
        group="Metrics & alerts",
        default=0.05,
        low=0.0,
        form="0 to 1",
        check=share("a share of jobs"),
        doc="Alert when more than this share of the jobs finished in 15 minutes failed or expired.",
    )
    alert_dead_letters: int = setting(
        "WHISPERQ_ALERT_DEAD_LETTERS",
        "int",
        group="Metrics & alerts",
        default=1,
        low=0,
        high=10**9,
        doc="Alert at this many dead letters; 0 for never.",
    )
    alert_disk_free_bytes: int = setting(
        "WHISPERQ_ALERT_DISK_FREE_BYTES",
        "int",
        group="Metrics & alerts",
        default=5 * 1024**3,
        low=0,
        high=2**62,
        shown_default="5368709120 (5 GiB)",
        doc="Alert when the data dir's file system has less free, in bytes.",
    )
    # Security and tenancy (see models.access.apikeys, models.security.crypto, models.maintenance.retention).
    allow_anonymous: bool = setting(
        "WHISPERQ_ALLOW_ANONYMOUS",
        "bool",
        group="Security & keys",
        default=False,
        shown_default="false (true under `whisperq run`)",
        doc="Requests without a key act anonymously (the web page needs no sign-in).",
    )
    secret_key: str | None = setting(
        "WHISPERQ_SECRET_KEY",
        group="Security & keys",
        secret=True,
        check=check_secret,
        type_name="secret",
        shown_default="generated into the data dir",
        form="a random value of 16+ characters",
        doc="Signs the web page's session cookie; the same in every web process; masked in `whisperq config`.",
    )
    metrics_token: str | None = setting(
        "WHISPERQ_METRICS_TOKEN",
        group="Metrics & alerts",
        secret=True,
        check=check_secret,
        type_name="secret",
        shown_default="unset: /metrics answers loopback only",
        form="a random value of 16+ characters",
        doc="The bearer token /metrics needs (an admin key works too); masked in `whisperq config`.",
    )
    encryption_keys: str | None = setting(
        "WHISPERQ_ENCRYPTION_KEYS",
        "encryption_keys",
        group="Security & keys",
        secret=True,
        check=check_encryption_keys,
        shown_default="generated into the data dir, with a warning",
        doc="The first key encrypts audio, prepared samples and transcripts, all decrypt; make one with "
        "`whisperq encryption new-key`; masked in `whisperq config`.",
    )
    # data from before encryption reads (models.security.crypto): to rotate it
    allow_plaintext_rows: bool = setting(
        "WHISPERQ_ALLOW_PLAINTEXT_ROWS",
        "bool",
        group="Security & keys",
        default=False,
        doc="Read values and files stored before encryption: set it, run `whisperq encryption rotate`, unset it.",
    )
    # --- retention
    audio_retention_seconds: float | None = setting(
        "WHISPERQ_AUDIO_RETENTION",
        "duration",
        group="Retention",
        default=3600.0,
        shown_default="1h",
        doc="How long audio (upload and prepared samples) is kept after its job ends.",
    )
    result_retention_seconds: float | None = setting(
        "WHISPERQ_RESULT_RETENTION",
        "duration",
        group="Retention",
        default=7 * DAY,
        shown_default="7d",
        doc="How long a finished job's transcript, file name, prompt, URLs, webhook records and dead letter are kept.",
    )
    retention_interval_seconds: float = setting(
        "WHISPERQ_RETENTION_INTERVAL",
        "float",
        group="Retention",
        default=300.0,
        low=1.0,
        doc="Seconds between retention passes (the beat process).",
    )
    # --- quotas & rates
    rate_limit_premium: str | None = _tier_rate("premium", "600/minute")
    rate_limit_standard: str | None = _tier_rate("standard", "120/minute")
    rate_limit_batch: str | None = _tier_rate("batch", "60/minute")
    # a status poll faster than its Retry-After gets 429 (web.pollrate)
    poll_limit: bool = setting(
        "WHISPERQ_POLL_LIMIT",
        "bool",
        group="Quotas & rates",
        default=True,
        doc="A client polling a job's status faster than its Retry-After (after 3 reads of grace) gets 429 saying the "
        "interval to use.",
    )
    # WHISPERQ_INPUT_DIRS: (key or None for shared, dir)
    input_grants: tuple[tuple[str | None, Path], ...] = setting(
        "WHISPERQ_INPUT_DIRS",
        group="Storage & data",
        then=lambda value, values: _input_dirs(value, values["data_dir"]),
        type_name="directory list",
        shown_default="$WHISPERQ_DATA_DIR/inbox",
        form="absolute directories, comma separated: DIR (shared) or KEY=DIR (one API key's own)",
        doc="Where transcribe.delay(path), raw messages and MQTT requests may read files from; a file in a key's own "
        "directory is that key's alone, even inside a shared one.",
    )
    anonymous_max_priority: str = setting(
        "WHISPERQ_ANONYMOUS_MAX_PRIORITY",
        "choice",
        group="Security & keys",
        default="normal",
        choices=PRIORITIES,
        doc="The highest priority anonymous use may ask for.",
    )
    # where a submission without a key may have audio_url=s3://BUCKET/KEY read from (config.s3_sources)
    anonymous_s3_sources: tuple[str, ...] = setting(
        "WHISPERQ_ANONYMOUS_S3_SOURCES",
        group="Security & keys",
        parse=_anonymous_s3_sources,
        default=(),
        type_name="S3 source list",
        shown_default="none",
        form=f"{S3_SOURCE_FORM} entries, comma separated, or none",
        doc="The buckets and prefixes a submission without an API key may name in an s3:// audio_url, read with "
        "the deployment's AWS credentials (a key's own are set with `whisperq keys s3-sources`); never the "
        "service's own WHISPERQ_STORAGE prefix.",
    )
    sync_waits: int = setting(
        "WHISPERQ_SYNC_WAITS",
        "int",
        group="Limits & queue",
        default=2,
        low=0,
        high=10_000,
        doc="Requests to /v1/audio/transcriptions one web process lets wait for their transcript at once.",
    )
    max_audio_seconds_premium: float = _tier_audio("premium")
    max_audio_seconds_standard: float = _tier_audio("standard")
    max_audio_seconds_batch: float = _tier_audio("batch")
    sync_waits_per_client: int = setting(
        "WHISPERQ_SYNC_WAITS_PER_CLIENT",
        "int",
        group="Limits & queue",
        default=1,
        low=0,
        high=10_000,
        doc="Of WHISPERQ_SYNC_WAITS, how many one key or address may hold.",
    )
    allowed_hosts: tuple[str, ...] | None = setting(
        "WHISPERQ_ALLOWED_HOSTS",
        group="Web",
        then=lambda value, _: _hosts(value),
        type_name="host list",
        shown_default="loopback names and WHISPERQ_PUBLIC_URL's host while listening on loopback; any otherwise",
        form="host names (no port), comma separated; * for any",
        doc="The Host names requests to the API and pages may use (a guard against DNS rebinding).",
    )
    # Monthly audio quotas per tier, in hours (None: off; see models.access.quotas).
    quota_hours_premium: float | None = _tier_quota("premium")
    quota_hours_standard: float | None = _tier_quota("standard")
    quota_hours_batch: float | None = _tier_quota("batch")
    # aliases (A/B by weight) and shadow decoding (config.registry)
    routes: Routes = setting(  # noqa: RUF009 (a Field, as field() gives)
        "WHISPERQ_ALIASES",
        group="Models & engine",
        late=True,
        parse=lambda env, values: _routes(env, values)[0],
        field_default=Routes(),
        type_name="alias list",
        shown_default="none",
        form="ALIAS=MODEL:WEIGHT|MODEL:WEIGHT, comma separated",
        doc="A/B routing: a job naming the alias draws one of its models by weight, once.",
        also=(
            Var(
                "WHISPERQ_SHADOW",
                "Models & engine",
                "shadow list",
                "none",
                "PRIMARY=CANDIDATE:PERCENT, comma separated (tiny.en=base:20)",
                "Shadow decoding: that share of the primary's jobs is decoded again by the candidate, apart, and "
                "compared; clients see the primary's transcript.",
            ),
        ),
    )
    # an inference claim's lease, renewed while it runs (models.jobs.claims)
    claim_lease_seconds: float = setting(
        "WHISPERQ_CLAIM_LEASE_SECONDS",
        "float",
        group="Batching & workers",
        default=60.0,
        low=3.0,
        field_default=60.0,
        doc="Lease of an inference worker's claim on a job, renewed while it runs: a killed worker's job is taken "
        "over within it.",
    )
    # SQS (CELERY_BROKER_URL=sqs://): config.celeryconfig's queues, docs/deployment/sqs.md
    # the account S3 requests must find owning the bucket (ExpectedBucketOwner), if set
    s3_expected_owner: str | None = setting(
        "WHISPERQ_S3_EXPECTED_OWNER",
        group="Storage & data",
        default="",
        then=_account,
        field_default=None,
        shown_default="unset: not checked",
        form="an AWS account id (12 digits)",
        doc="Every request to S3 (s3:// storage, audio_url=s3://…) says which account must own its bucket; S3 "
        "refuses it for a bucket of any other (a name deleted and taken by someone else). Set it to your "
        "account's id on AWS.",
    )
    sqs_queue_prefix: str = setting(
        "WHISPERQ_SQS_QUEUE_PREFIX",
        group="Broker & database",
        default="",
        then=_sqs_prefix,
        field_default="",
        shown_default="none",
        form="at most 40 letters, digits, hyphens and underscores",
        doc="With CELERY_BROKER_URL=sqs://: the start of every SQS queue name of this deployment (prod- makes "
        "prod-whisperq-prepare), so that several deployments share one account and region.",
        also=(
            Var(
                "AWS_ENDPOINT_URL_SQS",
                "Broker & database",
                "URL",
                "unset: AWS's SQS (or AWS_ENDPOINT_URL)",
                "an http:// or https:// URL",
                "With sqs://: an SQS-compatible server's endpoint, read by boto3 (AWS_ENDPOINT_URL counts for SQS "
                "and S3 alike); region and credentials come from the same variables as for S3 storage.",
            ),
        ),
    )
    sqs_wait_seconds: int = setting(
        "WHISPERQ_SQS_WAIT_SECONDS",
        "int",
        group="Broker & database",
        default=1,
        low=1,
        high=20,
        field_default=1,
        doc="With sqs://: how long an idle worker's receive waits for a message (SQS long polling); longer makes "
        "fewer requests, and a job may wait that long for an idle worker to see it.",
    )
    sqs_visibility_timeout: int = setting(
        "WHISPERQ_SQS_VISIBILITY_TIMEOUT",
        "int",
        group="Broker & database",
        default=60,
        low=5,
        high=3600,
        field_default=60,
        doc="With sqs://: seconds a received message stays hidden from other workers. A live worker extends every "
        "message it holds by this much every third of it, however long the job runs; a killed worker's messages "
        "are handed out again within it.",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        values = read_all(fields(cls), Env(os.environ if environ is None else environ), check_values)
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
            return ("localhost", "127.0.0.1", "::1", self.host.lower(), *public)
        if public:
            return (
                ("localhost", "127.0.0.1", "::1")
                + public
                + ((self.host.lower(),) if self.host not in ("0.0.0.0", "::") else ())
            )
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

    def analysis_time_limit(self, audio_seconds: float | None) -> float:
        """Hard limit for one analysis of one job (speakers, redaction): a fraction of its
        transcription's on any CPU, with the same room."""
        return 300.0 + 1.0 * (audio_seconds if audio_seconds is not None else self.max_audio_seconds)

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
        return generated_secret(
            self.data_dir / "webhook-secret", lambda: "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
        )

    def session_secret(self) -> str:
        """WHISPERQ_SECRET_KEY (signs the web page's session cookie), or one generated once
        into the data dir."""
        return self.secret_key or generated_secret(self.data_dir / "session-secret", lambda: secrets.token_urlsafe(32))

    def describe(self) -> dict[str, str]:
        """Settings as strings with passwords masked, for logs and `whisperq config`."""
        out = {}
        for f in fields(self):
            value = declared(f).mask(getattr(self, f.name))  # the declaration marks secrets
            if isinstance(value, tuple):
                value = ",".join(str(v) for v in value)
            out[f.name] = _mask(str(value)) if value is not None else ""
        return out


def _mask(text: str) -> str:
    if "://" in text and "@" in text:
        scheme, rest = text.split("://", 1)
        creds, host = rest.rsplit("@", 1)
        if ":" in creds:
            creds = creds.split(":", 1)[0] + ":***"
        return f"{scheme}://{creds}@{host}"
    return text
