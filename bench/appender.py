"""Benchmark: the transactional appender against a bare confluent-kafka transactional producer (issue 4).

    python bench/appender.py [--transactions N] [--bootstrap HOST:PORT] [--sizes 1,10,100] [--profile]

For each shape and batch size (events per transaction) it runs ``TransactionalAppender.checkpoint()`` back to back,
each transaction carrying an input offset with a real consumer group's metadata (KIP-447), and a bare
confluent-kafka transactional producer doing the same work — the same records (the appender's own encoded bytes,
batch-id header included), the same offsets, the same client settings (``producer_config``, docs/design.md §3) — in the
same process, interleaved in blocks so machine noise hits both. It prints events/s and commit latency p50/p99 for
each, the ratio (settled events/s ÷ bare events/s; goal ≥ 0.8), the durability class, and the versions.

Shapes (both are canonical batches encoded with ``settled.schemas.Codec``):

* ``1 conv x N events``: one `LogBatch` of one conversation holding N ``ModelResponseDelta`` events (a streamed model
  response), chained batch after batch; one log record per transaction, deciding one inbox input.
* ``N convs x 1 event``: N one-event batches of N different conversations (group commit of admissions): each a
  ``SubmissionAdmitted`` carrying its input offset plus its ``Receipt`` on ``settled.receipts``; 2N records per
  transaction, deciding N inputs.

Everything runs in a fresh namespace (one partition per topic) whose topics and consumer groups are deleted at the
end. Exit status 0 unless the measurement itself failed: the ratio is a figure, not a gate.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/appender.py
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BrokerInfo,
    client_versions,
    delete_namespace,
    describe_broker,
    fresh_namespace,
    load_average,
    percentile,
    resolve_bootstrap,
    table,
    use_dev_timeouts,
)

from settled._settings import Settings
from settled.producers import (
    BATCH_ID_HEADER,
    AppendBatch,
    OutRecord,
    TransactionalAppender,
    consumer_config,
    producer_config,
    read_partition,
)
from settled.producers._topics import provision_topics
from settled.schemas import (
    SCHEMA_VERSION,
    Codec,
    DeltaKind,
    InputRef,
    LogBatch,
    ModelResponseDelta,
    Receipt,
    ReceiptOutcome,
    RequestKind,
    SubmissionAdmitted,
    canonical_json,
    json_digest,
    verify_chain,
)

GOAL_RATIO = 0.8
SHAPE_ONE = "1 conv x N events"
SHAPE_MANY = "N convs x 1 event"
SHAPES = {"one": SHAPE_ONE, "many": SHAPE_MANY}
PARTITION = 0
DELTA_TEXT = "The quick brown fox jumps over the lazy dog. "  # ~45 bytes: a typical streamed text delta


class BenchmarkError(RuntimeError):
    """The measurement went wrong (an abort, a deferred batch, a missing commit): its numbers would be meaningless."""


# ------------------------------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Txn:
    """One transaction's work, encoded before the clock starts.

    Attributes:
        batches: What the appender's ``checkpoint`` gets.
        records: What the bare producer produces: ``(topic, key, value, headers)``, the appender's exact records.
        pending_inputs: Inbox offsets pending before the transaction (the inputs its batches decide).
        next_offset: The input offset the transaction commits.
        events: Canonical events in the transaction.
    """

    batches: tuple[AppendBatch, ...]
    records: tuple[tuple[str, bytes, bytes, list[tuple[str, str | bytes | None]]], ...]
    pending_inputs: tuple[int, ...]
    next_offset: int
    events: int


@dataclass
class _Chain:
    seq: int = 0
    digest: str | None = None


@dataclass
class WorkloadBuilder:
    """Builds chained, encoded canonical batches for one side (its own conversations, its own input offsets).

    Attributes:
        settings: The namespace (topic names).
        codec: Encodes the batches (single-object encoding by default).
        side: ``"s"`` (settled) or ``"b"`` (bare): prefixes the conversation ids, so each side's chains stay valid.
        next_input: Next inbox offset to hand out.
    """

    settings: Settings
    codec: Codec
    side: str
    next_input: int = 0
    _chains: dict[str, _Chain] = field(default_factory=dict)

    def build(self, shape: str, size: int, count: int) -> list[Txn]:
        """Return ``count`` transactions of ``size`` events each in ``shape``.

        Args:
            shape: `SHAPE_ONE` or `SHAPE_MANY`.
            size: Events per transaction.
            count: Number of transactions.

        Returns:
            The transactions, in order (their chains continue from the previous call's).
        """
        now = datetime.now(UTC)
        return [self._one(size, now) if shape == SHAPE_ONE else self._many(size, now) for _ in range(count)]

    def _seal(
        self, conversation: str, events: list[tuple[str, dict[str, Any]]], now: datetime, submission_id: str | None
    ) -> tuple[str, bytes]:
        chain = self._chains.setdefault(conversation, _Chain())
        first = chain.seq + 1
        batch_id = f"{conversation}:{first}"
        value, digest = self.codec.encode_batch_dict(
            {
                "batch_digest": "",
                "schema_version": SCHEMA_VERSION,
                "conversation_id": conversation,
                "submission_id": submission_id,
                "batch_id": batch_id,
                "first_event_seq": first,
                "last_event_seq": first + len(events) - 1,
                "owner_epoch": 1,
                "prev_batch_digest": chain.digest,
                "recorded_at": now,
                "events": events,
            }
        )
        chain.seq, chain.digest = first + len(events) - 1, digest
        return batch_id, value

    def _one(self, size: int, now: datetime) -> Txn:
        conversation = f"{self.side}-one{size}-conversation"
        submission_id = f"{conversation}-submission"
        deltas = [
            (
                ModelResponseDelta.AVRO_NAME,
                ModelResponseDelta(
                    submission_id=submission_id,
                    attempt_id=f"{submission_id}-a1",
                    response_ordinal=0,
                    delta_index=i,
                    kind=DeltaKind.TEXT,
                    text=DELTA_TEXT,
                ).to_avro(),
            )
            for i in range(size)
        ]
        batch_id, value = self._seal(conversation, deltas, now, submission_id)
        offset = self.next_input
        self.next_input += 1
        key = conversation.encode()
        batch = AppendBatch(
            batch_id, conversation, OutRecord(self.settings.topic("log"), key, value), inputs=frozenset({offset})
        )
        return _txn([batch], (offset,), offset + 1, size)

    def _many(self, size: int, now: datetime) -> Txn:
        batches = []
        offsets = []
        inbox = self.settings.topic("inbox")
        for j in range(size):
            conversation = f"{self.side}-many{size}-{j:03d}"
            offset = self.next_input
            self.next_input += 1
            submission_id = str(uuid.uuid4())
            seq = self._chains.get(conversation, _Chain()).seq + 1
            admitted = SubmissionAdmitted(
                submission_id=submission_id,
                conversation_id=conversation,
                principal="bench-principal",
                idempotency_key=str(uuid.uuid4()),
                payload_digest=json_digest(canonical_json({"n": offset})),
                submission_seq=seq,
                tools_offered=("search", "calculator"),
                input_json=canonical_json({"text": "What is the weather in Lisbon?"}),
                input_ref=InputRef(topic=inbox, partition=PARTITION, offset=offset),
            )
            batch_id, value = self._seal(conversation, [(admitted.AVRO_NAME, admitted.to_avro())], now, submission_id)
            receipt = Receipt(
                request_kind=RequestKind.SUBMISSION,
                request_id=submission_id,
                outcome=ReceiptOutcome.ADMITTED,
                submission_seq=seq,
                conversation_id=conversation,
                decided_at=now,
            )
            key = conversation.encode()
            batches.append(
                AppendBatch(
                    batch_id,
                    conversation,
                    OutRecord(self.settings.topic("log"), key, value),
                    side_records=(OutRecord(self.settings.topic("receipts"), key, self.codec.encode(receipt)),),
                    inputs=frozenset({offset}),
                )
            )
            offsets.append(offset)
        return _txn(batches, tuple(offsets), offsets[-1] + 1, size)


def _txn(batches: list[AppendBatch], pending: tuple[int, ...], next_offset: int, events: int) -> Txn:
    records = tuple(
        (r.topic, r.key, r.value, list[tuple[str, str | bytes | None]](r.headers)) for b in batches for r in b.records
    )
    return Txn(tuple(batches), records, pending, next_offset, events)


# ------------------------------------------------------------------------------------------------- the two sides


@dataclass
class Cell:
    """Measurements of one (shape, size, side).

    Attributes:
        latencies_s: Per-transaction commit latency, in seconds.
        events: Events committed.
        records: Records produced.
    """

    latencies_s: list[float] = field(default_factory=list)
    events: int = 0
    records: int = 0

    def events_per_s(self) -> float:
        """Events committed per second of back-to-back transactions."""
        return self.events / sum(self.latencies_s)

    def ms(self, q: float) -> float:
        """Latency percentile ``q``, in milliseconds."""
        return percentile(self.latencies_s, q) * 1000


class SettledSide:
    """The appender, driven as a partition owner drives it."""

    name = "settled"

    def __init__(self, appender: TransactionalAppender) -> None:
        """Wrap an opened appender.

        Args:
            appender: The partition's appender, after ``open()``.
        """
        self.appender = appender

    def run(self, txn: Txn) -> float:
        """Checkpoint one transaction; return its latency in seconds.

        Raises:
            BenchmarkError: The checkpoint did not commit everything in exactly one transaction.
        """
        start = time.perf_counter()
        result = self.appender.checkpoint(txn.batches, txn.pending_inputs, txn.next_offset)
        elapsed = time.perf_counter() - start
        if result.transactions != 1 or result.aborts or result.deferred or len(result.committed) != len(txn.batches):
            raise BenchmarkError(
                f"checkpoint did not commit cleanly: {result.transactions} transactions, {result.aborts} aborts, "
                f"{len(result.deferred)} deferred, {len(result.committed)}/{len(txn.batches)} committed"
            )
        if result.input_offset != txn.next_offset:
            raise BenchmarkError(f"checkpoint committed input offset {result.input_offset}, not {txn.next_offset}")
        return elapsed


class BareSide:
    """A bare confluent-kafka transactional producer: begin, produce, (flush,) send offsets, commit.

    Two variants run as baselines: the idiomatic one (no flush: ``commit_transaction`` flushes) and one that
    flushes before sending the offsets, the appender's own call order (docs/design.md §3's step 3 flushes so that a
    delivery error is pinned on its batch). Which is faster depends on the batch: the flush delays
    ``AddOffsetsToTxn`` past the coordinator's marker writes of the previous commit (fewer ``CONCURRENT_TRANSACTIONS``
    retries, each costing ``retry.backoff.ms``), but serializes produce and offsets.
    """

    def __init__(self, producer: Producer, consumer: Consumer, input_topic: str, timeout_s: float, flush: bool) -> None:
        """Wrap an initialised transactional producer.

        Args:
            producer: After ``init_transactions``.
            consumer: Its group consumer (for ``consumer_group_metadata``).
            input_topic: The inbox topic whose offset each transaction commits.
            timeout_s: Bound on each blocking call, in seconds.
            flush: Flush before sending the offsets (the appender's call order).
        """
        self.producer = producer
        self.consumer = consumer
        self.input_topic = input_topic
        self.timeout_s = timeout_s
        self.flush = flush
        self.name = "bare+flush" if flush else "bare"

    def run(self, txn: Txn) -> float:
        """Produce, send the offset and commit one transaction; return its latency in seconds.

        Raises:
            BenchmarkError: The flush did not deliver every record within the timeout.
        """
        producer = self.producer
        start = time.perf_counter()
        producer.begin_transaction()
        for topic, key, value, headers in txn.records:
            producer.produce(topic, value=value, key=key, partition=PARTITION, headers=headers)
        if self.flush and producer.flush(self.timeout_s):
            raise BenchmarkError(f"bare+flush: records not delivered within {self.timeout_s} s")
        offsets = [TopicPartition(self.input_topic, PARTITION, txn.next_offset)]
        producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), self.timeout_s)
        producer.commit_transaction(self.timeout_s)
        return time.perf_counter() - start


Side = SettledSide | BareSide


def _no_poison(run: tuple[AppendBatch, ...], reason: str) -> tuple[AppendBatch, ...]:
    raise BenchmarkError(f"the benchmark's batches must never need replacing: {reason}")


def _joined_consumer(settings: Settings, group_id: str, timeout_s: float) -> Consumer:
    """Return a consumer in ``group_id`` subscribed to the inbox, once it holds its assignment (real metadata)."""
    assigned: list[TopicPartition] = []
    consumer = Consumer(consumer_config(settings, group_id))
    consumer.subscribe([settings.topic("inbox")], on_assign=lambda _c, parts: assigned.extend(parts))
    deadline = time.monotonic() + timeout_s
    while not assigned:
        if time.monotonic() > deadline:
            consumer.close()
            raise BenchmarkError(f"consumer group {group_id} got no assignment within {timeout_s} s")
        consumer.poll(0.1)
    return consumer


def measure(
    sides: Sequence[tuple[Side, list[Txn]]], warmup: int, block: int, between: Callable[[], None]
) -> list[Cell]:
    """Run each side's transactions, interleaved in blocks with alternating order; the first ``warmup`` unmeasured.

    Args:
        sides: Each side with its transactions (the same count for every side).
        warmup: Leading transactions of each side not measured.
        block: Transactions per side per turn.
        between: Called between blocks (serves the group consumers, as a worker's poll would).

    Returns:
        One cell per side, in ``sides`` order.
    """
    cells = [Cell() for _ in sides]
    for side, txns in sides:
        for txn in txns[:warmup]:
            side.run(txn)
    count = len(sides[0][1])
    order = list(range(len(sides)))
    for start in range(warmup, count, block):
        for i in order:
            side, txns = sides[i]
            for txn in txns[start : start + block]:
                cells[i].latencies_s.append(side.run(txn))
                cells[i].events += txn.events
                cells[i].records += len(txn.records)
            between()
        order = order[1:] + order[:1]  # each side goes first, second, third in turn
    return cells


@dataclass(frozen=True)
class LogCheck:
    """What read_committed readers of the log see after the run.

    Attributes:
        visible: Batches per side prefix (``"s"``, ``"b"``, ``"f"``), counted by their batch-id header.
        chains_verified: Sampled conversations whose hash chain `verify_chain` accepted.
        batches_verified: Batches in those chains.
    """

    visible: dict[str, int]
    chains_verified: int
    batches_verified: int


def _check_log(settings: Settings, codec: Codec, sides: Sequence[str], sample: set[str]) -> LogCheck:
    """Count each side's visible batches and verify the hash chain of the ``sample`` conversations.

    Raises:
        ChainBreakError: A sampled conversation's chain is broken (the benchmark wrote invalid batches).
    """
    counts = dict.fromkeys(sides, 0)
    chains: dict[str, list[tuple[int, LogBatch]]] = {}
    log = settings.topic("log")
    for msg in read_partition(settings, log, PARTITION, 0, 120.0):
        headers = msg.headers() or []
        pairs = headers.items() if isinstance(headers, dict) else headers
        for key, value in pairs:
            if key != BATCH_ID_HEADER or not isinstance(value, bytes):
                continue
            batch_id = value.decode()
            prefix = batch_id.split("-", 1)[0]
            if prefix in counts:
                counts[prefix] += 1
            conversation = batch_id.rsplit(":", 1)[0]
            offset, raw = msg.offset(), msg.value()
            if conversation in sample and offset is not None and raw is not None:
                entry = codec.decode_batch(raw, topic=log, partition=PARTITION, offset=offset)
                chains.setdefault(conversation, []).append((offset, entry.batch))
    for chain in chains.values():
        verify_chain(chain)
    return LogCheck(counts, len(chains), sum(len(c) for c in chains.values()))


# ------------------------------------------------------------------------------------------------- main


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--transactions", type=int, default=300, help="measured transactions per side per cell")
    parser.add_argument("--warmup", type=int, default=20, help="unmeasured transactions per side per cell")
    parser.add_argument("--block", type=int, default=10, help="transactions per side before switching sides")
    parser.add_argument("--sizes", default="1,10,100", help="events per transaction, comma-separated")
    parser.add_argument("--shapes", default="one,many", help="'one' (1 conv x N events), 'many' (N convs x 1 event)")
    parser.add_argument(
        "--bootstrap",
        default=None,
        help="bootstrap servers (default: SETTLED_KAFKA_BOOTSTRAP or the dev stack's broker)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after measuring, profile extra settled checkpoints "
        "of the largest size with pyinstrument and print where the time goes",
    )
    parser.add_argument("--keep", action="store_true", help="keep the namespace's topics (default: delete them)")
    args = parser.parse_args(argv)
    args.size_list = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not args.size_list or any(s < 1 for s in args.size_list):
        parser.error(f"--sizes must list positive integers, got {args.sizes!r}")
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown or not shapes:
        parser.error(f"--shapes: unknown shape(s) {unknown or shapes}; known: {', '.join(SHAPES)}")
    args.shape_list = [SHAPES[s] for s in shapes]
    for name in ("transactions", "warmup", "block"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    return args


_SIDES = (("s", "settled"), ("b", "bare"), ("f", "bare+flush"))  # conversation-id prefix, name


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its table; return 0 (the ratio is reported, not enforced).

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status.

    Raises:
        BenchmarkError: The measurement failed (an abort, a missing commit, no group assignment).
    """
    args = _parse(argv)
    use_dev_timeouts()  # printed with the results; spawned children inherit them
    wall_start = time.monotonic()
    load_before = load_average()
    bootstrap, source = resolve_bootstrap(args.bootstrap)
    namespace = fresh_namespace("bench-appender")
    settings = Settings(namespace=namespace, partitions=1, kafka_bootstrap=bootstrap)
    codec = Codec()
    timeout_s = settings.kafka_call_timeout_s
    print(f"broker {bootstrap} ({source}); namespace {namespace}", file=sys.stderr, flush=True)

    # One consumer group per side, each with a member holding the inbox partition: real KIP-447 metadata. The
    # settled side's group is the worker's (settled.processors.Worker.group_id).
    groups = {
        "s": f"{namespace}.{settings.app_id}.workers",
        "b": f"{namespace}.bare.workers",
        "f": f"{namespace}.bare-flush.workers",
    }
    consumers: dict[str, Consumer] = {}
    appender: TransactionalAppender | None = None
    results: list[tuple[str, int, dict[str, Cell]]] = []
    check = LogCheck({}, 0, 0)
    expected = dict.fromkeys(groups, 0)
    profile_text = ""
    try:
        provision_topics(settings, codec, datetime.now(UTC))
        for key, group in groups.items():
            consumers[key] = _joined_consumer(settings, group, 30.0)

        appender = TransactionalAppender(
            settings=settings,
            partition=PARTITION,
            input_topic=settings.topic("inbox"),
            group_metadata=consumers["s"].consumer_group_metadata,
            replace_poison=_no_poison,
        )
        appender.open()
        sides: dict[str, Side] = {"s": SettledSide(appender)}
        for key, flush in (("b", False), ("f", True)):
            tid = f"{groups[key]}.{settings.topic('log')}.{PARTITION}"
            producer = Producer(producer_config(settings, transactional_id=tid))
            producer.init_transactions(timeout_s)
            sides[key] = BareSide(producer, consumers[key], settings.topic("inbox"), timeout_s, flush)
        builders = {key: WorkloadBuilder(settings, codec, key) for key in groups}

        def serve_consumers() -> None:
            for c in consumers.values():
                c.poll(0)

        per_cell = args.warmup + args.transactions
        for shape in args.shape_list:
            for size in args.size_list:
                work = {key: builders[key].build(shape, size, per_cell) for key, _ in _SIDES}
                cells = measure(
                    [(sides[key], work[key]) for key, _ in _SIDES], args.warmup, args.block, serve_consumers
                )
                for key, _ in _SIDES:
                    expected[key] += sum(len(t.batches) for t in work[key])
                by_key = {key: cell for (key, _), cell in zip(_SIDES, cells, strict=True)}
                results.append((shape, size, by_key))
                print(
                    f"  {shape:<18} N={size:<4} "
                    + "  ".join(f"{name} {by_key[key].events_per_s():>8,.0f} ev/s" for key, name in _SIDES),
                    file=sys.stderr,
                    flush=True,
                )

        if args.profile:
            size = max(args.size_list)
            profile_text = _profile(sides["s"], builders["s"], args.shape_list, size, args.transactions)
            expected["s"] += sum(args.transactions * (size if shape == SHAPE_MANY else 1) for shape in args.shape_list)
        sample = {f"s-one{n}-conversation" for n in args.size_list} | {f"s-many{n}-000" for n in args.size_list}
        check = _check_log(settings, codec, list(groups), sample)
        info = describe_broker(bootstrap, settings.topic("log"))
    finally:
        for c in consumers.values():
            c.close()
        if appender is not None:
            appender.close()
        if not args.keep:
            try:
                delete_namespace(settings, groups.values())
            except Exception as exc:  # noqa: BLE001 - reported; the numbers measured stay valid
                print(f"warning: could not delete namespace {namespace}: {exc!r}", file=sys.stderr)

    _report(args, results, info, settings, check, expected, load_before, wall_start)
    if profile_text:
        print("\n" + profile_text)
    if any(check.visible.get(k) != v for k, v in expected.items()):
        raise BenchmarkError(f"read_committed sees {check.visible}, expected {expected}: the numbers are not valid")
    return 0


def _report(
    args: argparse.Namespace,
    results: list[tuple[str, int, dict[str, Cell]]],
    info: BrokerInfo,
    settings: Settings,
    check: LogCheck,
    expected: dict[str, int],
    load_before: str,
    wall_start: float,
) -> None:
    rows = []
    for shape, size, cells in results:
        settled, bare, flushed = cells["s"], cells["b"], cells["f"]
        best = max(bare.events_per_s(), flushed.events_per_s())
        ratio = settled.events_per_s() / best
        rows.append(
            [
                shape,
                str(size),
                str(settled.records // len(settled.latencies_s)),
                *(
                    text
                    for cell in (settled, bare, flushed)
                    for text in (f"{cell.events_per_s():,.0f}", f"{cell.ms(50):.2f}", f"{cell.ms(99):.2f}")
                ),
                f"{settled.events_per_s() / bare.events_per_s():.2f}",
                f"{settled.events_per_s() / flushed.events_per_s():.2f}",
                f"{ratio:.2f}",
                "yes" if ratio >= GOAL_RATIO else "NO",
            ]
        )
    headers = [
        "shape",
        "N",
        "rec/txn",
        "settled ev/s",
        "p50 ms",
        "p99 ms",
        "bare ev/s",
        "p50 ms",
        "p99 ms",
        "bare+flush ev/s",
        "p50 ms",
        "p99 ms",
        "vs bare",
        "vs +flush",
        "ratio",
        f">= {GOAL_RATIO}",
    ]
    print(
        f"\nAppender vs bare transactional producer: {args.transactions} measured + {args.warmup} warm-up "
        f"transactions per side per row, sides interleaved in blocks of {args.block}. Latency = one checkpoint() / "
        "one begin..commit, input offset included; N = events per transaction.\n"
    )
    print(table(headers, rows))
    met = sum(1 for r in rows if r[-1] == "yes")
    print(
        f"\nratio = settled events/s / the faster bare baseline's events/s; goal >= {GOAL_RATIO}: met in {met} of "
        f"{len(rows)} rows"
    )
    print(f"durability class: {info.durability_class()}")
    print(f"client: {client_versions()}; broker: {info.version}; Kafka timeouts: {Settings().timeouts_label()}")
    conf = producer_config(settings, transactional_id="x")
    keys = (
        "linger.ms",
        "retry.backoff.ms",
        "retry.backoff.max.ms",
        "acks",
        "enable.idempotence",
        "transaction.timeout.ms",
        "partitioner",
    )
    print(
        "client settings (every side: settled.producers.producer_config): " + ", ".join(f"{k}={conf[k]}" for k in keys)
    )
    ok = all(check.visible.get(k) == v for k, v in expected.items())
    counts = ", ".join(f"{name} {check.visible.get(key)}/{expected[key]}" for key, name in _SIDES)
    print(
        f"batches visible to read_committed: {counts} ({'all there' if ok else 'MISMATCH'}); hash chains verified: "
        f"{check.chains_verified} sampled settled conversations, {check.batches_verified} batches"
    )
    print(
        f"machine: {load_before} before, {load_average()} after; wall time {time.monotonic() - wall_start:.0f} s; "
        f"python {sys.version.split()[0]}"
    )


def _profile(settled: Side, builder: WorkloadBuilder, shapes: Sequence[str], size: int, count: int) -> str:
    try:
        from pyinstrument import Profiler
    except ImportError as exc:
        raise BenchmarkError("--profile needs pyinstrument: .venv/bin/pip install pyinstrument") from exc
    out = []
    for shape in shapes:
        txns = builder.build(shape, size, count)
        profiler = Profiler(interval=0.0005)
        profiler.start()
        for txn in txns:
            settled.run(txn)
        profiler.stop()
        out.append(
            f"--- pyinstrument: {count} settled checkpoints, {shape}, N={size} ---\n"
            + profiler.output_text(unicode=False, color=False, show_all=False)
        )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
