"""The provisional stream: parts a run publishes as they happen, before any commit (issue 19 item 2).

``<ns>.stream`` is co-partitioned with ``<ns>.log`` (same partition count, the conversation id as the key, murmur2
placement) and kept briefly (`STREAM_RETENTION_MS`). It is **not** canonical: nothing is decided from it, a worker
crash can leave an attempt's parts there that the log never confirms, and a part can be lost (a delivery that
fails is logged, not retried by settled). `StreamPublisher` writes it with a plain idempotent producer, outside the
appender's transactions (so a part is readable at once, not at the next commit; tests/unit/test_produce_paths.py).

A part is a JSON envelope (`encode_part` / `decode_part`), not Avro: the topic is provisional and carries arbitrary
JSON values (``ctx.emit``), so a registered schema would add a version bump to every change of a throwaway format;
the envelope's ``v`` field (`STREAM_PART_VERSION`) lets a reader refuse a format it does not know
(docs/architecture.md "The provisional stream").
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from settled._errors import ErrorCategory, SettledError
from settled._settings import Settings
from settled.producers._kafka import producer_config

__all__ = [
    "STREAM_PART_VERSION",
    "STREAM_RETENTION_MS",
    "STREAM_SEGMENT_MS",
    "PartKind",
    "StreamPart",
    "StreamPartError",
    "StreamPublisher",
    "decode_part",
    "encode_part",
]

_log = logging.getLogger(__name__)

#: The envelope version this code writes and reads.
STREAM_PART_VERSION = 1

#: How long the broker keeps ``<ns>.stream`` records, in milliseconds (one hour: a follower reconnecting later
#: reads the settlement instead).
STREAM_RETENTION_MS = 3_600_000

#: Segment roll of ``<ns>.stream``, in milliseconds: retention deletes whole closed segments only.
STREAM_SEGMENT_MS = 600_000

#: Largest encoded part, in bytes (below the producer's 1,000,000-byte ``message.max.bytes``).
MAX_PART_BYTES = 900_000

PartKind = str
"""``"emit"`` (a ``ctx.emit`` value), ``"text"`` or ``"reasoning"`` (a model delta), or ``"interrupted"`` (the
model call's text so far was cut: the retry's text replaces it; data ``{"response_ordinal": n, "error": ...}``)."""

_KINDS = frozenset({"emit", "text", "reasoning", "interrupted"})


class StreamPartError(SettledError, ValueError):
    """A stream part that cannot be published or read (names the field and value)."""

    category = ErrorCategory.BAD_INPUT


@dataclass(frozen=True)
class StreamPart:
    """One provisional part of a run.

    Attributes:
        run: The run (its submission id).
        conversation_id: The conversation (the record key).
        attempt_id: The attempt that published it.
        attempt: That attempt's number (1, 2, ...): a later attempt supersedes an earlier one's parts.
        seq: The part's position within its attempt (0, 1, ...).
        kind: `PartKind`: ``"emit"``, ``"text"``, ``"reasoning"`` or ``"interrupted"``.
        data: The part's value: the emitted JSON value, the delta's text, or what was interrupted.
    """

    run: str
    conversation_id: str
    attempt_id: str
    attempt: int
    seq: int
    kind: PartKind
    data: Any


def encode_part(part: StreamPart) -> bytes:
    """Encode a part as its JSON envelope.

    Args:
        part: The part.

    Returns:
        The record value, UTF-8 JSON.

    Raises:
        StreamPartError: ``part.data`` is not JSON-serializable, or the encoded part exceeds `MAX_PART_BYTES`.
    """
    envelope = {
        "v": STREAM_PART_VERSION,
        "run": part.run,
        "conversation": part.conversation_id,
        "attempt_id": part.attempt_id,
        "attempt": part.attempt,
        "seq": part.seq,
        "kind": part.kind,
        "data": part.data,
    }
    try:
        value = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise StreamPartError(f"stream part data {part.data!r:.200} is not a JSON value: {exc}") from exc
    if len(value) > MAX_PART_BYTES:
        raise StreamPartError(f"stream part of run {part.run} is {len(value)} bytes, over the {MAX_PART_BYTES} limit")
    return value


def decode_part(value: bytes) -> StreamPart:
    """Decode a part's JSON envelope.

    Args:
        value: The record value.

    Returns:
        The part.

    Raises:
        StreamPartError: Not a version-`STREAM_PART_VERSION` envelope; names the field and value.
    """
    try:
        raw = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StreamPartError(f"stream record is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise StreamPartError(f"stream record is {type(raw).__name__}, not an object")
    if raw.get("v") != STREAM_PART_VERSION:
        raise StreamPartError(f"stream record field v is {raw.get('v')!r}, this reader knows {STREAM_PART_VERSION}")
    for name in ("run", "conversation", "attempt_id"):
        if not isinstance(raw.get(name), str):
            raise StreamPartError(f"stream record field {name} is {raw.get(name)!r}, not a string")
    for name in ("attempt", "seq"):
        if not isinstance(raw.get(name), int) or raw[name] < 0:
            raise StreamPartError(f"stream record field {name} is {raw.get(name)!r}, not a non-negative integer")
    if raw.get("kind") not in _KINDS:
        raise StreamPartError(f"stream record field kind is {raw.get('kind')!r}, not one of {sorted(_KINDS)}")
    return StreamPart(
        run=raw["run"],
        conversation_id=raw["conversation"],
        attempt_id=raw["attempt_id"],
        attempt=raw["attempt"],
        seq=raw["seq"],
        kind=raw["kind"],
        data=raw.get("data"),
    )


class StreamPublisher:
    """Publishes parts to ``<ns>.stream`` with an idempotent, non-transactional producer; thread-safe.

    A delivery failure is logged (WARNING, with the error) and counted in `failed`: the stream is provisional, the
    log keeps what is canonical. A fatal producer error replaces the producer.

    Args:
        settings: Namespace and Kafka settings.

    Attributes:
        topic: The stream topic.
        failed: Parts whose delivery failed.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.topic = settings.topic("stream")
        self.failed = 0
        self._lock = threading.Lock()
        self._producer: Producer | None = None  # built at the first part: a worker whose runs never publish has none

    def _new_producer(self) -> Producer:
        # linger.ms 5: a part reaches a follower within milliseconds, and a burst of deltas still shares a request.
        linger: dict[str, Any] = {"linger.ms": 5}
        return Producer(producer_config(self._settings, **linger))

    def _on_delivery(self, error: KafkaError | None, _msg: Message) -> None:
        if error is not None:
            self.failed += 1
            _log.warning("stream part not delivered: %s", error.str(), extra={"topic": self.topic})

    def publish(self, part: StreamPart) -> None:
        """Hand a part to the producer (returns at once; delivered within ``linger.ms``).

        Args:
            part: The part.

        Raises:
            StreamPartError: The part cannot be encoded (`encode_part`).
        """
        value = encode_part(part)
        with self._lock:
            for _ in range(2):
                if self._producer is None:
                    self._producer = self._new_producer()
                try:
                    self._producer.produce(
                        self.topic, value, part.conversation_id.encode(), on_delivery=self._on_delivery
                    )
                    self._producer.poll(0)
                    return
                except BufferError:
                    self._producer.poll(0.1)  # the local queue is full: serve deliveries, then once more
                except KafkaException as exc:
                    error = exc.args[0]
                    if not (isinstance(error, KafkaError) and error.fatal()):
                        raise
                    _log.error("stream producer failed, replacing it: %s", error.str())
                    self._producer = None
            self.failed += 1
            _log.warning("stream part dropped: the producer's queue stayed full", extra={"run": part.run})

    def flush(self, timeout_s: float) -> int:
        """Wait until every part handed over is delivered (or failed).

        Args:
            timeout_s: Bound on the wait, in seconds.

        Returns:
            How many parts are still undelivered (0 when all are).
        """
        producer = self._producer  # not under the lock: runs go on publishing while one flushes
        return 0 if producer is None else int(producer.flush(timeout_s))
