"""Every place whisperq relies on a library's internals, in one module.

Each entry says what it works around or reaches into, and the versions it was checked
against (TESTED, the same ranges setup.cfg allows). tests/test_compat.py holds a contract test
for each: it fails when a library changes what the entry relies on, before a worker does.
.ci/run runs those tests on the newest versions of each range (the install) and on the
oldest (FLOORS). A worker logs a warning at start when an installed version is outside its
range (``check_versions``). To take a library's new version: widen its range here and in
setup.cfg, and run tests/test_compat.py against it.

Imports nothing of the product: the speech engines and the worker call in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from importlib import metadata
from typing import Any

log = logging.getLogger(__name__)

# distribution -> the versions every entry below was checked against
TESTED = {
    "celery": ">=5.4,<5.8",
    "kombu": ">=5.4,<5.8",
    "faster-whisper": ">=1.1,<1.3",
    "openai-whisper": ">=20240930,<=20250625",
}
# The oldest version of each range, installed by .ci/run for a second run of the contract tests.
FLOORS = {"celery": "5.4.0", "kombu": "5.4.0", "faster-whisper": "1.1.0", "openai-whisper": "20240930"}


def check_versions() -> list[str]:
    """A line for each installed library outside the range its entries were checked against."""
    from packaging.specifiers import SpecifierSet

    out = []
    for name, spec in TESTED.items():
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # an optional engine not installed
        if version not in SpecifierSet(spec):
            out.append(
                f"{name} {version} is outside the versions whisperq was checked against ({spec}); "
                "run tests/test_compat.py against it"
            )
    for line in out:
        log.warning("%s", line)
    return out


# --- kombu: acks after the Redis connection is gone --------------------------------------------


def guard_redis_acks() -> None:
    """Keep a worker consuming after the Redis broker restarts (kombu.transport.redis.QoS).

    A task that finishes after the connection was lost acks through kombu's Redis QoS, whose
    channel has lost its connection by then: the AttributeError escapes kombu's error handling
    and stops the consumer for good (a threads-pool worker stays up and never takes another
    message). Such an ack is skipped: the job's row is already final, and the broker still
    holds the message as unacknowledged; when it is handed out again the job is found done.
    Patches the class once per process; a second call changes nothing.
    """
    from kombu.transport import redis as kombu_redis

    qos = kombu_redis.QoS
    if hasattr(qos, "_whisperq_unguarded"):
        return
    ack: Any = qos.ack
    restore: Any = qos.restore_unacked

    def guarded_ack(self: Any, delivery_tag: Any) -> Any:
        if redis_channel_closed(self):
            log.warning("ack of %s skipped: its broker connection is gone", delivery_tag)
            return None
        return ack(self, delivery_tag)

    def guarded_restore(self: Any, client: Any = None) -> Any:
        if client is None and redis_channel_closed(self):
            return None
        return restore(self, client)

    # the patch itself: kombu's methods replaced on its class
    qos.ack, qos.restore_unacked, qos._whisperq_unguarded = (  # type: ignore[method-assign,attr-defined]
        guarded_ack,
        guarded_restore,
        (ack, restore),
    )


def redis_channel_closed(qos: Any) -> bool:
    """Whether a QoS's channel has lost its connection (kombu sets the client to None)."""
    transport = getattr(qos.channel, "connection", None)
    return transport is None or getattr(transport, "client", None) is None


# --- celery: what a request shows of its arguments ------------------------------------------------


def hide_arguments(request: Any, secrets: tuple[str, ...]) -> None:
    """What a received request shows of its arguments in events (Flower, and its flower.db) and
    in the worker's own error lines: its arguments as they are, but the `secrets` among its
    keyword arguments masked. celery.worker.request.Request reads them from the message's
    `argsrepr` and `kwargsrepr` headers, which a producer writes as it likes (a client of its own
    puts the whole of its kwargs there, an API key included), into its private `_argsrepr` and
    `_kwargsrepr`; the task-received event is sent from them right after the task_received
    signal, which calls this."""
    from celery.utils.saferepr import saferepr

    kwargs = request.kwargs if isinstance(request.kwargs, dict) else {}
    shown = {k: ("<hidden>" if k in secrets else v) for k, v in kwargs.items()}
    request._argsrepr = saferepr(request.args if isinstance(request.args, (list, tuple)) else ())
    request._kwargsrepr = saferepr(shown)


