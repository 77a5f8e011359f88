from pathlib import Path

import pytest

from config import ConfigError, Settings, broker_priority, celery_config


def test_defaults_work_on_a_fresh_machine(tmp_path):
    s = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path)})
    assert s.data_dir == tmp_path.resolve()
    assert s.database_url == f"sqlite:///{tmp_path.resolve() / 'whisperq.db'}"
    assert (s.port, s.flower_port, s.max_upload_mb) == (8000, 5555, 200)
    assert (s.engine, s.device, s.compute_type) == ("faster-whisper", "auto", "auto")
    assert s.broker_url is None


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("PORT", "eighty", "whole number"),
        ("PORT", "70000", "out of range"),
        ("FLOWER_PORT", "0", "out of range"),
        ("WHISPERQ_MAX_UPLOAD_MB", "-5", "out of range"),
        ("WHISPERQ_DEVICE", "tpu", "auto, cpu, cuda"),
        ("WHISPERQ_ENGINE", "whisper.cpp", "faster-whisper"),
        ("WHISPERQ_COMPUTE_TYPE", "int4", "one of"),
        ("CELERY_BROKER_URL", "localhost:6379", "redis://"),
        ("DATABASE_URL", "mysql://root@localhost/x", "postgresql://"),
        ("WHISPERQ_MODEL", "/nonexistent/model", "not a directory"),
        ("WHISPERQ_DEFAULT_LANGUAGE", "english", "language code"),
        ("WHISPERQ_MAX_AUDIO_SECONDS", "abc", "not a number"),
    ],
)
def test_bad_values_fail_naming_the_variable(tmp_path, name, value, words):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), name: value})
    assert name in str(err.value)
    assert words in str(err.value)


def test_missing_broker_says_how_to_fix(tmp_path):
    s = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"CELERY_BROKER_URL is not set.*make run"):
        celery_config(s)


def test_passwords_are_masked(tmp_path):
    s = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "CELERY_BROKER_URL": "amqp://user:secret@host:5672//"})
    assert "secret" not in s.describe()["broker_url"]
    assert s.describe()["broker_url"] == "amqp://user:***@host:5672//"


def test_priority_tiers_map_to_each_brokers_order():
    redis, amqp = "redis://localhost:6379/0", "amqp://guest:guest@localhost//"
    # Redis pops the lowest number first; RabbitMQ delivers the highest first.
    assert broker_priority("high", redis) < broker_priority("normal", redis) < broker_priority("low", redis)
    assert broker_priority("high", amqp) > broker_priority("normal", amqp) > broker_priority("low", amqp)
    with pytest.raises(ValueError, match="one of"):
        broker_priority("urgent", redis)


@pytest.mark.parametrize("broker", ["redis://localhost:6379/0", "amqp://guest:guest@localhost//"])
def test_celery_config_is_json_only_and_acks_late(tmp_path, broker):
    s = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "CELERY_BROKER_URL": broker})
    conf = celery_config(s)
    assert conf["task_serializer"] == "json" and conf["accept_content"] == ["json"]
    assert conf["result_accept_content"] == ["json"]
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    assert conf["task_default_priority"] == broker_priority("normal", broker)
    if broker.startswith("redis"):
        opts = conf["broker_transport_options"]
        assert opts["queue_order_strategy"] == "priority"
        assert opts["visibility_timeout"] > s.max_audio_seconds
        assert conf["result_backend"] == broker
    else:
        assert conf["broker_transport_options"]["confirm_publish"] is True
        assert conf["task_queues"][0].queue_arguments["x-max-priority"] == 9
        assert conf["result_backend"] == "db+" + s.database_url


def test_the_data_dir_and_its_secrets_are_the_owners_alone(tmp_path):
    """Made 0700 where the service creates it, secrets 0600 from their first byte."""
    import stat

    from config import Settings
    from config.embedded import EmbeddedRedis
    from models.storage import LocalStorage

    data = tmp_path / "fresh" / "data"
    settings = Settings.from_env({"WHISPERQ_DATA_DIR": str(data)})
    _ = LocalStorage(settings.data_dir).tmp_dir  # the property creates the data dir
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o700
    settings.session_secret()
    assert stat.S_IMODE((data / "session-secret").stat().st_mode) == 0o600
    broker = EmbeddedRedis(data / "redis")
    broker.start()
    try:
        assert stat.S_IMODE((data / "redis" / "redis.conf").stat().st_mode) == 0o600
        assert stat.S_IMODE((data / "redis").stat().st_mode) == 0o700
    finally:
        broker.stop()


