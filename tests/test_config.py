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
