"""Benchmark: projection rebuild events/s for 100k and 1M canonical events, and live projection lag (issue 7).

    python bench/rebuild.py [--events 100k,1M] [--partitions 6] [--conversations N] [--deltas 8]
                            [--lag-clients 10,100] [--lag-submissions 1000] [--no-lag] [--check] [--profile]
                            [--bootstrap HOST:PORT] [--keep]

**Rebuild.** For each size it fills a fresh namespace's ``settled.log`` (several partitions, many conversations)
with a realistic mix of canonical batches, written the way the worker and the execution engine write them: the
protocol's own decisions (`settled.protocol.admit`, `start_attempt`, `terminalize`, `abort`, `claim`, `classify`)
for admissions (with re-sent duplicates and key conflicts), attempt starts, aborts, settlements and the recovery after
an ownership change, and the engine's records (model responses with streamed text deltas, tool calls prepared and
settled — some with a tool error — and recorded steps), each batch sealed (`LogBatch.seal`) and encoded with the
codec, chained per conversation, folded as it is generated (so the log is one a correct owner writes), and appended
with a transactional producer in large transactions together with the receipts and settlements the worker emits.
Halfway through each partition a second worker claims it (every running attempt goes to recovery and is resumed).

Then, per size, three readings of the same partitions from offset 0 to their end:

* **consume**: a bare read_committed assign-only consumer, no decoding (the floor: what Kafka and librdkafka cost);
* **consume + decode**: the same, decoding every record into `LogBatch` models (`FastBatchDecoder`);
* **rebuild**: `settled.projections.rebuild` end to end into a fresh Postgres schema version, including the
  switch (`settled projections rebuild`), with its own breakdown of where the time went (consume, decode, fold,
  row building, Postgres write, switch; `RebuildResult.timings`).

It prints events/s and batches/s for each, the rebuild's ratio to both baselines, row counts checked against what
the generator wrote, and (``--check``) `settled projections check` (live = rebuild = reference fold).

**Live lag.** The admission benchmark's load (``bench/worker.py``: the echo agent in a real worker child process,
N client threads submitting through one `settled.client.Client`) runs against a fresh namespace while a live
projector child (``settled projections run``) projects it. The benchmark reads the log with a prompt read_committed
consumer (each record's append time: its ``LogAppendTime`` timestamp, and when it became readable) and listens on
the projection's ``NOTIFY`` channel (each commit's next offset); a record's lag is the time its row became visible in
Postgres minus its append time (and, second column, minus the time it became readable in Kafka: the projector's
own share). p50/p99 per client count.

Everything runs in fresh namespaces and schemas, deleted at the end unless ``--keep``. It prints the durability
class, the client and broker versions and the machine's load. Exit status 0 unless the measurement itself failed
(the target is a figure, not a gate).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout: python bench/rebuild.py
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
    partition_for_key,
    producer_config,
    provision_topics,
    read_partition,
    reader_config,
)
from settled.producers._topics import genesis_conversation
from settled.projections import (
    TABLES,
    ProjectionNames,
    RebuildResult,
    check,
    read_offsets,
    rebuild,
)
from settled.protocol import (
    ConversationState,
    Decision,
    OpenCall,
    PartitionState,
    RecoveryAction,
    RecoverySnapshot,
    SubmissionState,
    ToolSafety,
    abort,
    admit,
    apply,
    claim,
    classify,
    start_attempt,
    terminalize,
)
from settled.schemas import (
    SCHEMA_VERSION,
    AbortRecorded,
    AbortRequested,
    AttemptStarted,
    Codec,
    DeclaredToolCall,
    DeltaKind,
    FastBatchDecoder,
    InputRef,
    LogBatch,
    LogEvent,
    ModelResponseCompleted,
    ModelResponseDelta,
    Settlement,
    SettlementOutcome,
    StepRecorded,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionPayload,
    SubmissionProposed,
    SubmissionRejected,
    ToolCallPrepared,
    ToolCallSettled,
    ToolError,
    Usage,
    canonical_json,
    json_digest,
    payload_digest,
)

S = SubmissionState
TARGET_EVENTS_PER_S = 50_000
PRINCIPAL = "bench-principal"
TOOLS = ("search", "weather", "calculator", "calendar")
WORDS = "the quick brown fox jumps over the lazy dog while settled keeps every turn exactly once".split()


_ROWS_OF: dict[type[Any], tuple[str, ...]] = {
    # event type → the tables that get exactly one row per such event in this workload (no command applied twice)
    SubmissionAdmitted: ("submissions", "receipts", "transcript"),
    SubmissionDuplicate: ("receipts",),
    SubmissionRejected: ("receipts",),
    AbortRecorded: ("receipts", "transcript"),
    AttemptStarted: ("attempts",),
    ModelResponseCompleted: ("transcript",),
    ToolCallPrepared: ("transcript",),
    ToolCallSettled: ("transcript",),
    StepRecorded: ("transcript",),
    Settlement: ("settlements", "transcript"),
}


class BenchmarkError(RuntimeError):
    """The measurement went wrong (a missing record, a row count that differs): its numbers would be meaningless."""


# ------------------------------------------------------------------------------------------------- workload


@dataclass
class Mix:
    """The workload's proportions (per turn unless said otherwise).

    Attributes:
        deltas: Mean text deltas streamed with a final response (recorded with it: ``delta_flush_every`` = 16).
        max_tools: Tool calls per turn are uniform in 0..max_tools.
        tool_error: Share of tool calls settling with a tool error.
        step: Share of turns recording a step (`StepRecorded`).
        duplicate: Share of admissions re-sent (a `SubmissionDuplicate` batch).
        conflict: Share of admissions re-sent with another payload (a rejection).
        abort: Share of turns aborted while running.
        queued: Share of turns whose next submission is admitted while this one runs (queue depth 2).
    """

    deltas: int = 8
    max_tools: int = 3
    tool_error: float = 0.05
    step: float = 0.1
    duplicate: float = 0.05
    conflict: float = 0.01
    abort: float = 0.02
    queued: float = 0.2


@dataclass
class _Out:
    """One batch ready to append: the log record and its side records."""

    partition: int
    conversation_id: str
    batch_id: str
    value: bytes
    events: int
    side: list[tuple[str, bytes]]


class PartitionWriter:
    """Generates one log partition's canonical batches with the protocol's decisions (module doc).

    Attributes:
        settings: The namespace.
        partition: The log partition.
        codec: Encodes batches and side records.
        mix: The proportions.
        rng: Seeded randomness (the log is reproducible per seed).
    """

    def __init__(
        self,
        settings: Settings,
        partition: int,
        codec: Codec,
        mix: Mix,
        seed: int,
        conversations: list[str],
        genesis: LogBatch,
        start: datetime,
    ) -> None:
        """Set up a partition whose log holds its genesis batch.

        Args:
            settings: The namespace.
            partition: The log partition.
            codec: The codec.
            mix: The proportions.
            seed: Seeds the randomness.
            conversations: The conversation ids that land on this partition.
            genesis: The partition's genesis batch (already in the log).
            start: The first batch's ``recorded_at``.
        """
        self.settings = settings
        self.partition = partition
        self.codec = codec
        self.mix = mix
        self.rng = random.Random(seed)
        folded = apply(PartitionState(partition=partition), genesis)
        self.head = folded
        self.convs: dict[str, ConversationState] = dict(folded.conversations)
        self.heads = {genesis.conversation_id: (genesis.last_event_seq, genesis.batch_digest)}
        self.clock = start
        self.inbox_offset = 0
        self.events = 0
        self.batches = 0
        self.admitted = 0
        self.settled = 0
        self.rows: dict[str, int] = {}  # rows the projection must hold, counted from the events appended
        self.calls: set[tuple[str, str]] = set()
        self.worker = "worker-a"
        self.scripts = {cid: self._conversation(cid) for cid in conversations}
        self.log_topic = settings.topic("log")
        self.receipts_topic = settings.topic("receipts")
        self.settlements_topic = settings.topic("settlements")
        self.inbox = settings.topic("inbox")

    # -- the log ---------------------------------------------------------------------------------------------------

    def now(self) -> datetime:
        self.clock += timedelta(milliseconds=self.rng.randint(1, 4))
        return self.clock

    def conv(self, cid: str) -> ConversationState:
        found = self.convs.get(cid)
        if found is None:
            return ConversationState(conversation_id=cid, owner_epoch=self.head.claim_epoch)
        return found

    def _partition(self, convs: dict[str, ConversationState], head: PartitionState | None = None) -> PartitionState:
        head = self.head if head is None else head
        return PartitionState(
            partition=self.partition,
            conversations=convs,
            claim_epoch=head.claim_epoch,
            claimed_by=head.claimed_by,
            partition_count=head.partition_count,
            quarantined_inputs=head.quarantined_inputs,
        )

    def append(self, cid: str, decision: Decision | Sequence[LogEvent], epoch: int | None = None) -> _Out:
        """Seal, fold and encode one batch of ``cid`` (as `settled.processors` does)."""
        if isinstance(decision, Decision):
            events, sub_id = decision.events, decision.submission_id
            side = [(self.receipts_topic, self.codec.encode(r)) for r in (decision.receipt,) if r is not None]
            side += [(self.settlements_topic, self.codec.encode(r)) for r in (decision.settlement,) if r is not None]
        else:
            events, side = tuple(decision), []
            sub_id = getattr(events[0], "submission_id", None)
        seq, prev = self.heads.get(cid, (0, None))
        fields: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "conversation_id": cid,
            "submission_id": sub_id,
            "batch_id": f"{cid}:{seq + 1}",
            "first_event_seq": seq + 1,
            "last_event_seq": seq + len(events),
            "owner_epoch": self.head.claim_epoch if epoch is None else epoch,
            "prev_batch_digest": prev,
            "recorded_at": self.now(),
        }
        # LogBatch.seal + Codec.encode, in one pass: the same bytes (the events are validated models already).
        value, digest = self.codec.encode_batch_dict(
            {"batch_digest": "", **fields, "events": [(e.AVRO_NAME, e.to_avro()) for e in events]}
        )
        batch = LogBatch.model_construct(batch_digest=digest, **fields, events=tuple(events))
        if cid.startswith("~"):  # genesis or a claim: the whole partition
            folded = apply(self._partition(self.convs), batch)
            self.convs = dict(folded.conversations)
            self.head = self._partition({}, folded)
        else:  # one conversation, folded alone (as the projection does)
            self.convs[cid] = apply(self._partition({cid: self.conv(cid)}), batch).conversations[cid]
        self.heads[cid] = (batch.last_event_seq, batch.batch_digest)
        self.events += len(events)
        self.batches += 1
        for event in events:
            for name in _ROWS_OF.get(type(event), ()):
                self.rows[name] = self.rows.get(name, 0) + 1
            if isinstance(event, ToolCallPrepared):
                self.calls.add((event.submission_id, event.call_id))
        return _Out(self.partition, cid, batch.batch_id, value, len(events), side)

    def claim(self, worker: str) -> _Out:
        """A worker claims the partition: `OwnershipClaimed` at the next epoch (docs/design.md §3)."""
        self.worker = worker
        event = claim(self.head, worker, self.now())
        return self.append(genesis_conversation(self.partition), [event], epoch=event.owner_epoch)

    def input_ref(self) -> InputRef:
        self.inbox_offset += 1
        return InputRef(topic=self.inbox, partition=self.partition, offset=self.inbox_offset)

    # -- one conversation ------------------------------------------------------------------------------------------

    def _conversation(self, cid: str) -> Iterator[_Out]:
        """Turns of one conversation, forever (the caller stops when the partition has enough events)."""
        n = 0
        queued: str | None = None
        while True:
            n += 1
            sid = queued if queued is not None else (yield from self._admit(cid, n))
            queued = yield from self._run(cid, sid, n, queue_next=self.rng.random() < self.mix.queued)

    def _proposal(self, cid: str, n: int, key: str, text: str) -> SubmissionProposed:
        payload = SubmissionPayload(
            input_json=canonical_json({"role": "user", "text": text}),
            tools_offered=TOOLS[: self.rng.randint(1, len(TOOLS))],
        )
        return SubmissionProposed(
            submission_id=str(uuid.UUID(int=self.rng.getrandbits(128))),
            principal=PRINCIPAL,
            conversation_id=cid,
            idempotency_key=key,
            payload=payload,
            payload_digest=payload_digest(payload),
            proposed_at=self.clock,
        )

    def _admit(self, cid: str, n: int) -> Generator[_Out, None, str]:
        key = f"{cid}/turn-{n}"
        text = " ".join(self.rng.choices(WORDS, k=self.rng.randint(5, 30)))
        proposal = self._proposal(cid, n, key, text)
        decision = admit(self.conv(cid), proposal, self.input_ref(), self.now())
        yield self.append(cid, decision)
        self.admitted += 1
        if self.rng.random() < self.mix.duplicate:  # the client re-sent it (a lost receipt): same key, same payload
            again = proposal.model_copy(update={"submission_id": str(uuid.UUID(int=self.rng.getrandbits(128)))})
            yield self.append(cid, admit(self.conv(cid), again, self.input_ref(), self.now()))
        if self.rng.random() < self.mix.conflict:  # same key, another payload: rejected naming the key
            other = self._proposal(cid, n, key, text + " (edited)")
            yield self.append(cid, admit(self.conv(cid), other, self.input_ref(), self.now()))
        return proposal.submission_id

    def _run(self, cid: str, sid: str, n: int, *, queue_next: bool) -> Generator[_Out, None, str | None]:
        """One submission from its first attempt to its settlement, as the engine records it.

        Returns (as the generator's value) the next turn's submission when it was admitted while this one ran.
        """
        rng, mix = self.rng, self.mix
        tools = rng.randint(0, mix.max_tools)
        steps: list[tuple[str, int]] = [("response", 0)]
        for k in range(tools):
            steps += [("prepare", k), ("settle", k)]
        if rng.random() < mix.step:
            steps.append(("step", 0))
        steps += [("final", 0), ("settlement", 0)]
        aborted_at = rng.randrange(1, len(steps)) if rng.random() < mix.abort else None
        queue_at = rng.randrange(0, len(steps)) if queue_next else None
        calls = [(f"{sid}#{k + 1}", rng.choice(TOOLS)) for k in range(tools)]
        queued: str | None = None
        attempt_id = yield from self._start(cid, sid)
        i = 0
        while i < len(steps):
            sub = self.conv(cid).submissions[sid]
            if sub.state is S.RECOVERY:  # a new owner claimed the partition while this attempt ran
                i = yield from self._recover(cid, sid, steps, i)
                attempt_id = yield from self._start(cid, sid)
                continue
            if queue_at == i:
                queued = yield from self._admit(cid, n + 1)
                queue_at = None
                continue
            if aborted_at == i:
                command = AbortRequested(
                    command_id=str(uuid.UUID(int=rng.getrandbits(128))),
                    principal=PRINCIPAL,
                    conversation_id=cid,
                    submission_id=sid,
                    reason="user cancelled",
                    requested_at=self.clock,
                )
                yield self.append(cid, abort(self.conv(cid), command, self.input_ref(), self.now()))
                if self.conv(cid).submissions[sid].state is S.RECOVERY:  # claimed in between: recovery terminalizes
                    yield from self._recover(cid, sid, steps, i)
                yield self.append(cid, terminalize(self.conv(cid), sid, SettlementOutcome.ABORTED, self.now()))
                self.settled += 1
                return queued
            kind, k = steps[i]
            ordinal = i + 1
            if kind == "response":
                declared = tuple(
                    DeclaredToolCall(call_id=call_id, tool=tool, args_json=args, args_digest=json_digest(args))
                    for call_id, tool in calls
                    for args in (_args(random.Random(call_id), tool),)
                )
                yield self.append(cid, self._response(sid, attempt_id, ordinal, "", declared, deltas=rng.randint(0, 2)))
            elif kind == "prepare":
                call_id, tool = calls[k]
                args = _args(random.Random(call_id), tool)
                prepared = ToolCallPrepared(
                    submission_id=sid,
                    run_id=sid,
                    attempt_id=attempt_id,
                    call_id=call_id,
                    ordinal=ordinal,
                    tool=tool,
                    args_json=args,
                    args_digest=json_digest(args),
                    idempotency_key=json_digest(canonical_json([sid, ordinal, args])),
                    owner_epoch=self.head.claim_epoch,
                )
                yield self.append(cid, [prepared])
            elif kind == "settle":
                call_id, tool = calls[k]
                if rng.random() < mix.tool_error:
                    result = ToolCallSettled(
                        submission_id=sid,
                        attempt_id=attempt_id,
                        call_id=call_id,
                        error=ToolError(type="UpstreamTimeout", message=f"{tool} did not answer", non_retryable=False),
                    )
                else:
                    value = canonical_json({"tool": tool, "answer": " ".join(rng.choices(WORDS, k=12))})
                    result = ToolCallSettled(
                        submission_id=sid,
                        attempt_id=attempt_id,
                        call_id=call_id,
                        result_json=value,
                        result_digest=json_digest(value),
                    )
                yield self.append(cid, [result])
            elif kind == "step":
                value = canonical_json({"now": self.clock.isoformat()})
                step = StepRecorded(
                    submission_id=sid,
                    attempt_id=attempt_id,
                    name="clock",
                    version=1,
                    step_id=json_digest(canonical_json([sid, ordinal, "step", "clock"])),
                    ordinal=ordinal,
                    result_json=value,
                    result_digest=json_digest(value),
                )
                yield self.append(cid, [step])
            elif kind == "final":
                text = " ".join(rng.choices(WORDS, k=40))
                deltas = max(0, min(15, round(rng.gauss(mix.deltas, mix.deltas / 3)))) if mix.deltas else 0
                yield self.append(cid, self._response(sid, attempt_id, ordinal, text, (), deltas=deltas))
            else:
                reply = canonical_json({"text": " ".join(rng.choices(WORDS, k=20))})
                decision = terminalize(self.conv(cid), sid, SettlementOutcome.COMPLETED, self.now(), reply_json=reply)
                yield self.append(cid, decision)
                self.settled += 1
            i += 1
        return queued

    def _start(self, cid: str, sid: str) -> Generator[_Out, None, str]:
        attempt_id = str(uuid.UUID(int=self.rng.getrandbits(128)))
        yield self.append(cid, start_attempt(self.conv(cid), sid, attempt_id, self.head.claim_epoch))
        return attempt_id

    def _recover(self, cid: str, sid: str, steps: list[tuple[str, int]], i: int) -> Generator[_Out, None, int]:
        """The new owner's recovery of an attempt that was running (DUR-013): classify, record, resume."""
        sub = self.conv(cid).submissions[sid]
        calls = [OpenCall(call_id, "search", ToolSafety(idempotent=True)) for call_id in sub.open_calls]
        recovery = classify(RecoverySnapshot.of(sid, sub, calls, max_attempts=5))
        if recovery.action is not RecoveryAction.DECIDE:
            raise BenchmarkError(f"recovery of {sid} answered {recovery.action}: {recovery.reason}")
        yield self.append(cid, recovery.events)
        if sub.open_calls and i > 0 and steps[i - 1][0] == "prepare":
            return i - 1  # safe retry: the call is prepared again under the same key
        return i

    def _response(
        self, sid: str, attempt_id: str, ordinal: int, text: str, declared: tuple[DeclaredToolCall, ...], deltas: int
    ) -> list[LogEvent]:
        words = text.split() or ["ok"]
        out: list[LogEvent] = [
            ModelResponseDelta(
                submission_id=sid,
                attempt_id=attempt_id,
                response_ordinal=ordinal,
                delta_index=d,
                kind=DeltaKind.TEXT,
                text=" ".join(words[d * 3 : d * 3 + 3]) + " ",
            )
            for d in range(deltas)
        ]
        out.append(
            ModelResponseCompleted(
                submission_id=sid,
                attempt_id=attempt_id,
                response_ordinal=ordinal,
                provider="scripted",
                model="bench-model-1",
                request_id=f"req-{attempt_id[:8]}-{ordinal}",
                usage=Usage(input_tokens=self.rng.randint(200, 4000), output_tokens=self.rng.randint(10, 400)),
                text=text,
                tool_calls=declared,
            )
        )
        return out

    # -- driving ---------------------------------------------------------------------------------------------------

    def generate(self, events: int) -> Iterator[_Out]:
        """Yield batches until the partition holds at least ``events`` events (conversations interleaved).

        Args:
            events: Events to write into this partition (genesis excluded).

        Yields:
            The batches, in log order.
        """
        yield self.claim("worker-a")
        handed_over = False
        live = list(self.scripts)
        while self.events < events:
            if not handed_over and self.events >= events // 2:
                handed_over = True
                yield self.claim("worker-b")  # a second worker takes the partition over mid-flight
            cid = self.rng.choice(live)
            yield next(self.scripts[cid])


def _args(rng: random.Random, tool: str) -> str:
    return canonical_json({"tool": tool, "q": " ".join(rng.choices(WORDS, k=4)), "n": rng.randint(1, 99)})


# ------------------------------------------------------------------------------------------------- filling


@dataclass
class Filled:
    """What the fill wrote.

    Attributes:
        events: Canonical events appended (genesis batches excluded).
        batches: Log records appended (genesis excluded).
        admitted: Submissions admitted.
        settled: Submissions settled.
        generate_s: Seconds spent generating and encoding (summed over the fill processes).
        wall_s: Wall-clock seconds of the whole fill.
        transactions: Transactions committed.
        ends: The log's end offsets after the fill.
    """

    events: int = 0
    batches: int = 0
    admitted: int = 0
    settled: int = 0
    generate_s: float = 0.0
    wall_s: float = 0.0
    transactions: int = 0
    ends: dict[int, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)


def conversations_by_partition(count: int, partitions: int) -> dict[int, list[str]]:
    """Return ``count`` conversation ids grouped by the partition murmur2 gives their key (as the client routes).

    Args:
        count: Conversations.
        partitions: The log's partitions.

    Returns:
        Partition → conversation ids.
    """
    out: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for i in range(count):
        cid = f"bench-conv-{i:06d}"
        out[partition_for_key(cid.encode(), partitions)].append(cid)
    return out


def _genesis(settings: Settings, codec: Codec, partition: int) -> LogBatch:
    for msg in read_partition(settings, settings.topic("log"), partition, 0, settings.kafka_call_timeout_s):
        value, offset = msg.value(), msg.offset()
        if value is not None and offset is not None:
            return codec.decode_batch(value, topic=settings.topic("log"), partition=partition, offset=offset).batch
    raise BenchmarkError(f"{settings.topic('log')}[{partition}] has no genesis batch")


def _fill_partitions(
    settings: Settings,
    partitions: list[int],
    per_partition: int,
    conversations: dict[int, list[str]],
    mix: Mix,
    seed: int,
    txn_records: int,
    worker: int,
) -> Filled:
    """One fill process: generate and append its partitions' batches with one transactional producer."""
    codec = Codec()
    producer = Producer(
        producer_config(
            settings,
            transactional_id=f"{settings.namespace}.bench-fill.{worker}",
            **{"linger.ms": 20, "batch.size": 1_000_000, "transaction.timeout.ms": 120_000, "compression.type": "none"},
        )
    )
    timeout_s = 60.0
    producer.init_transactions(timeout_s)
    out = Filled()
    start = datetime.now(UTC) - timedelta(days=1)
    for p in partitions:
        genesis = _genesis(settings, codec, p)
        writer = PartitionWriter(settings, p, codec, mix, seed * 1000 + p, conversations[p], genesis, start)
        in_txn = 0
        producer.begin_transaction()
        t0 = time.perf_counter()
        for rec in writer.generate(per_partition):
            key = rec.conversation_id.encode()
            headers: list[tuple[str, str | bytes | None]] = [(BATCH_ID_HEADER, rec.batch_id.encode())]
            producer.produce(settings.topic("log"), value=rec.value, key=key, partition=p, headers=headers)
            for topic, value in rec.side:
                producer.produce(topic, value=value, key=key, partition=p)
            in_txn += 1 + len(rec.side)
            if in_txn >= txn_records:
                producer.commit_transaction(timeout_s)
                out.transactions += 1
                producer.begin_transaction()
                in_txn = 0
            producer.poll(0)
        producer.commit_transaction(timeout_s)
        out.transactions += 1
        out.generate_s += time.perf_counter() - t0
        out.events += writer.events
        out.batches += writer.batches
        out.admitted += writer.admitted
        out.settled += writer.settled
        for name, n in writer.rows.items():
            out.rows[name] = out.rows.get(name, 0) + n
        out.rows["tool_calls"] = out.rows.get("tool_calls", 0) + len(writer.calls)
    producer.flush(timeout_s)
    return out


def fill(settings: Settings, events: int, conversations: int, mix: Mix, seed: int, processes: int) -> Filled:
    """Create the namespace's topics (with their genesis batches) and append ``events`` canonical events.

    The partitions are split over ``processes`` fill processes (fork), each generating its partitions in turn.

    Args:
        settings: The fresh namespace and its partition count.
        events: Events to append in all (split evenly over the partitions).
        conversations: Conversations (each on the partition its key hashes to).
        mix: The proportions.
        seed: Seeds the generators.
        processes: Fill processes.

    Returns:
        What was written.
    """
    import multiprocessing

    wall = time.perf_counter()
    provision_topics(settings, Codec(), datetime.now(UTC))
    by_partition = conversations_by_partition(conversations, settings.partitions)
    per_partition = max(1, events // settings.partitions)
    groups = [list(range(settings.partitions))[k::processes] for k in range(processes)]
    args = [(settings, g, per_partition, by_partition, mix, seed, 20_000, k) for k, g in enumerate(groups) if g]
    if len(args) == 1:
        parts = [_fill_partitions(*args[0])]
    else:
        with multiprocessing.get_context("fork").Pool(len(args)) as pool:
            parts = pool.starmap(_fill_partitions, args)
    total = Filled()
    for part in parts:
        total.events += part.events
        total.batches += part.batches
        total.admitted += part.admitted
        total.settled += part.settled
        total.generate_s += part.generate_s
        total.transactions += part.transactions
        for name, n in part.rows.items():
            total.rows[name] = total.rows.get(name, 0) + n
    total.ends = log_end_offsets(settings)
    total.wall_s = time.perf_counter() - wall
    return total


def log_end_offsets(settings: Settings) -> dict[int, int]:
    """Return the log's read_committed end offset per partition."""
    from settled.projections import log_end_offsets as ends

    return ends(settings, settings.kafka_call_timeout_s)


# ------------------------------------------------------------------------------------------------- rebuild


@dataclass
class Reading:
    """One timed reading of the log (a baseline) or the rebuild.

    Attributes:
        name: What ran.
        records: Log records (batches) read.
        events: Canonical events in them.
        seconds: Wall-clock seconds.
    """

    name: str
    records: int
    events: int
    seconds: float

    @property
    def events_per_s(self) -> float:
        """Events per second."""
        return self.events / self.seconds

    @property
    def records_per_s(self) -> float:
        """Records (batches) per second."""
        return self.records / self.seconds


def _read_share(settings: Settings, partitions: list[int], ends: dict[int, int], decode: bool) -> tuple[int, int]:
    """Read some partitions from 0 to their end with a bare read_committed consumer; decode each record if asked."""
    topic = settings.topic("log")
    consumer = Consumer(reader_config(settings, f"{settings.namespace}.bench-read"))
    decoder = FastBatchDecoder(Codec()) if decode else None
    records = events = 0
    active = {p for p in partitions if ends.get(p, 0) > 0}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(active)])
        while active:
            for msg in consumer.consume(10_000, 0.2):
                if msg.error() is not None:
                    continue
                records += 1
                if decoder is not None:
                    p, offset = msg.partition(), msg.offset()
                    assert p is not None and offset is not None
                    events += len(decoder.decode(msg.value(), topic=topic, partition=p, offset=offset).events)
            for p in list(active):
                if consumer.position([TopicPartition(topic, p)])[0].offset >= ends[p]:
                    active.discard(p)
    finally:
        consumer.close()
    return records, events


