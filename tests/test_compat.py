"""Contract tests for models.compat: what each workaround relies on in a library's internals is
still there, and the problem it works around still exists. .ci/run runs this module on the
newest and on the oldest versions that setup.cfg allows."""

import base64
import configparser
import inspect
import json
import logging
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from helpers import CLIPS, need_service, word_error_rate
from packaging.requirements import Requirement

from models import compat
from models.speech import audio

ROOT = Path(__file__).resolve().parent.parent


# --- the ranges -----------------------------------------------------------------------------------


def _declared() -> dict[str, str]:
    """Each library's range as setup.cfg declares it (install_requires and the extras)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines() + [
        line for extra in cfg["options.extras_require"].values() for line in extra.splitlines()
    ]
    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            out[req.name] = str(req.specifier)
    return out


def test_setup_cfg_allows_exactly_the_checked_versions():
    declared = _declared()
    from packaging.specifiers import SpecifierSet

    for name, spec in compat.TESTED.items():
        assert SpecifierSet(declared[name]) == SpecifierSet(spec), f"{name}: setup.cfg says {declared[name]}"
        assert compat.FLOORS[name] in SpecifierSet(spec), f"{name}'s floor {compat.FLOORS[name]} is not in {spec}"


def test_the_installed_versions_are_in_the_checked_ranges(caplog):
    with caplog.at_level(logging.WARNING, logger="models.compat"):
        assert compat.check_versions() == []


def test_a_version_outside_its_range_is_reported(monkeypatch, caplog):
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "9.9.9" if name == "kombu" else real(name))
    with caplog.at_level(logging.WARNING, logger="models.compat"):
        lines = compat.check_versions()
    assert lines == [
        f"kombu 9.9.9 is outside the versions whisperq was checked against ({compat.TESTED['kombu']}); "
        "run tests/test_compat.py against it"
    ]
    assert lines[0] in caplog.text


# --- kombu ------------------------------------------------------------------------------------------


@pytest.fixture
def closed_redis_qos():
    """A real kombu Redis channel's QoS, after its channel was closed (as a broker restart does)."""
    from kombu import Connection

    conn = Connection("redis://127.0.0.1:6379/15")
    try:
        channel = conn.channel()
    except Exception as exc:  # Redis not running here
        need_service(f"Redis on 127.0.0.1:6379 unreachable: {exc}")
    qos = channel.qos
    assert not compat.redis_channel_closed(qos)
    channel.close()
    yield qos
    conn.release()


def test_kombu_still_fails_an_ack_on_a_closed_redis_channel(closed_redis_qos):
    """What guard_redis_acks works around: without it the AttributeError stops the consumer.
    When kombu fixes this, this test fails: drop the workaround then."""
    from kombu.transport.redis import QoS

    unguarded_ack = getattr(QoS, "_whisperq_unguarded", (QoS.ack,))[0]
    assert compat.redis_channel_closed(closed_redis_qos)  # what the guard looks at
    with pytest.raises(AttributeError):
        unguarded_ack(closed_redis_qos, "tag-1")


def test_the_guarded_ack_skips_a_closed_channel_once_patched(closed_redis_qos, caplog):
    from kombu.transport.redis import QoS

    compat.guard_redis_acks()
    patched = QoS.ack
    compat.guard_redis_acks()  # a second worker_init in the same process changes nothing
    assert QoS.ack is patched
    assert inspect.signature(QoS._whisperq_unguarded[0]).parameters.keys() == {"self", "delivery_tag"}
    assert list(inspect.signature(QoS._whisperq_unguarded[1]).parameters) == ["self", "client"]
    with caplog.at_level(logging.WARNING, logger="models.compat"):
        assert closed_redis_qos.ack("tag-1") is None
        assert closed_redis_qos.restore_unacked() is None
    assert "ack of tag-1 skipped" in caplog.text