# --- celery: requests waiting in the worker's timer (countdown / eta) ---------------------------


def scheduled_requests(timer: Any) -> Iterator[dict[str, Any]]:
    """The requests a worker holds for later (a retry's countdown), as `celery inspect
    scheduled` lists them; celery.worker.control's private helper."""
    from celery.worker.control import _iter_schedule_requests

    requests: Iterator[dict[str, Any]] = _iter_schedule_requests(timer)
    return requests


# --- kombu: SQS queues asked in order; a message rejected for good kept in a dead-letter queue ----


def sqs_transport() -> type:
    """kombu's SQS transport (kombu.transport.SQS.Transport) with a channel of whisperq's, which
    Celery uses where the broker is sqs:// (tasks.app). It changes two things.

    Order. kombu polls each queue a worker consumes on its own loop, all at once (each a long
    poll that returns when a message arrives), and delivers whatever comes back: asked for
    `high` and `low`, a worker takes one of each in turn, and holds both at once whatever its
    prefetch (checked on kombu 5.4 to 5.7; tests/test_compat.py shows it). This channel runs one
    loop instead: while the worker has a free slot it asks its queues in the order it consumes
    them (config.celeryconfig.consumed_in_order: every high, every normal, every low), each with
    a receive that does not wait and for no more messages than free slots, and starts again
    from the top after each message; it takes from a queue only when every one before it
    answered empty. When all are empty it waits: the first queue's receive becomes a long poll
    of `wait_time_seconds` (WHISPERQ_SQS_WAIT_SECONDS), the others are asked after it.

    Dead letters. A message rejected for good (Celery's Reject(requeue=False): a job out of
    attempts, a malformed message) is sent to the queue the transport option
    `whisperq_dead_letter_queue` names, with the attribute `whisperq-rejected` saying from
    which queue, and deleted from its own, as RabbitMQ's dead-letter exchange does. kombu 5.4
    leaves such a message in its queue (SQS hands it out again after its visibility timeout),
    5.7 deletes it unless its queue has a redrive policy, and leaves it then.

    Heartbeat. A received message is hidden from other workers only for the queue's visibility
    timeout (WHISPERQ_SQS_VISIBILITY_TIMEOUT, a minute by default). Every `whisperq_heartbeat`
    seconds (a third of it) the channel extends every message its worker holds and has not
    acknowledged (running, reserved, or waiting for a countdown) by the timeout again, with
    ChangeMessageVisibilityBatch, ten at a time: a job runs as long as it needs, and a worker
    that dies (SIGKILL, a lost host) stops extending, so its messages are handed out again
    within a timeout, not after the hard time limit of the longest job (hours). kombu extends
    nothing by itself (checked on kombu 5.4 to 5.7).

    Built on first use: kombu's SQS module needs boto3, which only the sqs extra installs.
    """
    built = _SQS.get("transport")
    if built is None:
        built = _SQS["transport"] = _build_sqs_transport()
    return built


_SQS: dict[str, type] = {}
SQS_REJECTED = "whisperq-rejected"  # the attribute of a message this channel dead-lettered