def read_baseline(settings: Settings, ends: dict[int, int], groups: list[list[int]], decode: bool) -> Reading:
    """Time a bare read of every partition (split over the rebuild's processes), with or without decoding.

    Args:
        settings: The namespace.
        ends: Partition → end offset.
        groups: The rebuild's split of the partitions over processes (`split_partitions`).
        decode: Decode each record into a `LogBatch` too.

    Returns:
        The reading (``events`` is 0 without decoding: the caller knows the count).
    """
    import multiprocessing

    started = time.perf_counter()
    if len(groups) == 1:
        parts = [_read_share(settings, groups[0], ends, decode)]
    else:
        with multiprocessing.get_context("fork").Pool(len(groups)) as pool:
            parts = pool.starmap(_read_share, [(settings, g, ends, decode) for g in groups])
    seconds = time.perf_counter() - started
    name = "consume + decode" if decode else "consume"
    return Reading(name, sum(r for r, _ in parts), sum(e for _, e in parts), seconds)


@dataclass
class SizeResult:
    """Everything measured for one log size.

    Attributes:
        target_events: The size asked for.
        filled: What the fill wrote.
        consume: The bare read.
        decode: The read with decoding.
        rebuild: The rebuild, end to end.
        result: What `rebuild` reported.
        counts: Rows per table in the rebuilt projection.
        check: `settled projections check`'s verdict (None when not run).
        check_s: How long the check took.
        load: The machine's load when the rebuild ran.
    """

    target_events: int
    filled: Filled
    consume: Reading
    decode: Reading
    rebuild: Reading
    result: RebuildResult
    counts: dict[str, int]
    check: str | None
    check_s: float
    load: str