# --- secrets that cannot be the example (config.secrets) ---------------------------------------

GOOD = "Zq3vN8pL2xR7tY5wK9mB4cD6"  # random-looking, 24 characters


@pytest.mark.parametrize(
    "name", ["WHISPERQ_ADMIN_TOKEN", "WHISPERQ_SECRET_KEY", "WHISPERQ_METRICS_TOKEN", "WHISPERQ_WEBHOOK_SECRET"]
)
@pytest.mark.parametrize(
    "value, words",
    [
        ("CHANGE-ME-admin-token", "placeholder (CHANGE-ME)"),
        ("a-long-value-that-says-change-me", "placeholder (CHANGE-ME)"),
        ("ChangeMe0123456789abcdef", "placeholder (CHANGE-ME)"),
        ("x", "shorter than 16"),
        ("s3cret", "shorter than 16"),
        ("aaaaaaaaaaaaaaaaaaaaaaaa", "different characters"),
    ],
)
def test_placeholder_and_weak_secrets_are_refused_naming_the_setting(tmp_path, name, value, words):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), name: value})
    message = str(err.value)
    assert message.startswith(name) and words in message
    assert "python -c" in message  # how to make a real one
    if len(value) > 1:
        assert value not in message  # never the value itself (it goes to logs)


def test_the_message_says_how_to_make_a_token(tmp_path):
    with pytest.raises(ConfigError, match=r"WHISPERQ_ADMIN_TOKEN.*secrets\.token_urlsafe\(32\)"):
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_ADMIN_TOKEN": "x"})


@pytest.mark.parametrize("value", ["admin:CHANGE-ME-flower-password", "admin:Pw7#q", "ops:" + GOOD + ",admin:changeme"])
def test_flower_passwords_are_secrets_too(tmp_path, value):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "FLOWER_BASIC_AUTH": value})
    assert str(err.value).startswith("FLOWER_BASIC_AUTH") and "user 'admin'" in str(err.value)
    assert "python -c" in str(err.value) and value.rsplit(":", 1)[1] not in str(err.value)


@pytest.mark.parametrize(
    "name, url",
    [
        ("CELERY_BROKER_URL", "redis://:CHANGE-ME-redis-password@redis:6379/0"),
        ("CELERY_BROKER_URL", "amqp://whisperq:CHANGE-ME-rabbitmq-password@rabbitmq:5672//"),
        ("DATABASE_URL", "postgresql+psycopg://whisperq:CHANGE-ME-postgres-password@postgres:5432/whisperq"),
        ("WHISPERQ_REDIS_URL", "redis://:change-me@redis:6379/1"),
        ("CELERY_RESULT_BACKEND", "db+postgresql://whisperq:CHANGE%2DME@postgres/whisperq"),
    ],
)
def test_example_passwords_in_urls_are_refused(tmp_path, name, url):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), name: url})
    assert str(err.value).startswith(name) and "CHANGE-ME" in str(err.value) and "python -c" in str(err.value)


def test_example_encryption_keys_are_refused(tmp_path):
    # Valid base64 of 32 bytes that still spells the placeholder: refused all the same.
    for value in ("k1:CHANGE-ME-run-whisperq-encryption-new-key", "k1:CHANGEMEchangemeCHANGEMEchangemeCHANGEMEAA="):
        with pytest.raises(ConfigError, match=r"^WHISPERQ_ENCRYPTION_KEYS.*encryption new-key"):
            Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_ENCRYPTION_KEYS": value})