def _build_sqs_transport() -> type:
    from botocore.exceptions import BotoCoreError, ClientError
    from kombu.transport import SQS, virtual
    from vine import promise  # type: ignore[import-untyped]  # vine ships no types

    class Channel(SQS.Channel):
        # `this` is self as Any: kombu's channel methods carry no annotations
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._whisperq_order: list[str] = []
            self._whisperq_polling = False
            self._whisperq_beat: Any = None
            base: Any = super()
            base.__init__(*args, **kwargs)

        def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
            if queue not in self._whisperq_order:
                self._whisperq_order.append(queue)
            base: Any = super()
            return base.basic_consume(queue, no_ack, *args, **kwargs)

        def _schedule_queue(self, queue: str) -> None:
            # kombu starts its loop of each queue here (5.7 from basic_consume, 5.4 through
            # _loop1); one ordered loop runs instead, for every queue of the channel.
            this: Any = self
            if this.hub is not None and not self._whisperq_polling:
                self._whisperq_polling = True
                this.hub.call_soon(self._whisperq_ask, 0, False)
            every = this.transport_options.get("whisperq_heartbeat")
            if this.hub is not None and every and self._whisperq_beat is None:
                self._whisperq_beat = this.hub.call_repeatedly(every, self._whisperq_extend)

        def _whisperq_extend(self) -> None:
            """The heartbeat: every message held and not acknowledged, hidden for another timeout."""
            this: Any = self
            if this.closed:
                if self._whisperq_beat is not None:
                    self._whisperq_beat.cancel()
                return
            held = _held_messages(this.qos)
            if not held:
                return
            seconds = int(this.transport_options.get("visibility_timeout") or 60)
            client = this.sqs()
            for url, handles in held.items():
                for start in range(0, len(handles), 10):  # SQS's batch holds ten entries
                    entries = [
                        {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": seconds}
                        for i, handle in enumerate(handles[start : start + 10])
                    ]
                    try:
                        answer = client.change_message_visibility_batch(QueueUrl=url, Entries=entries)
                    except (ClientError, BotoCoreError) as exc:
                        log.warning(
                            "the visibility of %d held message(s) of %s was not extended: %s", len(entries), url, exc
                        )
                        continue
                    for failed in answer.get("Failed") or ():  # acknowledged meanwhile, or taken back by SQS
                        log.info("a held message of %s was not extended: %s", url, failed.get("Message") or failed)

        def _whisperq_ask(self, index: int, waiting: bool) -> None:
            this: Any = self
            queues = [q for q in self._whisperq_order if q in this._active_queues]
            if not queues or this.closed:
                self._whisperq_polling = False
                return
            if not this.qos.can_consume():  # no free slot: look again shortly (no request)
                this.hub.call_later(this.connection.polling_interval or 0.2, self._whisperq_ask, 0, False)
                return
            if index >= len(queues):  # every queue answered empty: wait on the first one
                this.hub.call_soon(self._whisperq_ask, 0, True)
                return
            queue = queues[index]
            url = this._new_queue(queue)
            name = this.canonical_queue_name(queue)
            this.asynsqs(queue=name).receive_message(
                name,
                url,
                number_messages=this._get_message_estimate(),
                wait_time_seconds=this.wait_time_seconds if waiting and index == 0 else 0,
                callback=promise(self._whisperq_received, (queue, url, index, waiting)),
            )

        def _whisperq_received(self, queue: str, url: str, index: int, waiting: bool, response: Any) -> None:
            this: Any = self
            messages = response.get("Messages") if isinstance(response, dict) else None
            if not messages:
                this.hub.call_soon(self._whisperq_ask, index + 1, waiting)
                return
            deliver = this.connection._callbacks.get(queue)
            if deliver is None:  # its consumer was cancelled meanwhile (a warm shutdown)
                release = getattr(this, "_release_messages", None)  # kombu 5.7; 5.4: visible after the timeout
                if release is not None:
                    release(url, queue, messages)
            else:
                for message in messages:
                    deliver(this._message_to_python(message, queue, url))
            this.hub.call_soon(self._whisperq_ask, 0, False)

        def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> Any:
            if not requeue:
                self._whisperq_dead_letter(delivery_tag)
            # not SQS.Channel's: it would delete the message, or leave it in its queue
            plain: Any = virtual.Channel
            return plain.basic_reject(self, delivery_tag, requeue=requeue)

        def _whisperq_dead_letter(self, delivery_tag: Any) -> None:
            this: Any = self
            try:
                info = this.qos.get(delivery_tag).delivery_info
                message, source = info["sqs_message"], info["sqs_queue"]
            except KeyError:
                return
            dead = this.transport_options.get("whisperq_dead_letter_queue")
            client = this.sqs()
            try:
                if dead:
                    client.send_message(
                        QueueUrl=this._new_queue(dead),
                        MessageBody=message["Body"],
                        MessageAttributes={SQS_REJECTED: {"DataType": "String", "StringValue": source}},
                    )
                client.delete_message(QueueUrl=source, ReceiptHandle=message["ReceiptHandle"])
            except (ClientError, BotoCoreError) as exc:
                # left in its queue: SQS hands it out again after its visibility timeout, and
                # moves it to the dead-letter queue by its redrive policy in the end
                log.warning("a rejected message of %s was not moved to the dead-letter queue: %s", source, exc)

    class Transport(SQS.Transport):
        pass

    def _held_messages(qos: Any) -> dict[str, list[str]]:
        """Queue URL -> the receipt handles of the messages this channel holds unacknowledged
        (kombu's QoS: delivered, less those acknowledged and not yet flushed)."""
        acked = set(qos._dirty)
        out: dict[str, list[str]] = {}
        for tag, message in list(qos._delivered.items()):
            info = getattr(message, "delivery_info", None) or {}
            url, sqs_message = info.get("sqs_queue"), info.get("sqs_message")
            if tag in acked or not url or not sqs_message:
                continue
            out.setdefault(url, []).append(sqs_message["ReceiptHandle"])
        return out

    Transport.Channel = Channel
    return Transport


# --- faster-whisper: the batched pipeline's decoding, window by window --------------------------


def faster_whisper_options(
    tokenizer: Any,
    *,
    beam_size: int,
    prompt: str | None,
    temperature: float,
    prepend_punctuations: str,
    append_punctuations: str,
    hotwords: str | None = None,
) -> Any:
    """faster-whisper's BatchedInferencePipeline's decoding options (its TranscriptionOptions,
    an internal dataclass every field of which must be given): text without timestamp tokens."""
    from faster_whisper.transcribe import TranscriptionOptions, get_suppressed_tokens

    return TranscriptionOptions(
        beam_size=beam_size,
        best_of=5,
        patience=1.0,
        length_penalty=1.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        log_prob_threshold=-1.0,
        no_speech_threshold=0.6,
        compression_ratio_threshold=2.4,
        temperatures=[temperature],
        initial_prompt=prompt,
        prefix=None,
        suppress_blank=True,
        suppress_tokens=get_suppressed_tokens(tokenizer, [-1]),
        prepend_punctuations=prepend_punctuations,
        append_punctuations=append_punctuations,
        max_new_tokens=None,
        hotwords=hotwords,
        word_timestamps=False,
        hallucination_silence_threshold=None,
        condition_on_previous_text=False,
        clip_timestamps=[],
        prompt_reset_on_temperature=0.5,
        multilingual=False,
        without_timestamps=True,
        max_initial_timestamp=0.0,
    )


def faster_whisper_decode(
    pipeline: Any, features: Any, tokenizer: Any, options: Any
) -> tuple[Any, list[dict[str, Any]]]:
    """One batched decoding call of BatchedInferencePipeline (its `generate_segment_batched`):
    the encoder output and, per window, a dict with its "tokens"."""
    decoded: tuple[Any, list[dict[str, Any]]] = pipeline.generate_segment_batched(features, tokenizer, options)
    return decoded


def faster_whisper_align(
    model: Any, tokenizer: Any, texts: list[list[int]], encoder_output: Any, frames: list[int]
) -> list[Any]:
    """Word timings for each window's tokens on the same encoder output (WhisperModel.find_alignment)."""
    alignments: list[Any] = model.find_alignment(tokenizer, texts, encoder_output, frames)
    return alignments


# --- openai-whisper: beam search over several windows -------------------------------------------


def openai_whisper_decoding_task(model: Any, options: Any) -> Any:
    """whisper.decode's DecodingTask, fixed for several windows with beam search.

    Since openai-whisper's "Avoid rearranging all caches" (PR #1483, 2023; unfixed up to
    20250625, open PRs #2197, #2389, #2843) the tokens are repeated per beam but the audio
    features are not: one window broadcasts, several fail with "The size of tensor a (15)
    must match the size of tensor b (3)". Here the features are repeated once encoded (after
    language detection, which wants one row per window), as before that change. If
    openai-whisper repeats them itself one day, decoding fails loudly (shapes), never
    silently; tests/test_compat.py shows whether the fix is still needed.
    """
    from whisper.decoding import DecodingTask

    class BatchedDecodingTask(DecodingTask):  # type: ignore[misc]  # openai-whisper ships no types
        def _get_audio_features(self, mel: Any) -> Any:
            features = super()._get_audio_features(mel)
            return features.repeat_interleave(self.n_group, dim=0) if self.n_group > 1 else features

        def _detect_language(self, audio_features: Any, tokens: Any) -> Any:
            return super()._detect_language(audio_features[:: self.n_group], tokens)

    return BatchedDecodingTask(model, options)
