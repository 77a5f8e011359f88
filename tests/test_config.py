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
    with pytest.raises(ConfigError, match="CELERY_BROKER_URL is not set.*make run"):
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
    LocalStorage(settings.data_dir).tmp_dir
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


@pytest.mark.parametrize("name", ["WHISPERQ_ADMIN_TOKEN", "WHISPERQ_SECRET_KEY", "WHISPERQ_METRICS_TOKEN",
                                  "WHISPERQ_WEBHOOK_SECRET"])
@pytest.mark.parametrize("value, words", [
    ("CHANGE-ME-admin-token", "placeholder (CHANGE-ME)"),
    ("a-long-value-that-says-change-me", "placeholder (CHANGE-ME)"),
    ("ChangeMe0123456789abcdef", "placeholder (CHANGE-ME)"),
    ("x", "shorter than 16"),
    ("s3cret", "shorter than 16"),
    ("aaaaaaaaaaaaaaaaaaaaaaaa", "different characters"),
])
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


@pytest.mark.parametrize("name, url", [
    ("CELERY_BROKER_URL", "redis://:CHANGE-ME-redis-password@redis:6379/0"),
    ("CELERY_BROKER_URL", "amqp://whisperq:CHANGE-ME-rabbitmq-password@rabbitmq:5672//"),
    ("DATABASE_URL", "postgresql+psycopg://whisperq:CHANGE-ME-postgres-password@postgres:5432/whisperq"),
    ("WHISPERQ_REDIS_URL", "redis://:change-me@redis:6379/1"),
    ("CELERY_RESULT_BACKEND", "db+postgresql://whisperq:CHANGE%2DME@postgres/whisperq"),
])
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
    s = Settings.from_env({
        "WHISPERQ_DATA_DIR": str(tmp_path), "WHISPERQ_ADMIN_TOKEN": GOOD, "WHISPERQ_SECRET_KEY": GOOD,
        "WHISPERQ_METRICS_TOKEN": GOOD, "WHISPERQ_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        "FLOWER_BASIC_AUTH": f"admin:{GOOD}", "CELERY_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//",
        "DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/whisperq_test",
        "WHISPERQ_ADMIN_TOKEN_UNUSED": "x",
    })
    assert s.admin_token == GOOD and s.describe()["admin_token"] == "***"


def test_the_mqtt_bridge_refuses_the_example_password():
    from config.mqtt import MqttSettings

    with pytest.raises(ConfigError, match=r"^WHISPERQ_MQTT_URL: .*CHANGE-ME"):
        MqttSettings.from_env({"WHISPERQ_MQTT_URL": "mqtts://whisperq:CHANGE-ME-mqtt-password@mqtt.internal:8883"})