def test_unset_and_real_secrets_start(tmp_path):
    """Unset is fine (make run sets none); real values and short URL passwords of a local server pass."""
    Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path)})
    s = Settings.from_env(
        {
            "WHISPERQ_DATA_DIR": str(tmp_path),
            "WHISPERQ_ADMIN_TOKEN": GOOD,
            "WHISPERQ_SECRET_KEY": GOOD,
            "WHISPERQ_METRICS_TOKEN": GOOD,
            "WHISPERQ_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "FLOWER_BASIC_AUTH": f"admin:{GOOD}",
            "CELERY_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//",
            "DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/whisperq_test",
            "WHISPERQ_ADMIN_TOKEN_UNUSED": "x",
        }
    )
    assert s.admin_token == GOOD and s.describe()["admin_token"] == "***"


def test_the_mqtt_bridge_refuses_the_example_password():
    from config.mqtt import MqttSettings

    with pytest.raises(ConfigError, match=r"^WHISPERQ_MQTT_URL: .*CHANGE-ME"):
        MqttSettings.from_env({"WHISPERQ_MQTT_URL": "mqtts://whisperq:CHANGE-ME-mqtt-password@mqtt.internal:8883"})


# --- one declaration per setting (config.declare): parsing, checks and the reference ----------

DEFAULTS = {  # what each setting is when its variable is unset
    "host": "127.0.0.1",
    "port": 8000,
    "flower_port": 5555,
    "flower_address": "127.0.0.1",
    "flower_basic_auth": None,
    "storage": "local",
    "log_format": "auto",
    "engine": "faster-whisper",
    "model_path": None,
    "default_model": "tiny.en",
    "device": "auto",
    "compute_type": "auto",
    "beam_size": 5,
    "cpu_threads": 0,
    "max_upload_mb": 200,
    "max_batch_items": 100,
    "max_batch_upload_mb": 1024,
    "max_audio_seconds": 14400.0,
    "url_audio_estimate_seconds": 600.0,
    "default_language": None,
    "batch_size": 0,
    "batch_wait_ms": 50,
    "inference_slots": 8,
    "max_attempts": 3,
    "retry_base_seconds": 2.0,
    "retry_max_seconds": 300.0,
    "job_ttl_seconds": 86400.0,
    "sweep_interval_seconds": 30.0,
    "claim_lease_seconds": 60.0,
    "queue_budget_seconds": 28800.0,
    "queue_budget_jobs": 10_000,
    "queue_key_share": 0.5,
    "high_reserve": 0.2,
    "disk_floor_mb": 1024,
    "rate_limit": None,
    "redis_url": None,
    "sync_wait_seconds": 60.0,
    "webhook_allow": (),
    "fetch_allow": (),
    "webhook_timeout_seconds": 10.0,
    "webhook_retry_base_seconds": 5.0,
    "webhook_retry_window_seconds": 86400.0,
    "webhook_max_inline_bytes": 262144,
    "fetch_timeout_seconds": 120.0,
    "public_url": None,
    "metrics_port": 0,
    "metrics_address": "127.0.0.1",
    "alert_queue_age_seconds": 600.0,
    "alert_queue_depth": 1000,
    "alert_failure_rate": 0.05,
    "alert_dead_letters": 1,
    "alert_disk_free_bytes": 5 * 1024**3,
    "allow_anonymous": False,
    "allow_plaintext_rows": False,
    "audio_retention_seconds": 3600.0,
    "result_retention_seconds": 7 * 86400.0,
    "retention_interval_seconds": 300.0,
    "rate_limit_premium": "600/minute",
    "rate_limit_standard": "120/minute",
    "rate_limit_batch": "60/minute",
    "poll_limit": True,
    "sync_waits": 2,
    "sync_waits_per_client": 1,
    "anonymous_max_priority": "normal",
    "allowed_hosts": None,
    "max_audio_seconds_premium": 14400.0,
    "max_audio_seconds_standard": 14400.0,
    "max_audio_seconds_batch": 14400.0,
    "quota_hours_premium": None,
    "quota_hours_standard": None,
    "quota_hours_batch": None,
}


def _declarations():
    from dataclasses import fields

    from config.declare import declared

    return [(f.name, declared(f)) for f in fields(Settings)]


