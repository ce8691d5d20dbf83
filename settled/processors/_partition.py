"""A partition's owner: claim, restore, decide, append (docs/design.md §3).

`PartitionOwner` is the consume → decide → append loop for one owned partition. The domain logic is a `Decider`
(pure: a fold over canonical batches and decisions that are functions of state and one input); the owner wraps it
with what every decider needs:

* the **claim** in docs/design.md §3's order — the caller pauses the input partition (step 1); `claim` fences previous
  owners with ``init_transactions`` (2), waits until the log partition has no open transaction (3), restores from the
  log on an assign-only consumer (4) and appends ``OwnershipClaimed(epoch + 1)`` (5); the caller then resumes (6);
* the **chain**: every batch is sealed on its conversation's head (event sequence, previous digest), with a
  deterministic batch id ``<conversation>:<first event seq>`` so a repeated batch is detectable;
* the **pending overlay**: decisions of the open checkpoint are folded into a scratch state that answers later
  decisions (one key proposed twice in one open transaction is admitted once), while the committed state advances
  only with what the appender reports committed;
* **decided inputs**: every inbox record yields exactly one log record carrying its offset; restore collects them
  so a re-read input is skipped, never decided twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from settled._failpoints import failpoint
from settled._faults import fault_enabled
from settled._settings import Settings
from settled.producers import (
    AppendBatch,
    OutRecord,
    OutsideTransactionPublisher,
    TransactionalAppender,
    read_partition,
)
from settled.protocol import StaleEpochError, lifecycle_events, quarantine, quarantine_conversation
from settled.schemas import (
    SCHEMA_VERSION,
    AvroRecord,
    Genesis,
    InboxRecord,
    InputRef,
    LogBatch,
    LogEvent,
    OwnershipClaimed,
    QuarantineReason,
    QuarantineRecord,
    Receipt,
    RepeatedBatchGuard,
    SettlementRecord,
)

__all__ = [
    "Decider",
    "Decision",
    "InboxInput",
    "PartitionOwner",
]

_log = logging.getLogger(__name__)

S = TypeVar("S")


@dataclass(frozen=True)
class InboxInput:
    """One consumed inbox record, decoded or not.

    Attributes:
        topic: The inbox topic.
        partition: Its partition.
        offset: The record's offset.
        key: The record key (the conversation id, UTF-8), if any.
        value: The raw value, if any (``None`` when the consumer reported an error at this offset).
        record: The decoded record, or ``None`` when it could not be decoded (see ``error``).
        error: Why the record cannot be decided normally (undecodable, oversized, consumer error), else ``None``.
        error_reason: The quarantine reason code that goes with ``error``.
        last_offset: For an input standing for a whole record batch the consumer could not read (reported at the
            batch's base ``offset``), the batch's last offset; ``None`` for a single record. The input offset
            committed with its decision passes it.
        headers: The record's headers (name, value), in order; the HTTP API's signature travels there (issue 20).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    record: InboxRecord | None
    error: str | None = None
    error_reason: str | None = None
    last_offset: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def ref(self) -> InputRef:
        """The input reference carried by this input's decision event."""
        return InputRef(topic=self.topic, partition=self.partition, offset=self.offset)


@dataclass(frozen=True)
class Decision:
    """What a decider decided for one conversation: canonical events plus side records, in one batch.

    Attributes:
        conversation_id: The conversation whose log the events extend.
        events: Canonical events, in order (at least one).
        submission_id: The submission the batch is about, when one is.
        receipts: Replies for ``settled.receipts``.
        settlements: Records for ``settled.settlements``.
        quarantined: Records for ``settled.quarantine``.
        inputs: Inbox offsets this decision decides (each carried by one of ``events``' ``input_ref``).
        call_tools: ``(call id, tool name)`` of the calls whose ``ToolCallSettled`` ``events`` holds, so a typed
            failure replacing a settlement too large to append names its tool.
    """

    conversation_id: str
    events: tuple[LogEvent, ...]
    submission_id: str | None = None
    receipts: tuple[Receipt, ...] = ()
    settlements: tuple[SettlementRecord, ...] = ()
    quarantined: tuple[QuarantineRecord, ...] = ()
    inputs: frozenset[int] = frozenset()
    call_tools: tuple[tuple[str, str], ...] = ()


class Decider(Protocol[S]):
    """The pure domain logic of a partition (docs/design.md §1b): a fold and decisions. No I/O, no clock."""

    def initial_state(self, partition: int) -> S:
        """Return the state of an empty partition."""
        ...

    def fold(self, state: S, batch: LogBatch) -> S:
        """Return ``state`` advanced by one canonical batch (without mutating ``state``)."""
        ...

    def decide(self, state: S, inp: InboxInput, now: datetime) -> Sequence[Decision]:
        """Decide one inbox input against ``state`` (committed plus pending)."""
        ...

    def poison(self, state: S, decisions: Sequence[Decision], reason: str, now: datetime) -> Sequence[Decision]:
        """Return typed-failure decisions replacing ``decisions`` that cannot be appended, deciding the same inputs."""
        ...


def _utc_millis(value: datetime) -> datetime:
    """Aware UTC at millisecond precision: what ``LogBatch.recorded_at`` (Avro ``timestamp-millis``) holds."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"the owner's clock returned a naive datetime {value.isoformat()}; batches record aware UTC")
    value = value.astimezone(UTC)
    return value.replace(microsecond=value.microsecond - value.microsecond % 1000)


@dataclass
class _Head:
    last_event_seq: int = 0
    last_digest: str | None = None


@dataclass
class PartitionOwner(Generic[S]):
    """The owner of one partition: claim, restore, decide, checkpoint.

    Attributes:
        settings: Namespace and Kafka settings.
        partition: The owned partition number.
        decider: The domain logic.
        appender: The partition's transactional appender (not yet opened).
        encode: Encodes a record for Kafka (the codec's single-object or registry framing).
        decode_batch: Decodes a ``settled.log`` record value into a `LogBatch`
            (``(value, topic, partition, offset) -> LogBatch``).
        clock: Returns "now" (aware UTC); tests may offset it.
        worker_id: This process's id, recorded in ``OwnershipClaimed``.
        encode_batch: Seals and encodes a `LogBatch` given as its Avro dict in one serialization, returning the
            record value and the batch digest (`settled.schemas.Codec.encode_batch_dict`); ``None`` seals with
            `LogBatch.seal` and encodes with ``encode`` (two serializations).
        epoch: The logical owner epoch (of the latest claim folded).
        genesis: The partition's genesis event, once restored.
        committed: The decider's state folded from committed batches only.
        committed_listeners: Called with every batch once it is committed (restored or checkpointed), after it is
            folded into ``committed``; e.g. the conductor's per-submission journal (issue 6).
        replaced_batch_ids: Ids of the batches the last checkpoint could not append as staged and replaced by
            typed failures with other events (a split that keeps every event is not counted).
        too_large_records: A run's records (by batch id) the last checkpoint set aside because neither they nor a
            typed failure fit the record limit, each with the reason naming its events, size and limit.
    """

    settings: Settings
    partition: int
    decider: Decider[S]
    appender: TransactionalAppender
    encode: Callable[[AvroRecord], bytes]
    decode_batch: Callable[[bytes, str, int, int], LogBatch]
    clock: Callable[[], datetime]
    worker_id: str
    encode_batch: Callable[[dict[str, Any]], tuple[bytes, str]] | None = None
    epoch: int = field(default=0, init=False)
    genesis: Genesis | None = field(default=None, init=False)
    committed: S = field(init=False)
    committed_listeners: list[Callable[[LogBatch], None]] = field(default_factory=list, init=False)
    replaced_batch_ids: frozenset[str] = field(default=frozenset(), init=False)
    too_large_records: dict[str, str] = field(default_factory=dict, init=False)
    _overlay: S = field(init=False)
    _heads: dict[str, _Head] = field(default_factory=dict, init=False)
    _pending_heads: dict[str, _Head] = field(default_factory=dict, init=False)
    _pending: list[tuple[AppendBatch, Decision, LogBatch]] = field(default_factory=list, init=False)
    _pending_inputs: list[int] = field(default_factory=list, init=False)
    _next_input_offset: int | None = field(default=None, init=False)
    _decided: set[int] = field(default_factory=set, init=False)
    _guard: RepeatedBatchGuard = field(default_factory=RepeatedBatchGuard, init=False)
    # Fault switch lifecycle_outside_transaction only: lifecycle records held out of the transaction, by batch id.
    _outside: dict[str, tuple[OutRecord, ...]] = field(default_factory=dict, init=False)
    _outside_publisher: OutsideTransactionPublisher | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.committed = self.decider.initial_state(self.partition)
        self._overlay = self.committed
        if fault_enabled("lifecycle_outside_transaction"):
            self._outside_publisher = OutsideTransactionPublisher(self.settings, self.partition)

    @property
    def input_topic(self) -> str:
        """The inbox topic."""
        return self.settings.topic("inbox")

    @property
    def log_topic(self) -> str:
        """The canonical log topic."""
        return self.settings.topic("log")

    # -- claim (docs/design.md §3 steps 2-5) -------------------------------------------------------------------------

    def claim(self, restore_timeout_s: float = 120.0) -> None:
        """Fence previous owners, restore from the log, and append ``OwnershipClaimed(epoch + 1)``.

        The caller has paused the input partition (step 1) and resumes it afterwards (step 6).

        Args:
            restore_timeout_s: Bound on reading the log partition, in seconds.

        Raises:
            ProducerFencedError: A newer owner fenced us meanwhile.
            OpenTransactionError: A foreign transaction stays open on the log partition.
            ChainBreakError: The log is corrupt (a repeated batch id, a broken chain).
            StaleEpochError: A batch was written under an epoch below a preceding claim.
        """
        self.appender.open()  # steps 2 and 3
        failpoint("owner.after_fence")
        restore_started_s = time.monotonic()
        restored = self.restore(restore_timeout_s)  # step 4
        restore_s = time.monotonic() - restore_started_s
        claim_event = OwnershipClaimed(
            partition=self.partition, owner_epoch=self.epoch + 1, worker_id=self.worker_id, claimed_at=self.clock()
        )
        decision = Decision(conversation_id=self._partition_conversation(), events=(claim_event,))
        self._stage(decision, epoch=self.epoch + 1)
        self.checkpoint()  # step 5: the claim is canonical before any input is decided
        _log.info(
            "partition claimed",
            extra={
                "partition": self.partition,
                "epoch": self.epoch,
                "fence_ms": round(self.appender.last_fence_s * 1000, 1),
                "open_transaction_wait_ms": round(self.appender.last_open_transaction_wait_s * 1000, 1),
                "saw_open_transaction": self.appender.last_saw_open_transaction,
                "restore_ms": round(restore_s * 1000, 1),
                "records": restored,
            },
        )

    def _partition_conversation(self) -> str:
        return f"~partition/{self.partition}"

    def restore(self, timeout_s: float) -> int:
        """Fold the whole log partition from offset 0 (until snapshots exist, docs/design.md §11); once, on claim.

        Args:
            timeout_s: Bound on the read, in seconds.

        Returns:
            How many log records (batches) were folded.
        """
        state = self.decider.initial_state(self.partition)
        records = 0
        for msg in read_partition(self.settings, self.log_topic, self.partition, 0, timeout_s):
            offset = msg.offset()
            value = msg.value()
            if offset is None or value is None:
                continue
            batch = self.decode_batch(value, self.log_topic, self.partition, offset)
            state = self._fold_committed(state, batch, offset)
            records += 1
        self.committed = state
        self._overlay = state
        return records

    def _fold_committed(self, state: S, batch: LogBatch, offset: int, *, fold: bool = True) -> S:
        """Book a committed batch (repeat guard, genesis, claims, chain head, decided inputs) and fold it.

        With ``fold`` false the caller already holds the folded state (the pending overlay) and ``state`` is
        returned as is. The listeners are told last.
        """
        self._guard.check(batch.batch_id, offset)
        if self.genesis is None and isinstance(batch.events[0], Genesis):
            self.genesis = batch.events[0]
        claim = next((e for e in batch.events if isinstance(e, OwnershipClaimed)), None)
        if claim is not None:
            self.epoch = max(self.epoch, claim.owner_epoch)
        elif batch.owner_epoch < self.epoch:
            raise StaleEpochError(
                batch.conversation_id,
                batch.owner_epoch,
                self.epoch,
                f"{self.log_topic}[{self.partition}]@{offset}: batch {batch.batch_id} is below the preceding claim",
            )
        head = self._heads.setdefault(batch.conversation_id, _Head())
        head.last_event_seq, head.last_digest = batch.last_event_seq, batch.batch_digest
        for event in batch.events:
            ref = getattr(event, "input_ref", None)
            if isinstance(ref, InputRef) and ref.partition == self.partition and ref.topic == self.input_topic:
                self._decided.add(ref.offset)
        if fold:
            state = self.decider.fold(state, batch)
        for listener in self.committed_listeners:
            listener(batch)
        return state

    # -- deciding ------------------------------------------------------------------------------------------------

    def handle(self, inp: InboxInput) -> None:
        """Decide one consumed inbox record against the committed state plus the pending overlay.

        A record whose decision is already canonical (re-read after a restart) is skipped.

        Args:
            inp: The consumed record.
        """
        self._next_input_offset = (inp.offset if inp.last_offset is None else inp.last_offset) + 1
        if inp.offset in self._decided:
            return
        self._pending_inputs.append(inp.offset)
        for decision in self.decider.decide(self._overlay, inp, self.clock()):
            self._stage(decision, epoch=self.epoch)

    @property
    def overlay(self) -> S:
        """The committed state plus every pending decision: what decisions read (docs/design.md §3)."""
        return self._overlay

    def stage(self, decision: Decision) -> None:
        """Stage a decision that is not an inbox input's (an attempt start, a settlement) for the next checkpoint.

        All or nothing: when the decider's fold refuses the batch, the error propagates and nothing is staged.

        Args:
            decision: One conversation's events and side records; ``inputs`` empty.

        Raises:
            Exception: Whatever the decider's fold raises for the sealed batch (e.g. the protocol's
                ``ProtocolError`` or the schemas' ``ChainBreakError``); the pending state is unchanged.
        """
        self._stage(decision, epoch=self.epoch)

    def pending_conversations(self) -> tuple[str, ...]:
        """The conversations with a batch waiting for a checkpoint."""
        return tuple(self._pending_heads)

    def is_pending(self, conversation_id: str) -> bool:
        """Whether a batch of ``conversation_id`` waits for a checkpoint."""
        return conversation_id in self._pending_heads

    def _stage(self, decision: Decision, epoch: int) -> None:
        head = self._pending_heads.get(decision.conversation_id) or self._heads.get(decision.conversation_id, _Head())
        batch, encoded = self._seal(decision, head, epoch)
        overlay = self.decider.fold(self._overlay, batch)  # may raise: then nothing is staged
        self._pending_heads[decision.conversation_id] = _Head(batch.last_event_seq, batch.batch_digest)
        self._overlay = overlay
        self._pending.append((encoded, decision, batch))

    def _seal(self, decision: Decision, head: _Head, epoch: int) -> tuple[LogBatch, AppendBatch]:
        """Seal the decision's batch on ``head`` and encode it with its side records.

        With ``encode_batch`` the envelope is serialized once, its digest computed from those bytes (the codec's
        sealing); otherwise `LogBatch.seal` computes the digest and ``encode`` serializes it again.
        """
        first = head.last_event_seq + 1
        fields: dict[str, Any] = {
            "conversation_id": decision.conversation_id,
            "batch_id": f"{decision.conversation_id}:{first}",
            "first_event_seq": first,
            "owner_epoch": epoch,
            "prev_batch_digest": head.last_digest,
            "recorded_at": self.clock(),
            "submission_id": decision.submission_id,
        }
        if self.encode_batch is None:
            batch = LogBatch.seal(events=decision.events, **fields)
            return batch, self._encode_batch(batch, decision, self.encode(batch))
        events = tuple(decision.events)
        if not events:
            raise ValueError(f"a decision for conversation {decision.conversation_id!r} holds no events")
        # The hot path (each effect a run records is one batch). Built without re-validating its events (each was
        # validated when it was made; that is most of what a validating constructor costs), and its Avro dict built
        # once (`LogBatch.to_avro` converts the events twice): the envelope's fields are computed right here,
        # ``recorded_at`` normalized as the schema does, a field the schema gains fails loudly (KeyError), and
        # fastavro writes the dict strictly. tests/unit/processors/test_partition_stage.py checks the bytes and the
        # model equal `LogBatch.seal`'s.
        fields["recorded_at"] = _utc_millis(fields["recorded_at"])
        values = {"schema_version": SCHEMA_VERSION, "last_event_seq": first + len(events) - 1, **fields}
        datum = {name: values[name] for name in LogBatch.model_fields if name not in ("batch_digest", "events")}
        datum["events"] = [(type(e).AVRO_NAME, e.to_avro()) for e in events]
        value, digest = self.encode_batch(datum)
        batch = LogBatch.model_construct(batch_digest=digest, events=events, **values)
        return batch, self._encode_batch(batch, decision, value)

    def _encode_batch(self, batch: LogBatch, decision: Decision, value: bytes) -> AppendBatch:
        key = decision.conversation_id.encode()
        side: list[OutRecord] = []
        side += [OutRecord(self.settings.topic("receipts"), key, self.encode(r)) for r in decision.receipts]
        side += [OutRecord(self.settings.topic("settlements"), key, self.encode(r)) for r in decision.settlements]
        side += [OutRecord(self.settings.topic("quarantine"), key, self.encode(r)) for r in decision.quarantined]
        # The batch's durable.* events, in its transaction (issue 17 item 5; docs/architecture.md "Lifecycle events").
        lifecycle = tuple(
            OutRecord(self.settings.topic("lifecycle"), key, self.encode(e)) for e in lifecycle_events(batch)
        )
        if self._outside_publisher is not None:
            self._outside[batch.batch_id] = lifecycle  # the fault switch: published after the commit instead
        else:
            side += lifecycle
        return AppendBatch(
            batch_id=batch.batch_id,
            conversation_id=decision.conversation_id,
            log_record=OutRecord(self.log_topic, key, value),
            side_records=tuple(side),
            inputs=decision.inputs,
        )

    # -- the checkpoint --------------------------------------------------------------------------------------------

    @property
    def has_pending(self) -> bool:
        """Whether decisions or consumed inputs wait for a checkpoint."""
        return bool(self._pending) or bool(self._pending_inputs)

    def checkpoint(self) -> int:
        """Commit the pending batches with the input offset, then advance the committed state by what committed.

        Returns:
            The number of batches committed.

        Raises:
            ProducerFencedError: This owner was fenced; drop it.
            AppenderFatalError: A fatal producer error; drop it and claim again.
        """
        if not self._pending and self._next_input_offset is None:
            return 0
        self.too_large_records = {}
        result = self.appender.checkpoint(
            [b for b, _, _ in self._pending], self._pending_inputs, self._next_input_offset
        )
        events = {id(batch): decision.events for batch, decision, _ in self._pending}
        self.replaced_batch_ids = frozenset(
            batch.batch_id
            for original, replacement in result.replaced
            if [e for b in original for e in events[id(b)]] != [e for b in replacement for e in events[id(b)]]
            for batch in original
        )
        # Replacements were appended to _pending after their originals, so they win for a shared batch id.
        sealed = {batch.batch_id: (batch, decision, log_batch) for batch, decision, log_batch in self._pending}
        # When every pending batch committed as staged, the overlay already is their fold on the committed state (the
        # appender orders them by conversation; conversations fold independently): it becomes the committed state
        # without folding them again (the common case, on the hot path).
        whole = not result.replaced and not result.deferred and len(result.committed) == len(self._pending)
        whole = whole and {id(b) for b in result.committed} == {id(b) for b, _, _ in self._pending}
        overlay = self._overlay
        for batch in result.committed:
            self.committed = self._fold_committed(self.committed, sealed[batch.batch_id][2], -1, fold=not whole)
            self._decided |= batch.inputs
        if whole:
            self.committed = overlay
        # Deferred batches (an abort with no batch to blame) stay pending, on top of the committed state.
        self._pending = [sealed[b.batch_id] for b in result.deferred]
        self._overlay = self.committed
        self._pending_heads.clear()
        for _, _, log_batch in self._pending:
            self._overlay = self.decider.fold(self._overlay, log_batch)
            self._pending_heads[log_batch.conversation_id] = _Head(log_batch.last_event_seq, log_batch.batch_digest)
        self._pending_inputs = [o for o in self._pending_inputs if o not in self._decided]
        if self._next_input_offset is not None and not self._pending_inputs:
            self._next_input_offset = None
        if self._outside_publisher is not None:  # fault switch lifecycle_outside_transaction: after the commit
            self._outside_publisher.publish([r for b in result.committed for r in self._outside.pop(b.batch_id, ())])
            pending_ids = {b.batch_id for b, _, _ in self._pending}
            self._outside = {k: v for k, v in self._outside.items() if k in pending_ids}
        if result.deferred:
            failpoint("owner.after_deferred")
        return len(result.committed)

    def replace_poison(self, run: Sequence[AppendBatch], reason: str) -> tuple[AppendBatch, ...]:
        """The appender's ``replace_poison``: re-decide a conversation's batches as typed failures (docs/design.md §3).

        A piece of the replacement still too large is replaced alone, once. A decision with no typed failure, or
        whose typed failure is still too large (e.g. a rejection repeating a huge conversation id), is set aside
        (`_set_aside`): its inputs are quarantined, reason ``oversized``. So the replacement always fits, and a
        too-large batch never becomes a fatal error that re-claims the partition and meets the same batch again.

        Args:
            run: One conversation's batches that cannot be appended.
            reason: Why (size, or failed alone twice).

        Returns:
            Replacement batches sealed on the conversation's committed head (set-aside inputs on the partition's
            quarantine conversation), deciding the same inputs.
        """
        decisions = [d for b in run for batch, d, _ in self._pending if batch.batch_id == b.batch_id]
        now = self.clock()
        queue = [(d, 1 if aside else 0) for d, aside in self._typed_failures(decisions, reason, now)]
        heads = {run[0].conversation_id: self._heads.get(run[0].conversation_id, _Head())}
        limit = self.appender.max_record_bytes
        sealed: list[tuple[AppendBatch, Decision, LogBatch]] = []
        while queue:
            decision, tries = queue.pop(0)
            conversation = decision.conversation_id
            head = heads.get(conversation) or self._pending_heads.get(conversation) or self._heads.get(conversation)
            batch, encoded = self._seal(decision, head or _Head(), self.epoch)
            size = encoded.largest_record_bytes
            if size > limit and tries == 0:
                # A piece of the replacement is still too large (e.g. one settlement of a split record of parallel
                # calls): it is replaced alone, once; the pieces before it stay as they are.
                why = f"record of {size} bytes exceeds the limit of {limit} bytes"
                queue[0:0] = [(d, 1) for d, _ in self._typed_failures([decision], why, now)]
                continue
            if size > limit and not decision.quarantined:
                # Its typed failure is still too large: nothing of that conversation fits. Set aside (always fits).
                why = f"{reason}; its typed failure is a record of {size} bytes, over the limit of {limit} bytes"
                queue[0:0] = [(d, 1) for d in self._set_aside(decision, why, now)]
                continue
            heads[conversation] = _Head(batch.last_event_seq, batch.batch_digest)
            sealed.append((encoded, decision, batch))
        self._pending.extend(sealed)
        return tuple(encoded for encoded, _, _ in sealed)

    def _typed_failures(self, decisions: Sequence[Decision], reason: str, now: datetime) -> list[tuple[Decision, bool]]:
        """The decider's typed failures for ``decisions``; a decision it has none for is set aside (flag True)."""
        try:
            return [(d, False) for d in self.decider.poison(self.committed, decisions, reason, now)]
        except ValueError as exc:
            if len(decisions) > 1:
                return [pair for d in decisions for pair in self._typed_failures([d], reason, now)]
            _log.warning("no typed failure replaces a decision", extra={"error": str(exc)})
            return [
                (d, True)
                for d in self._set_aside(decisions[0], f"{reason}; the decider has no typed failure for it", now)
            ]

    def _set_aside(self, decision: Decision, why: str, now: datetime) -> list[Decision]:
        """Quarantine the inputs of a decision that cannot be appended even replaced (reason ``oversized``).

        A run's record (it decides no input) is dropped: the conductor refuses the run's effect, whose batch was
        replaced, and the run ends (its next attempt replays the log).

        Args:
            decision: The decision that cannot be appended.
            why: The reason, kept (bounded) in each quarantine record.
            now: The decision time.

        Returns:
            One decision per input, on the partition's quarantine conversation (none for a run's record).
        """
        names = sorted({type(e).__name__ for e in decision.events})
        _log.error(
            "a decision too large to append even replaced is set aside",
            extra={"events": names, "inputs": sorted(decision.inputs), "why": why},
        )
        if not decision.inputs:
            batch_id = next((b.batch_id for b, d, _ in self._pending if d is decision), None)
            if batch_id is not None:
                self.too_large_records[batch_id] = f"{names}: {why}"
        out: list[Decision] = []
        for offset in sorted(decision.inputs):
            ref = InputRef(topic=self.input_topic, partition=self.partition, offset=offset)
            q = quarantine(
                ref,
                QuarantineReason.OVERSIZED,
                f"{names}: {why}",
                raw=b"",
                raw_size_bytes=0,
                now=now,
                raw_limit_bytes=0,
            )
            out.append(
                Decision(
                    conversation_id=quarantine_conversation(self.partition),
                    events=q.events,
                    quarantined=(q.quarantine,) if q.quarantine is not None else (),
                    inputs=frozenset({offset}),
                )
            )
        return out