def table_counts(settings: Settings, schema: str) -> dict[str, int]:
    """Rows per projection table."""
    out = {}
    with psycopg.connect(settings.postgres_dsn) as conn:
        for name in TABLES:
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(schema, name))).fetchone()
            out[name] = 0 if row is None else int(row[0])
    return out


def run_size(settings: Settings, events: int, args: argparse.Namespace) -> SizeResult:
    """Fill a fresh namespace with ``events`` events, time the baselines and the rebuild, check the rows.

    Raises:
        BenchmarkError: A row count differs from what the generator wrote, or the check found a difference.
    """
    conversations = args.conversations or max(100, events // 500)
    print(
        f"fill {events:,} events over {settings.partitions} partitions, {conversations:,} conversations ...",
        file=sys.stderr,
        flush=True,
    )
    filled = fill(settings, events, conversations, Mix(deltas=args.deltas), args.seed, min(2, os.cpu_count() or 1))
    print(
        f"  filled {filled.events:,} events / {filled.batches:,} batches in {filled.wall_s:.1f} s "
        f"({filled.transactions} transactions)",
        file=sys.stderr,
        flush=True,
    )
    names = ProjectionNames(f"bench_{settings.namespace.rsplit('-', 1)[-1]}")
    from settled.projections._bulk import default_workers, split_partitions

    workers = args.workers or default_workers()
    groups = split_partitions(filled.ends, workers)
    genesis = settings.partitions  # one genesis batch (one event) per partition, written by provision_topics
    consume = read_baseline(settings, filled.ends, groups, decode=False)
    consume.events = filled.events + genesis
    print(f"  consume {consume.events_per_s:,.0f} ev/s", file=sys.stderr, flush=True)
    decode = read_baseline(settings, filled.ends, groups, decode=True)
    print(f"  consume + decode {decode.events_per_s:,.0f} ev/s", file=sys.stderr, flush=True)
    load = load_average()
    started = time.perf_counter()
    result = rebuild(settings, names, workers=args.workers)
    seconds = time.perf_counter() - started
    reading = Reading("rebuild", result.batches, result.events, seconds)
    print(f"  rebuild {reading.events_per_s:,.0f} ev/s ({result.workers} processes)", file=sys.stderr, flush=True)
    counts = table_counts(settings, names.live)
    expected = dict(filled.rows, conversations=conversations, partitions=settings.partitions)
    wrong = {t: (counts.get(t), n) for t, n in expected.items() if counts.get(t) != n}
    if wrong or result.events != filled.events + genesis:
        raise BenchmarkError(f"the rebuilt projection holds {wrong} rows (got, expected); events {result.events}")
    verdict, check_s = None, 0.0
    if args.check:
        t0 = time.perf_counter()
        report = check(settings, names, workers=args.workers)
        check_s = time.perf_counter() - t0
        verdict = "clean" if report.ok else f"{len(report.differences)} differences"
        print(f"  check: {verdict} ({check_s:.0f} s)", file=sys.stderr, flush=True)
        if not report.ok:
            raise BenchmarkError(f"check: {report.differences[:5]}")
    if not args.keep:
        _drop_schemas(settings, names)
    return SizeResult(events, filled, consume, decode, reading, result, counts, verdict, check_s, load)


def _drop_schemas(settings: Settings, names: ProjectionNames) -> None:
    with psycopg.connect(settings.postgres_dsn, autocommit=True) as conn:
        for schema in (names.live, names.building, names.retired, names.scratch):
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


# ------------------------------------------------------------------------------------------------- live lag


class LagProbe:
    """Notes when each log record was appended, when it became readable, and when the projection showed it.

    A prompt read_committed consumer from the log's current end gives each record's append time (its
    ``LogAppendTime`` timestamp: the log topic is created with it) and when it became readable; a ``LISTEN`` on the
    projection's channel gives, per commit of the live projector, the partition's next offset and when it was
    received (the rows of every record below it are visible from then on: rows and offset commit together).
    """

    def __init__(self, settings: Settings, names: ProjectionNames) -> None:
        """Start both threads.

        Args:
            settings: The namespace, Kafka and Postgres.
            names: The live projection.
        """
        self.topic = settings.topic("log")
        self.records: dict[tuple[int, int], tuple[float, float]] = {}  # (p, offset) → (appended, readable)
        self.commits: list[tuple[float, int, int]] = []  # (received, partition, next offset)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._positions: dict[int, int] = {}
        self._consumer = Consumer(reader_config(settings, f"{settings.namespace}.bench-lag"))
        self._start = log_end_offsets(settings)
        self._consumer.assign([TopicPartition(self.topic, p, o) for p, o in self._start.items()])
        self._listen = psycopg.connect(settings.postgres_dsn, autocommit=True)
        self._listen.execute(sql.SQL("LISTEN {}").format(sql.Identifier(names.channel)))
        self._threads = [
            threading.Thread(target=self._read, name="bench-lag-reader", daemon=True),
            threading.Thread(target=self._notifies, name="bench-lag-listener", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        parts = [TopicPartition(self.topic, p) for p in self._start]
        while not self._stop.is_set():
            first = self._consumer.poll(0.05)
            if first is None:
                # Positions are asked here, in the thread that polls (from another thread the call can block).
                positions = {tp.partition: tp.offset for tp in self._consumer.position(parts)}
                with self._lock:
                    self._positions = positions
                continue
            now = time.time()
            for msg in [first, *self._consumer.consume(1000, 0)]:
                p, offset = msg.partition(), msg.offset()
                if msg.error() is not None or p is None or offset is None:
                    continue
                _, ts_ms = msg.timestamp()
                with self._lock:
                    self.records[(p, offset)] = (ts_ms / 1000.0, now)

    def _notifies(self) -> None:
        while not self._stop.is_set():
            for note in self._listen.notifies(timeout=0.2):
                now = time.time()
                p, _, next_offset = note.payload.partition(":")
                with self._lock:
                    self.commits.append((now, int(p), int(next_offset)))

    def read_up_to(self, ends: dict[int, int]) -> bool:
        """Tell whether the reader's position is at or past each partition's end offset."""
        with self._lock:
            positions = dict(self._positions)
        # Nothing read yet in a partition: its position is unset (negative), fine if nothing was appended there.
        return all(
            positions.get(p, -1) >= end or (positions.get(p, -1) < 0 and end <= self._start[p])
            for p, end in ends.items()
        )

    def last_offsets(self) -> dict[int, int]:
        """The last record offset read per partition (since the last `clear`: then only the warm-up's)."""
        with self._lock:
            out: dict[int, int] = {}
            for p, offset in self.records:
                out[p] = max(out.get(p, -1), offset)
            return out

    def clear(self) -> None:
        """Forget everything noted so far (the warm-up)."""
        with self._lock:
            self.records.clear()
            self.commits.clear()

    def lags(self) -> tuple[list[float], list[float], int]:
        """Per record noted: visible − appended and visible − readable, in seconds; and records never seen visible."""
        with self._lock:
            records = dict(self.records)
            commits = sorted(self.commits)
        by_partition: dict[int, list[tuple[int, float]]] = {}
        for received, p, next_offset in commits:
            by_partition.setdefault(p, []).append((next_offset, received))
        appended, readable, unseen = [], [], 0
        for (p, offset), (t_append, t_read) in records.items():
            visible = next((t for nxt, t in by_partition.get(p, ()) if nxt > offset), None)
            if visible is None:
                unseen += 1
                continue
            appended.append(visible - t_append)
            readable.append(visible - t_read)
        return appended, readable, unseen

    def close(self) -> None:
        """Stop the threads."""
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._consumer.close()
        self._listen.close()


@dataclass
class LagCell:
    """Live lag at one client count.

    Attributes:
        clients: Client threads submitting.
        submissions: Submissions made.
        admissions_per_s: Admissions per second (submit → receipt, all threads).
        records: Log records appended during the load.
        appended_ms: Visible − appended, per record, in milliseconds.
        readable_ms: Visible − readable in Kafka, per record, in milliseconds.
        unseen: Records never seen visible (must be 0).
        projector_cpu_s: CPU seconds the projector used during the load.
    """

    clients: int
    submissions: int
    admissions_per_s: float
    records: int
    appended_ms: list[float]
    readable_ms: list[float]
    unseen: int
    projector_cpu_s: float


def _stored_offsets(settings: Settings, names: ProjectionNames) -> dict[int, int]:
    with psycopg.connect(settings.postgres_dsn) as conn:
        try:
            return read_offsets(conn, names.live, settings.topic("log"))
        except psycopg.errors.UndefinedTable:
            return {}


def _wait_projected(settings: Settings, names: ProjectionNames, probe: LagProbe, timeout_s: float) -> None:
    """Wait until the probe read the whole log and the projection stored every record it read."""
    deadline = time.monotonic() + timeout_s
    ends = log_end_offsets(settings)
    while time.monotonic() < deadline:
        if probe.read_up_to(ends):
            last = probe.last_offsets()
            stored = _stored_offsets(settings, names)
            if all(stored.get(p, 0) > offset for p, offset in last.items()):
                return
        time.sleep(0.05)
    raise BenchmarkError(f"the projector did not catch up with the log within {timeout_s} s")


def run_lag(bootstrap: str, dsn: str, args: argparse.Namespace) -> tuple[list[LagCell], str]:
    """Run the admission benchmark's load against a live projector; return the lag per client count.

    Raises:
        BenchmarkError: A submission failed, or a record never became visible.
    """
    from worker import PARTITIONS as LOAD_PARTITIONS  # the admission benchmark (bench/worker.py)
    from worker import _conversation_on, conversation, drive, spawn, spawn_settled_worker

    from settled.client import Client
    from settled.schemas import ReceiptOutcome

    namespace = fresh_namespace("bench-lag")
    settings = Settings(namespace=namespace, kafka_bootstrap=bootstrap, postgres_dsn=dsn, partitions=LOAD_PARTITIONS)
    names = ProjectionNames(f"bench_lag_{namespace.rsplit('-', 1)[-1]}")
    log_dir = Path(tempfile.mkdtemp(prefix="bench-rebuild-lag-"))
    children = []
    client: Client | None = None
    probe: LagProbe | None = None
    cells: list[LagCell] = []
    try:
        provision_topics(settings, Codec(), datetime.now(UTC))
        children.append(spawn_settled_worker(settings, log_dir))
        projector_argv = [sys.executable, "-m", "settled.services", "projections", "run", "--schema", names.live]
        projector = spawn("projector", projector_argv, settings, log_dir, {"SETTLED_POSTGRES_DSN": dsn})
        children.append(projector)
        client = Client(settings, default_timeout_s=30.0)
        probe = LagProbe(settings, names)
        for p in range(LOAD_PARTITIONS):  # warm-up: the worker and the projector hold every partition
            client.submit(_conversation_on(p), {"warm": True}, timeout_s=120)
        _wait_projected(settings, names, probe, 120)
        submit_client = client

        def submit(i: int) -> tuple[str, float | None]:
            receipt = submit_client.submit(conversation(i, 100), {"i": i})
            if receipt.outcome is not ReceiptOutcome.ADMITTED:
                raise BenchmarkError(f"request {i}: receipt {receipt.outcome.value}")
            return receipt.request_id, None

        offset = 0
        for clients in args.lag_client_list:
            for child in children:
                child.check()
            probe.clear()
            cpu = projector.cpu_s()
            cell = drive(submit, args.lag_submissions, clients, offset)
            offset += args.lag_submissions
            if cell.failures:
                raise BenchmarkError(f"{clients} clients: {cell.failures[:3]}")
            time.sleep(1.0)  # the echo runs settle after their receipts: let the last ones append
            _wait_projected(settings, names, probe, 60)
            time.sleep(0.3)  # the last notifications
            appended, readable, unseen = probe.lags()
            cells.append(
                LagCell(
                    clients,
                    cell.n,
                    cell.admissions_per_s(),
                    len(appended) + unseen,
                    [x * 1000 for x in appended],
                    [x * 1000 for x in readable],
                    unseen,
                    projector.cpu_s() - cpu,
                )
            )
            c = cells[-1]
            print(
                f"  lag at {clients} clients: p50 {percentile(c.appended_ms, 50):.1f} ms, "
                f"p99 {percentile(c.appended_ms, 99):.1f} ms ({c.records} records)",
                file=sys.stderr,
                flush=True,
            )
            if unseen:
                raise BenchmarkError(f"{unseen} records never became visible in the projection")
    finally:
        if probe is not None:
            probe.close()
        if client is not None:
            client.close()
        for child in children:
            child.stop()
        if not args.keep:
            try:
                delete_namespace(settings, [f"{namespace}.{settings.app_id}.workers"])
                _drop_schemas(settings, names)
            except Exception as exc:  # noqa: BLE001 - reported; the numbers measured stay valid
                print(f"warning: could not delete namespace {namespace}: {exc!r}", file=sys.stderr)
    return cells, str(log_dir)


# ------------------------------------------------------------------------------------------------- main


def _sizes(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        scale = 1
        if part.endswith("k"):
            scale, part = 1_000, part[:-1]
        elif part.endswith("m"):
            scale, part = 1_000_000, part[:-1]
        out.append(int(float(part) * scale))
    return out


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--events", default="100k,1M", help="log sizes in canonical events, e.g. 100k,1M")
    parser.add_argument("--partitions", type=int, default=6, help="log partitions")
    parser.add_argument("--conversations", type=int, default=0, help="conversations (default: events / 500)")
    parser.add_argument("--deltas", type=int, default=8, help="mean text deltas recorded with a final response")
    parser.add_argument("--seed", type=int, default=7, help="seeds the generated log")
    parser.add_argument("--workers", type=int, default=None, help="rebuild processes (default: one per core)")
    parser.add_argument("--check", action="store_true", help="run `settled projections check` after each rebuild")
    parser.add_argument("--lag-clients", default="10,100", help="client threads of the live-lag load")
    parser.add_argument("--lag-submissions", type=int, default=1000, help="submissions per client count")
    parser.add_argument("--no-lag", action="store_true", help="skip the live-lag measurement")
    parser.add_argument("--profile", action="store_true", help="profile one in-process rebuild of the first size")
    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: the dev stack)")
    parser.add_argument("--keep", action="store_true", help="keep the namespaces and schemas")
    args = parser.parse_args(argv)
    args.size_list = _sizes(args.events)
    if not args.size_list or any(n < 1000 for n in args.size_list):
        parser.error(f"--events must list sizes of at least 1000, got {args.events!r}")
    args.lag_client_list = [int(c) for c in args.lag_clients.split(",") if c.strip()]
    return args


def _resolve_dsn() -> str:
    settings = Settings()
    if settings.postgres_dsn:
        return settings.postgres_dsn
    from settled.services._cli_dev import stack_from_settings

    postgres = stack_from_settings(settings).postgres()
    if not postgres.is_running():
        raise BenchmarkError("no PostgreSQL: set SETTLED_POSTGRES_DSN or run `settled dev up`")
    return postgres.dsn


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables; return 0 (the target is reported, not enforced).

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``).

    Returns:
        The exit status.

    Raises:
        BenchmarkError: The measurement failed (a wrong row count, a difference found by the check, a lost record).
    """
    args = _parse(argv)
    use_dev_timeouts()  # printed with the results; spawned children inherit them
    wall_start = time.monotonic()
    load_before = load_average()
    bootstrap, source = resolve_bootstrap(args.bootstrap)
    dsn = _resolve_dsn()
    print(f"broker {bootstrap} ({source}); postgres {dsn}; {load_before}", file=sys.stderr, flush=True)
    results: list[SizeResult] = []
    info: BrokerInfo | None = None
    profile_text = ""
    for events in args.size_list:
        namespace = fresh_namespace("bench-rebuild")
        settings = Settings(
            namespace=namespace, partitions=args.partitions, kafka_bootstrap=bootstrap, postgres_dsn=dsn
        )
        try:
            results.append(run_size(settings, events, args))
            if info is None:
                info = describe_broker(bootstrap, settings.topic("log"))
            if args.profile and not profile_text:
                profile_text = _profile(settings)
        finally:
            if not args.keep:
                try:
                    delete_namespace(settings)
                except Exception as exc:  # noqa: BLE001 - reported; the numbers measured stay valid
                    print(f"warning: could not delete namespace {namespace}: {exc!r}", file=sys.stderr)
    lag: list[LagCell] = []
    if not args.no_lag:
        print("live lag under the admission benchmark's load ...", file=sys.stderr, flush=True)
        lag, _ = run_lag(bootstrap, dsn, args)
    assert info is not None
    _report(args, results, lag, info, load_before, wall_start)
    if profile_text:
        print("\n" + profile_text)
    return 0


def _profile(settings: Settings) -> str:
    """Rebuild once more in this process (one worker) under pyinstrument; return the report."""
    from pyinstrument import Profiler

    names = ProjectionNames(f"bench_{settings.namespace.rsplit('-', 1)[-1]}_p")
    profiler = Profiler(interval=0.001)
    profiler.start()
    try:
        rebuild(settings, names, workers=1)
    finally:
        profiler.stop()
        _drop_schemas(settings, names)
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    return "--- pyinstrument: one in-process rebuild (1 worker) of the first size ---\n" + text


def _ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q):.1f}" if values else "-"


def _report(
    args: argparse.Namespace,
    results: list[SizeResult],
    lag: list[LagCell],
    info: BrokerInfo,
    load_before: str,
    wall_start: float,
) -> None:
    print(
        "\nProjection rebuild: `settled.projections.rebuild` end to end (fresh schema version, bulk replay, "
        "catch-up, switch), against a bare read of the same partitions by the same number of processes.\n"
    )
    rows = []
    for r in results:
        f = r.filled
        events = r.rebuild.events
        rows.append(
            [
                f"{r.target_events:,}",
                f"{events:,}",
                f"{r.rebuild.records:,}",
                f"{events / r.rebuild.records:.2f}",
                f"{r.consume.events_per_s:,.0f}",
                f"{r.decode.events_per_s:,.0f}",
                f"{r.rebuild.events_per_s:,.0f}",
                f"{r.rebuild.records_per_s:,.0f}",
                f"{r.rebuild.seconds:.1f}",
                f"{r.rebuild.events_per_s / r.consume.events_per_s:.2f}",
                f"{r.rebuild.events_per_s / r.decode.events_per_s:.2f}",
                "yes" if r.rebuild.events_per_s >= TARGET_EVENTS_PER_S else "NO",
                str(r.result.workers),
                r.load,
            ]
        )
        del f
    print(
        table(
            [
                "size",
                "events",
                "batches",
                "ev/batch",
                "consume ev/s",
                "+decode ev/s",
                "rebuild ev/s",
                "rebuild batches/s",
                "rebuild s",
                "vs consume",
                "vs +decode",
                f">= {TARGET_EVENTS_PER_S:,}",
                "procs",
                "load at start",
            ],
            rows,
        )
    )
    print(
        "\nWhere the rebuild's time went (phases: wall seconds; work: wall seconds summed over the replaying "
        "processes, "
        "and microseconds per batch; replay CPU: CPU seconds those processes used, which other processes on the "
        "machine do not stretch; CPU-bound ev/s: events / (replay CPU / cores), what the replay would reach on "
        "otherwise idle cores):\n"
    )
    rows = []
    for r in results:
        w, ph = r.result.work, r.result.phases
        per = 1e6 / max(w.records, 1)
        total = w.consume + w.decode + w.fold + w.rows + w.write
        rows.append(
            [
                f"{r.target_events:,}",
                f"{ph.get('setup', 0):.2f}",
                f"{ph.get('replay', 0):.2f}",
                f"{ph.get('catch_up', 0):.2f}",
                f"{ph.get('switch', 0):.2f}",
                *(f"{v:.2f} ({v * per:.0f} us)" for v in (w.consume, w.decode, w.fold, w.rows, w.write)),
                f"{total:.2f}",
                f"{w.cpu:.2f} ({w.cpu * per:.0f} us)",
                f"{w.events / (w.cpu / (os.cpu_count() or 1)):,.0f}" if w.cpu else "-",
                f"{w.rows_written:,}",
            ]
        )
    print(
        table(
            [
                "size",
                "setup",
                "replay",
                "catch-up",
                "switch",
                "consume",
                "decode",
                "fold",
                "rows",
                "pg write",
                "work total",
                "replay CPU",
                "CPU-bound ev/s",
                "rows written",
            ],
            rows,
        )
    )
    for r in results:
        f = r.filled
        print(
            f"\n{r.target_events:,}: filled {f.events:,} events in {f.batches:,} batches ({f.admitted:,} submissions, "
            f"{f.settled:,} settled) with {f.transactions} transactions in {f.wall_s:.1f} s; rows {r.counts} "
            f"(each as the generator expects); check: {r.check or 'not run (--check)'}"
            + (f" in {r.check_s:.0f} s" if r.check else "")
        )
    if lag:
        print(
            "\nLive lag: the admission benchmark's load (echo agent, one worker, one Client shared by N threads) with "
            "`settled projections run` beside it; per log record appended during the load.\n"
        )
        rows = [
            [
                str(c.clients),
                f"{c.submissions:,}",
                f"{c.admissions_per_s:,.0f}",
                f"{c.records:,}",
                _ms(c.appended_ms, 50),
                _ms(c.appended_ms, 99),
                _ms(c.readable_ms, 50),
                _ms(c.readable_ms, 99),
                f"{c.projector_cpu_s * 1e6 / max(c.records, 1):,.0f}",
            ]
            for c in lag
        ]
        print(
            table(
                [
                    "clients",
                    "submissions",
                    "adm/s",
                    "records",
                    "p50 ms",
                    "p99 ms",
                    "p50 ms (readable)",
                    "p99 ms (readable)",
                    "projector CPU us/record",
                ],
                rows,
            )
        )
        print(
            "p50/p99 ms = row visible in Postgres (the projector's NOTIFY received) - the record's append time "
            "(LogAppendTime); (readable) = - when a prompt read_committed consumer first read it."
        )
    print(f"\ndurability class: {info.durability_class()}")
    print(f"client: {client_versions()}; broker: {info.version}; Kafka timeouts: {Settings().timeouts_label()}")
    mix = Mix(deltas=args.deltas)
    print(
        f"workload: {args.partitions} partitions, conversations {args.conversations or 'events / 500'}, mix {mix}, "
        f"seed {args.seed}; rebuild processes: {args.workers or 'one per core'}"
    )
    print(
        f"machine: {load_before} before, {load_average()} after; wall time {time.monotonic() - wall_start:.0f} s; "
        f"python {sys.version.split()[0]}"
    )


if __name__ == "__main__":
    sys.exit(main())