def _sqs_consumed(transport: type, reject: str | None = None) -> tuple[list[str], dict]:
    """Three `low` then three `high` messages on SQS (the loopback server), then one consumer of
    `q:high` and `q:low` with one slot, on an event loop as a Celery worker runs it: the order it
    takes them in (acking each, or rejecting `reject` for good), and the transport's options."""
    import time
    import uuid

    from kombu import Connection, Consumer, Exchange, Queue
    from kombu.asynchronous import Hub, get_event_loop, set_event_loop

    before, hub = get_event_loop(), Hub()
    set_event_loop(hub)
    exchange = Exchange("x", type="direct")
    queues = [Queue("q:high", exchange, routing_key="high"), Queue("q:low", exchange, routing_key="low")]
    options = {
        "queue_name_prefix": f"c{uuid.uuid4().hex[:8]}-",
        "wait_time_seconds": 1,
        "polling_interval": 0.1,
        "whisperq_dead_letter_queue": "q.dead",
    }
    taken: list[str] = []

    def take(body, message):
        taken.append(body["tag"])
        message.reject(requeue=False) if body["tag"] == reject else message.ack()

    try:
        with Connection("sqs://", transport=transport, transport_options=options) as conn:
            producer = conn.Producer()
            for tier in ("low", "high"):
                for n in range(3):
                    producer.publish({"tag": f"{tier}{n}"}, exchange=exchange, routing_key=tier, declare=queues)
            consumer = Consumer(conn.channel(), queues=queues, callbacks=[take], prefetch_count=1)
            consumer.consume()
            deadline = time.monotonic() + 60
            while len(taken) < 6 and time.monotonic() < deadline:
                hub.run_once()
            consumer.cancel()
    finally:
        hub.close()
        set_event_loop(before)
    return taken, options


def test_kombus_sqs_consumer_takes_its_queues_in_turn(sqs_env):
    """What the SQS channel works around: kombu polls each queue on a loop of its own and
    delivers what comes back, so `low` messages are taken while `high` ones wait. When kombu
    honours the order of its queues, this test fails: drop the channel's ordered loop then."""
    from kombu.transport.SQS import Transport

    taken, _ = _sqs_consumed(Transport)
    assert sorted(taken) == ["high0", "high1", "high2", "low0", "low1", "low2"]
    assert taken.index("low0") < taken.index("high2"), taken


def test_the_sqs_channel_takes_high_first_and_keeps_what_it_rejects(sqs_env):
    taken, options = _sqs_consumed(compat.sqs_transport(), reject="low1")
    assert taken == ["high0", "high1", "high2", "low0", "low1", "low2"]
    sqs = sqs_env.client("sqs")
    url = sqs.get_queue_url(QueueName=options["queue_name_prefix"] + "q-dead")["QueueUrl"]
    dead = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])["Messages"]
    envelope = json.loads(base64.b64decode(dead[0]["Body"]))  # kombu's message, as SQS keeps it
    assert len(dead) == 1 and json.loads(base64.b64decode(envelope["body"])) == {"tag": "low1"}
    assert dead[0]["MessageAttributes"][compat.SQS_REJECTED]["StringValue"].endswith("q_low")
    low = sqs.get_queue_url(QueueName=options["queue_name_prefix"] + "q_low")["QueueUrl"]
    attributes = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    left = sqs.get_queue_attributes(QueueUrl=low, AttributeNames=attributes)["Attributes"]
    assert left == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}


def _sqs_held(transport: type, seconds: float) -> tuple[int, dict, dict]:
    """One message on SQS taken by a consumer on an event loop and held unacknowledged for
    `seconds` (the queue's visibility timeout is 2 s): how many times it was delivered, the
    queue's counts of visible and hidden messages then, and two timeouts after the consumer let
    go without acknowledging."""
    import time
    import uuid

    from kombu import Connection, Consumer, Exchange, Queue
    from kombu.asynchronous import Hub, get_event_loop, set_event_loop

    before, hub = get_event_loop(), Hub()
    set_event_loop(hub)
    exchange = Exchange("x", type="direct")
    queue = Queue("held", exchange, routing_key="held")
    options = {
        "queue_name_prefix": f"h{uuid.uuid4().hex[:8]}-",
        "wait_time_seconds": 1,
        "polling_interval": 0.1,
        "visibility_timeout": 2,
        "whisperq_heartbeat": 0.5,
    }
    held: list = []
    client = boto3_sqs()
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]

    def counts() -> dict:
        url = client.get_queue_url(QueueName=options["queue_name_prefix"] + "held")["QueueUrl"]
        return {
            k: int(v) for k, v in client.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"].items()
        }

    try:
        with Connection("sqs://", transport=transport, transport_options=options) as conn:
            conn.Producer().publish({"tag": "one"}, exchange=exchange, routing_key="held", declare=[queue])
            consumer = Consumer(conn.channel(), queues=[queue], callbacks=[lambda body, m: held.append(m)])
            consumer.consume()
            deadline = time.monotonic() + 30
            while not held and time.monotonic() < deadline:
                hub.run_once()
            assert held, "the consumer never took the message"
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                hub.run_once()
            while_held = counts()
            consumer.cancel()
    finally:
        hub.close()
        set_event_loop(before)
    # once no heartbeat extends it, its visibility timeout (2 s) runs out and SQS shows it again
    deadline = time.monotonic() + 30
    after = counts()
    while after["ApproximateNumberOfMessages"] == 0 and time.monotonic() < deadline:
        after = counts()
    return len(held), while_held, after