def test_every_setting_is_declared_once_with_its_variable_and_a_sentence():
    from dataclasses import fields

    from config.declare import GROUPS

    assert all("setting" in f.metadata for f in fields(Settings)), "declare each field with config.declare.setting"
    names = [d.env for _, d in _declarations()]
    assert len(names) == len(set(names)), "a variable is declared twice"
    for field, d in _declarations():
        assert d.env.isupper() and d.env.replace("_", "").isalnum(), field
        assert d.group in GROUPS, field
        assert len(d.doc) > 20 and d.doc[0].isupper() and d.doc.endswith("."), f"{field}: one sentence for the operator"
        assert d.var().bounds or d.kind == "str", f"{field}: say what it accepts"


def test_the_defaults_are_as_documented(tmp_path):
    from config.registry import Routes

    s = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path)})
    assert {name: getattr(s, name) for name in DEFAULTS} == DEFAULTS
    assert s.routes == Routes() and [m.name for m in s.models] == ["tiny.en"]
    assert s.input_grants == ((None, tmp_path.resolve() / "inbox"),)
    assert s.database_url == f"sqlite:///{tmp_path.resolve() / 'whisperq.db'}"  # derived from the data dir


def _bad_value(d):
    """A value the declaration refuses, and words today's message says."""
    if d.kind == "int":
        return str(d.high + 1), f"set it to an integer from {d.low} to {d.high}"
    if d.kind == "float":
        return str(d.low - 1), f"set it to a number of at least {d.low}"
    if d.kind == "choice":
        return "bogus", "is not one of: " + ", ".join(d.choices)
    if d.kind == "url":
        return "nope://x", "use a URL starting with one of: " + ", ".join(f"{s}://" for s in d.schemes)
    return {
        "bool": ("maybe", "set it to true or false"),
        "duration": ("soon", "set it to seconds or a number with s, m, h or d"),
        "hours": ("-1", "set it to a number above 0"),
        "rate": ("lots", "set it to a number per second, minute, hour or day"),
        "language": ("klingon", "is not a Whisper language code"),
    }.get(d.kind, (None, None))


# Every setting of a kind with bounds or a form (free text and the forms with tests of their own left out).
BOUNDED = [(name, d) for name, d in _declarations() if _bad_value(d)[0] is not None]


@pytest.mark.parametrize("field, declaration", BOUNDED, ids=[name for name, _ in BOUNDED])
def test_a_bad_value_of_any_setting_names_its_variable_and_what_to_set(tmp_path, field, declaration):
    value, words = _bad_value(declaration)
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), declaration.env: value})
    assert str(err.value).startswith(declaration.env) and words in str(err.value)


@pytest.mark.parametrize(
    "name, value, words",
    [
        ("PORT", "70000", "PORT=70000 is out of range; set it to an integer from 1 to 65535"),
        ("WHISPERQ_METRICS_PORT", "65436", "set it to an integer from 0 to 65435"),
        ("WHISPERQ_QUEUE_KEY_SHARE", "0.001", "set it to a number of at least 0.01"),
        (
            "WHISPERQ_HIGH_RESERVE",
            "1",
            "is the share of the queue budget kept for priority high; set it to a number from 0 to less than 1",
        ),
        ("WHISPERQ_ALERT_FAILURE_RATE", "1.5", "is a share of jobs; set it to a number from 0 to 1"),
        ("WHISPERQ_ANONYMOUS_MAX_PRIORITY", "urgent", "is not one of: high, normal, low"),
        ("WHISPERQ_PUBLIC_URL", "ftp://example.com", "use a URL starting with one of: http://, https://"),
        ("WHISPERQ_REDIS_URL", "localhost:6379", "has scheme '(none)'"),
    ],
)
def test_declared_bounds_and_checks_keep_their_messages(tmp_path, name, value, words):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), name: value})
    assert name in str(err.value) and words in str(err.value)


def test_bounds_are_inclusive_and_a_key_share_above_one_counts_as_one(tmp_path):
    s = Settings.from_env(
        {
            "WHISPERQ_DATA_DIR": str(tmp_path),
            "PORT": "65535",
            "WHISPERQ_METRICS_PORT": "65435",
            "WHISPERQ_QUEUE_KEY_SHARE": "5",
            "WHISPERQ_HIGH_RESERVE": "0.99",
        }
    )
    assert (s.port, s.metrics_port, s.queue_key_share, s.high_reserve) == (65535, 65435, 1.0, 0.99)


