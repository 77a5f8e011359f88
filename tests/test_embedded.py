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
    with EmbeddedRedis(tmp_path / "redis"), pytest.raises(RuntimeError, match="already using the embedded broker"):
        EmbeddedRedis(tmp_path / "redis").start()


def test_a_server_a_killed_run_left_behind_is_stopped_and_its_queue_kept(tmp_path):
    """A run killed outright leaves its server running on the data dir's files: the next one
    stops it (gracefully: what it held is in its file) before it writes the same files."""
    import os

    orphan = EmbeddedRedis(tmp_path / "redis")
    orphan.start()
    redis.Redis.from_url(orphan.url).lpush("whisperq.transcribe", "job-1")
    pid = orphan.process.pid
    orphan.release()  # as the killed run's exit would: the lock goes, the server stays
    assert (tmp_path / "redis" / "redis.pid").read_text().strip() == str(pid)

    again = EmbeddedRedis(tmp_path / "redis")
    try:
        again.start()
        assert orphan.process.wait(30) == 0  # stopped with SIGTERM: it saved and exited cleanly
        assert redis.Redis.from_url(again.url).lrange("whisperq.transcribe", 0, -1) == [b"job-1"]
        assert again.process.pid != pid and os.path.exists(f"/proc/{again.process.pid}")
    finally:
        again.stop()


def test_a_pid_file_naming_another_process_is_left_alone(tmp_path):
    import subprocess

    (tmp_path / "redis").mkdir()
    other = subprocess.Popen(["sleep", "60"])
    try:
        (tmp_path / "redis" / "redis.pid").write_text(f"{other.pid}\n")  # a stale file, its pid reused
        with EmbeddedRedis(tmp_path / "redis") as broker:
            assert redis.Redis.from_url(broker.url).ping()
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