def boto3_sqs():
    import boto3

    return boto3.session.Session().client("sqs")


def test_kombus_sqs_consumer_lets_a_held_message_show_again_after_the_visibility_timeout(sqs_env):
    """What the channel's heartbeat works around: kombu extends nothing, so a message held longer
    than its queue's visibility timeout is handed to another consumer while the first still
    runs it. When kombu extends what it holds, this test fails: drop the heartbeat then."""
    from kombu.transport.SQS import Transport

    deliveries, _, _ = _sqs_held(Transport, seconds=5)
    assert deliveries >= 2  # handed out again (here to the same consumer) while it was held


def test_the_sqs_channel_keeps_what_its_worker_holds_hidden_and_lets_go_when_it_stops(sqs_env):
    deliveries, while_held, after = _sqs_held(compat.sqs_transport(), seconds=5)
    assert deliveries == 1
    assert while_held == {"ApproximateNumberOfMessages": 0, "ApproximateNumberOfMessagesNotVisible": 1}
    assert after == {"ApproximateNumberOfMessages": 1, "ApproximateNumberOfMessagesNotVisible": 0}


# --- celery -----------------------------------------------------------------------------------------


def test_celery_lists_a_workers_scheduled_requests():
    """The sweeper asks each worker what it holds, retries waiting out a countdown included."""
    from celery import Celery
    from celery.worker.request import Request
    from kombu import Message
    from kombu.asynchronous.timer import Timer
    from kombu.serialization import dumps

    app = Celery("compat", set_as_current=False)
    app.conf.broker_url = "memory://"

    @app.task(name="compat.noop", shared=False)
    def noop():
        return None

    message = app.amqp.as_task_v2("0a0a0a0a-0000-4000-8000-0000000000c0", "compat.noop", countdown=60)
    content_type, encoding, body = dumps(message.body, serializer="json")
    request = Request(
        Message(body=body, headers=message.headers, content_type=content_type, content_encoding=encoding),
        app=app,
        task=noop,
    )
    timer = Timer()
    timer.call_at(request.eta, lambda r: None, (request,), priority=5)
    entries = list(compat.scheduled_requests(timer))
    assert [e["request"]["id"] for e in entries] == ["0a0a0a0a-0000-4000-8000-0000000000c0"]


def test_celerys_received_event_shows_what_the_message_says_and_hiding_masks_the_secrets():
    """What compat.hide_arguments works around: a producer's kwargsrepr header is what the
    task-received event (Flower, flower.db) and the worker's error lines show, its API key in
    it; hiding masks it there. When Celery stops reading the header, this test says so."""
    from celery import Celery
    from celery.worker.request import Request
    from kombu import Message
    from kombu.serialization import dumps

    app = Celery("compat", set_as_current=False)
    app.conf.broker_url = "memory://"

    @app.task(name="compat.noop", shared=False)
    def noop(path, **kwargs):
        return None

    kwargs = {"language": "en", "api_key": "wq_secret_key_of_a_producer"}
    message = app.amqp.as_task_v2(
        "0a0a0a0a-0000-4000-8000-0000000000c1", "compat.noop", args=("/a.wav",), kwargs=kwargs, kwargsrepr=repr(kwargs)
    )
    content_type, encoding, body = dumps(message.body, serializer="json")
    request = Request(
        Message(body=body, headers=message.headers, content_type=content_type, content_encoding=encoding),
        app=app,
        task=noop,
    )
    assert "wq_secret_key_of_a_producer" in request.kwargsrepr  # as the producer wrote it
    assert "wq_secret_key_of_a_producer" in str(request.info(safe=True))
    compat.hide_arguments(request, ("api_key",))
    assert "wq_secret" not in request.kwargsrepr and "'language': 'en'" in request.kwargsrepr
    assert "wq_secret" not in str(request.info(safe=True)) and "/a.wav" in request.argsrepr


# --- faster-whisper ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def faster():
    from models.speech.engines import FasterWhisperEngine, bundled_model_path

    return FasterWhisperEngine(bundled_model_path(), device="cpu")