def test_every_declared_secret_is_masked(tmp_path):
    secrets = [(field, d) for field, d in _declarations() if d.secret]
    assert {field for field, _ in secrets} == {
        "admin_token",
        "webhook_secret",
        "secret_key",
        "metrics_token",
        "encryption_keys",
        "flower_basic_auth",
    }
    values = {
        "WHISPERQ_ADMIN_TOKEN": GOOD,
        "WHISPERQ_SECRET_KEY": GOOD + "s",
        "WHISPERQ_METRICS_TOKEN": GOOD + "m",
        "WHISPERQ_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "WHISPERQ_ENCRYPTION_KEYS": "k1:4BhyR0TH0wSvs+Lxxn+GUw1KjIYpsahZajx2f5AvVsw=",
        "FLOWER_BASIC_AUTH": f"ops:{GOOD},admin:{GOOD}x",
    }
    described = Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), **values}).describe()
    assert described["flower_basic_auth"] == "ops:***,admin:***"
    assert all(described[field] == "***" for field, _ in secrets if field != "flower_basic_auth")
    assert not any(value.split(":")[-1] in text for value in values.values() for text in described.values())


def _variables_read_by_the_source() -> set[str]:
    """Every variable name the product reads: WHISPERQ_* anywhere in its source, the names
    passed to environ/env reads, and the Procfile's ${NAME:-default}."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    reads = re.compile(
        r"""(?:environ|env)(?:\.\w+)?\(\s*["']([A-Z][A-Z0-9_]+)["']"""  # env.get("X"), env.int("X", …)
        r"""|environ\[["']([A-Z][A-Z0-9_]+)["']\]"""
    )
    names: set[str] = set()
    for top in ("config", "models", "tasks", "web"):
        for path in (root / top).rglob("*.py"):
            if path.name == "reference.py" and top == "config":
                continue  # the reference itself proves nothing
            text = path.read_text()
            names |= set(re.findall(r"\bWHISPERQ_[A-Z0-9_]+", text))
            names |= {a or b for a, b in reads.findall(text)}
    names |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]+)", (root / "Procfile").read_text()))
    return names - {"PATH"}


def test_every_variable_the_source_reads_is_in_the_reference():
    from config.reference import render, variables

    documented = {var.name for var in variables()}
    page = render()
    missing = sorted(
        name
        for name in _variables_read_by_the_source()
        if not (any(d.startswith(name) for d in documented) if name.endswith("_") else name in documented)
    )
    assert missing == [], "declare these in config/settings.py or list them in config/reference.py's OTHERS"
    assert all(f"`{name}`" in page for name in documented)
    assert len(documented) == len(variables()), "a variable is listed twice"


def test_the_reference_page_is_written_by_group(tmp_path):
    from config.declare import GROUPS
    from config.reference import main

    assert main([str(tmp_path / "configuration.md")]) == 0
    page = (tmp_path / "configuration.md").read_text()
    assert page.startswith("# Configuration reference\n")
    headings = [line[3:] for line in page.splitlines() if line.startswith("## ")]
    assert headings == [g for g in GROUPS if g in headings] and "Storage & data" in headings
    row = next(line for line in page.splitlines() if line.startswith("| `PORT` |"))
    assert "| integer | 8000 | 1 to 65535 |" in row
    assert "`WHISPERQ_MQTT_URL`" in page and "`WHISPERQ_SHADOW`" in page and "`OTEL_EXPORTER_OTLP_ENDPOINT`" in page


def test_the_checked_in_reference_page_is_what_the_declarations_write():
    """docs/configuration/reference.md is checked in (so it reads the same on the repository's
    site); a setting declared or changed without `make reference` fails here, saying so."""
    from config.reference import main

    page = Path(__file__).resolve().parent.parent / "docs" / "configuration" / "reference.md"
    assert main(["--check", str(page)]) == 0, "run `make reference` and commit docs/configuration/reference.md"
