"""The embedded broker keeps queued messages across a restart and refuses a second instance."""
import pytest
import redis

from config.embedded import EmbeddedRedis


def test_queued_messages_survive_a_restart(tmp_path):
    broker = EmbeddedRedis(tmp_path / "redis")
    broker.start()
    client = redis.Redis.from_url(broker.url)
    client.lpush("whisperq.transcribe", "job-1", "job-2")
    broker.stop()
    assert broker.process is None

    again = EmbeddedRedis(tmp_path / "redis")
    again.start()
    try:
        assert redis.Redis.from_url(again.url).lrange("whisperq.transcribe", 0, -1) == [b"job-2", b"job-1"]
    finally:
        again.stop()


def test_it_listens_on_loopback_with_a_password(tmp_path):
    with EmbeddedRedis(tmp_path / "redis") as broker:
        assert broker.url.startswith("redis://:") and "@127.0.0.1:" in broker.url
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=broker.port).ping()
        assert (tmp_path / "redis" / "redis.conf").stat().st_mode & 0o077 == 0


def test_a_second_instance_on_the_same_data_dir_is_refused(tmp_path):
    with EmbeddedRedis(tmp_path / "redis"):
        with pytest.raises(RuntimeError, match="already using the embedded broker"):
            EmbeddedRedis(tmp_path / "redis").start()