def test_faster_whisper_options_name_every_field():
    """TranscriptionOptions is an internal dataclass without defaults: a field added upstream
    makes every call fail, a field renamed decodes differently. The fields must be ours."""
    from faster_whisper.transcribe import TranscriptionOptions

    source = inspect.getsource(compat.faster_whisper_options)
    ours = {
        line.split("=")[0].strip()
        for part in source.split("TranscriptionOptions(")[1].split(")\n")[0].split(",")
        for line in [part]
        if "=" in part
    }
    assert ours == set(TranscriptionOptions.__dataclass_fields__)


def test_faster_whisper_batched_steps_decode_two_windows(faster):
    """generate_segment_batched and find_alignment, called as the engine calls them, on two
    windows at once: the words are right and each has its timings."""
    from faster_whisper.audio import pad_or_trim

    from models.speech.engines import APPEND_PUNCTUATIONS, PREPEND_PUNCTUATIONS

    assert list(inspect.signature(faster.pipeline.generate_segment_batched).parameters)[:3] == [
        "features",
        "tokenizer",
        "options",
    ]
    assert list(inspect.signature(faster.model.find_alignment).parameters)[:4] == [
        "tokenizer",
        "text_tokens",
        "encoder_output",
        "num_frames",
    ]
    chunks = [audio.decode(CLIPS[name]["path"]) for name in ("fox.flac", "report.opus")]
    tokenizer = faster._tokenizer("en", "transcribe")
    options = compat.faster_whisper_options(
        tokenizer,
        beam_size=5,
        prompt=None,
        temperature=0.0,
        prepend_punctuations=PREPEND_PUNCTUATIONS,
        append_punctuations=APPEND_PUNCTUATIONS,
    )
    features = np.stack([pad_or_trim(faster.model.feature_extractor(c)[..., :-1]) for c in chunks])
    encoder_output, outputs = compat.faster_whisper_decode(faster.pipeline, features, tokenizer, options)
    texts = [[t for t in out["tokens"] if t < tokenizer.eot] for out in outputs]
    for tokens, name in zip(texts, ("fox.flac", "report.opus"), strict=True):
        assert word_error_rate(CLIPS[name]["text"], tokenizer.decode(tokens)) < 0.15
    frames = [int(np.ceil(len(c) / faster.model.feature_extractor.hop_length)) for c in chunks]
    alignments = compat.faster_whisper_align(faster.model, tokenizer, texts, encoder_output, frames)
    assert len(alignments) == 2 and all(len(words) > 3 for words in alignments)
    assert all({"word", "start", "end", "probability"} <= set(w) for words in alignments for w in words)


# --- openai-whisper ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def whisper_model(tmp_path_factory):
    try:
        import torch  # noqa: F401
        import whisper
    except ImportError as exc:
        need_service(
            f"the openai-whisper contract needs its extra ({exc}): "
            "pip install torch==2.13.0 && pip install -e '.[openai-whisper]'"
        )
    from models.speech.convert import convert
    from models.speech.engines import bundled_model_path

    target = tmp_path_factory.mktemp("compat-whisper") / "tiny.en.pt"
    convert(bundled_model_path(), target)
    return whisper.load_model(str(target), device="cpu")


def _mels(model, names):
    import torch
    import whisper

    return torch.stack(
        [
            whisper.log_mel_spectrogram(whisper.pad_or_trim(audio.decode(CLIPS[n]["path"])), model.dims.n_mels)
            for n in names
        ]
    )


def test_openai_whisper_still_fails_beam_search_over_several_windows(whisper_model):
    """What openai_whisper_decoding_task works around. When openai-whisper fixes it, this
    test fails: drop the workaround then."""
    import whisper
    from whisper.decoding import DecodingTask

    options = whisper.DecodingOptions(language="en", beam_size=3, without_timestamps=True, fp16=False)
    with pytest.raises(RuntimeError, match="size of tensor"):
        DecodingTask(whisper_model, options).run(_mels(whisper_model, ["fox.flac", "report.opus"]))


def test_openai_whisper_beam_search_over_several_windows_with_the_fix(whisper_model):
    import whisper
    from whisper.decoding import DecodingTask

    for name in ("_get_audio_features", "_detect_language", "run"):
        assert callable(getattr(DecodingTask, name)), name
    options = whisper.DecodingOptions(language="en", beam_size=3, without_timestamps=True, fp16=False)
    task = compat.openai_whisper_decoding_task(whisper_model, options)
    results = task.run(_mels(whisper_model, ["fox.flac", "report.opus"]))
    assert task.n_group == 3
    for result, name in zip(results, ("fox.flac", "report.opus"), strict=True):
        assert word_error_rate(CLIPS[name]["text"], result.text) < 0.15
