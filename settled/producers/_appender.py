"""The transactional appender: settled's one exactly-once path to Kafka (docs/design.md §3; DUR-006, DUR-007).

Everything authoritative — ``settled.log``, ``settled.receipts``, ``settled.settlements``, ``settled.quarantine`` —
is produced here, inside a Kafka transaction of the partition owner's producer, together with the inbox offsets the
transaction makes canonical. The caller (a partition's processor) hands over canonical batches that are already
encoded; :meth:`TransactionalAppender.checkpoint` commits them and returns what became canonical. It never folds
anything itself: the caller advances its in-memory state only with what ``checkpoint`` reports committed.

The appender reaches Kafka only through `settled.producers._txproducer.TransactionalProducer` (the confluent-kafka
producer, wrapped by the fault-injecting adapter that raises the broker errors the ``appender.*`` failpoints stand
for) and `settled.producers._txproducer.PartitionLog`; ``_transaction`` runs steps 2-5 and returns a
`settled.producers._policy.TransactionOutcome`.

The checkpoint, in numbered steps (the numbers appear in the code):

1. Size check: a batch with a record over the limit is replaced, before it joins, by the caller's typed failure
   batch (``replace_poison``), so one oversized record fails its own conversation, never the transaction.
2. Begin a transaction.
3. Produce every record of every joined batch to the owned partition, then flush, so a record-level delivery error
   is pinned on its batch.
4. Send the input offset — a low watermark that never passes an input whose effect is not yet canonical (or being
   made canonical by this transaction) — with the consumer group's metadata (KIP-447).
5. Commit.
6. On an abortable error: abort; pending facts are re-appended, never lost. Records failing in a shared transaction
   cannot be pinned on one batch (a broker rejects whole record batches), so every conversation of the group is then
   retried alone; one whose records fail alone twice with a record fault (oversized, invalid) is poison and replaced
   by ``replace_poison``. When no record failed (a rebalance fenced the group metadata, a coordinator error), the
   remaining batches are returned as deferred: the caller keeps them pending, polls (which rejoins the group) and
   checkpoints again. When the abort came from step 4 because the group coordinator was stale
   (``COORDINATOR_LOAD_IN_PROGRESS``, ``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE`` right after a broker restart),
   the next checkpoint first replaces the producer (``init_transactions`` on a new one, which fences the old):
   librdkafka 2.16's ``send_offsets_to_transaction`` on the producer that saw that error was seen to block past its
   timeout until the process was killed (librdkafka#5456, #5511; scenario 20 under CPU load). A membership refusal
   (``UNKNOWN_MEMBER_ID``, ``ILLEGAL_GENERATION``…) keeps the producer: the partition may already have a new owner,
   whose producer a new ``init_transactions`` here would fence (claim step 2 inverted); this one is fenced instead and
   its next checkpoint raises `ProducerFencedError`. On a retriable
   error: call the same function again. On a fatal error (``_FENCED`` included): raise; the caller drops the producer
   and the partition's in-memory state.
   What follows an abort is decided by the pure group policy, `settled.producers._policy.after_abort`.
7. When a commit or abort times out its outcome is unknown: replace the producer (its ``init_transactions`` fences
   any request still in flight; librdkafka has no KIP-890 part 2), check that no transaction is open on the log
   partition (LSO = high watermark), read the log tail written since this checkpoint began, and count the batches
   found there as committed; the rest go back to 2. No batch is ever written twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from settled._errors import ErrorCategory, SettledError
from settled._failpoints import failpoint
from settled._faults import fault_enabled
from settled._settings import Settings
from settled.producers._batches import AppendBatch, OutRecord, Run
from settled.producers._kafka import producer_config, transactional_id
from settled.producers._policy import Defer, Group, Replace, TransactionOutcome, after_abort, runs_of
from settled.producers._txproducer import (
    BATCH_ID_HEADER,
    KafkaPartitionLog,
    PartitionLog,
    TransactionalProducer,
    default_producer_factory,
)

__all__ = [
    "BATCH_ID_HEADER",
    "AppendBatch",
    "AppenderFatalError",
    "CheckpointResult",
    "OpenTransactionError",
    "OutRecord",
    "ProducerFencedError",
    "ProducerIdExpiredError",
    "Run",
    "TransactionObserver",
    "TransactionalAppender",
    "low_watermark",
]

_log = logging.getLogger(__name__)

_MAX_RETRIABLE = 20

#: Step-4 refusals that mean the producer's cached group coordinator is stale (after a broker restart): the producer
#: is replaced before the next checkpoint (step 6; librdkafka#5456, #5511). Membership refusals are not in it.
_STALE_COORDINATOR = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


class ProducerFencedError(SettledError):
    """A newer owner of the partition fenced this producer (``_FENCED``): drop the producer and the partition state."""

    category = ErrorCategory.CONFLICT


class AppenderFatalError(SettledError):
    """A fatal producer error, or an error with no retriable/abortable flag: drop the producer and partition state."""

    category = ErrorCategory.UNAVAILABLE


class ProducerIdExpiredError(AppenderFatalError):
    """The coordinator no longer maps the transactional.id to a producer id (``INVALID_PRODUCER_ID_MAPPING``).

    Fatal, never aborted: the id expired at the coordinator (``transactional.id.expiration.ms``) while this owner was
    stopped, so the partition may have a newer owner; re-acquiring the id would fence it. The caller drops the
    producer and the partition's state, and claims again only through the full claim order, after the group had a
    session timeout to revoke the partition.
    """


class OpenTransactionError(SettledError):
    """Another producer's transaction stays open on the log partition past the bound.

    Claim step 3 of docs/design.md §3.
    """

    category = ErrorCategory.UNAVAILABLE


@dataclass(frozen=True)
class CheckpointResult:
    """What one :meth:`TransactionalAppender.checkpoint` made canonical.

    Attributes:
        committed: The batches now committed, in commit order (replacements instead of the batches they replaced).
        replaced: ``(original run, replacement run)`` pairs for oversized or poison conversations.
        deferred: Batches not appended because a transaction aborted with no batch to blame (a rebalance, a
            coordinator error): the caller keeps them pending and checkpoints again after its next poll.
        input_offset: The inbox offset committed with the last transaction, or ``None`` if none was sent.
        transactions: How many transactions committed.
        aborts: How many transactions were aborted on the way.
    """

    committed: tuple[AppendBatch, ...]
    replaced: tuple[tuple[Run, Run], ...]
    deferred: tuple[AppendBatch, ...]
    input_offset: int | None
    transactions: int
    aborts: int


def low_watermark(pending_inputs: Sequence[int], canonical: set[int] | frozenset[int], next_offset: int) -> int:
    """Return the input offset a transaction may commit: never past an input whose effect is not canonical.

    Args:
        pending_inputs: Consumed inbox offsets not yet canonical before this transaction, ascending.
        canonical: Offsets this transaction (or an earlier one) makes canonical.
        next_offset: The offset after the last consumed input (what the consumer would commit if all were done).

    Returns:
        The lowest pending offset not in ``canonical``, or ``next_offset`` when every pending input is canonical.
    """
    for offset in pending_inputs:
        if offset not in canonical:
            return offset
    return next_offset


class TransactionObserver(Protocol):
    """Told about every transaction the appender committed (the worker's metrics, `settled._metrics.WorkerMetrics`)."""

    def transaction_committed(self, records: int, call_s: Mapping[str, float]) -> None:
        """One transaction committed.

        Args:
            records: The records it held (log, receipts, settlements, quarantine; 0 for one holding only offsets).
            call_s: Seconds spent in each of its Kafka calls, by name (``begin_transaction``, ``produce``, ``flush``,
                ``send_offsets_to_transaction``, ``commit_transaction``).
        """


@dataclass(frozen=True)
class _Attempt:
    """How one transaction (steps 2-5) ended, and the delivery error codes of its records, by batch id."""

    outcome: TransactionOutcome
    failed: dict[str, set[int]]


@dataclass
class TransactionalAppender:
    """The partition owner's transactional producer and its checkpoint (docs/design.md §3).

    Attributes:
        settings: Namespace, bootstrap servers, producer tuning and ``kafka_call_timeout_s``.
        partition: The owned partition (of the inbox, the log and every co-partitioned topic).
        input_topic: The inbox topic whose offsets commit with each transaction.
        group_metadata: Returns the group consumer's ``consumer_group_metadata()`` (KIP-447 fencing).
        replace_poison: Given one conversation's run of batches and the reason it cannot be appended (an oversized
            record, or the run failed alone twice), returns the batches to append instead — re-sealed on the
            conversation's committed chain, carrying a typed failure (e.g. a ``ToolCallSettled`` error
            ``result_too_large`` or a failed ``Settlement``) — deciding exactly the same ``inputs``.
        max_record_bytes: Largest record accepted, in bytes (the smaller of the topics' ``max.message.bytes`` and
            the producer's ``message.max.bytes``).
        open_transaction_wait_s: How long claim step 3 waits for a foreign open transaction, in seconds.
        producer_factory: Builds the transactional producer from its librdkafka configuration (default: the
            confluent-kafka producer inside the failpoints' fault-injecting one, `settled/producers/_txproducer.py`).
        partition_log: Reads the owned log partition (claim step 3, step 7); default: from the broker.
        observer: Told the record count and the Kafka calls' durations of every committed transaction; ``None``
            tells no one.
    """

    settings: Settings
    partition: int
    input_topic: str
    group_metadata: Callable[[], Any]
    replace_poison: Callable[[Run, str], Run]
    max_record_bytes: int = 1_000_000
    open_transaction_wait_s: float = 10.0
    producer_factory: Callable[[dict[str, Any]], TransactionalProducer] = default_producer_factory
    partition_log: PartitionLog | None = None
    observer: TransactionObserver | None = None
    #: What the last `open` took, in seconds: ``init_transactions`` (the fence, claim step 2; it aborts an open
    #: transaction of a previous producer with this ``transactional.id`` before it returns) and the wait for a foreign
    #: open transaction (step 3), and whether that wait saw one at all.
    last_fence_s: float = field(default=0.0, init=False)
    last_open_transaction_wait_s: float = field(default=0.0, init=False)
    last_saw_open_transaction: bool = field(default=False, init=False)
    _producer: TransactionalProducer | None = field(default=None, init=False, repr=False)
    _renew_producer: bool = field(default=False, init=False, repr=False)  # step 6: a stale coordinator refused offsets
    _log_end: int = field(default=0, init=False, repr=False)
    _delivered_log_offsets: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.partition_log is None:
            self.partition_log = KafkaPartitionLog(self.settings, self.log_topic, self.partition)

    @property
    def log_topic(self) -> str:
        """The canonical log topic."""
        return self.settings.topic("log")

    @property
    def timeout_s(self) -> float:
        """Bound on every transactional call, in seconds."""
        return self.settings.kafka_call_timeout_s

    # -- ownership ---------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Create the producer and fence every previous owner (claim step 2), then wait out open transactions (step 3).

        Raises:
            ProducerFencedError: A newer owner fenced us while we started.
            AppenderFatalError: ``init_transactions`` failed fatally.
            OpenTransactionError: A foreign transaction stayed open on the log partition past the bound.
        """
        started_s = time.monotonic()
        self._producer = self._new_producer()
        fenced_s = time.monotonic()
        self.last_saw_open_transaction = self.wait_no_open_transaction()
        self.last_fence_s, self.last_open_transaction_wait_s = fenced_s - started_s, time.monotonic() - fenced_s

    def close(self) -> None:
        """Drop the producer (after a revoke, a loss or a fatal error). Nothing is flushed or committed."""
        self._producer = None

    def _new_producer(self) -> TransactionalProducer:
        tid = transactional_id(self.settings, self.partition)
        producer = self.producer_factory(producer_config(self.settings, transactional_id=tid))
        self._call(lambda: producer.init_transactions(self.timeout_s), "init_transactions")
        _log.info("producer ready", extra={"transactional_id": tid, "partition": self.partition})
        return producer

    def wait_no_open_transaction(self) -> bool:
        """Wait until the log partition's LSO equals its high watermark (claim step 3, docs/design.md §3).

        A previous owner's transaction (same ``transactional.id``) is no longer open here: ``init_transactions`` aborted
        it (the coordinator writes its abort markers before the new producer id is granted), so this waits only for a
        foreign producer's transaction, which a healthy deployment never has on an owned log partition.

        Returns:
            Whether the first look saw an open transaction (then it waited for it to end).

        Raises:
            OpenTransactionError: It did not within ``open_transaction_wait_s``.
        """
        assert self.partition_log is not None  # set by __post_init__
        deadline = time.monotonic() + self.open_transaction_wait_s
        saw_open = False
        while True:
            ends = self.partition_log.end_offsets(self.timeout_s)
            if not ends.has_open_transaction:
                self._log_end = max(self._log_end, ends.last_stable)
                return saw_open
            saw_open = True
            if time.monotonic() > deadline:
                raise OpenTransactionError(
                    f"{self.log_topic}[{self.partition}] keeps a foreign open transaction: LSO {ends.last_stable} < "
                    f"high watermark {ends.high_watermark} after {self.open_transaction_wait_s} s"
                )
            time.sleep(0.1)

    # -- the checkpoint --------------------------------------------------------------------------------------------

    def checkpoint(
        self, batches: Sequence[AppendBatch], pending_inputs: Sequence[int], next_input_offset: int | None
    ) -> CheckpointResult:
        """Append ``batches`` and the input offset they make canonical, exactly once (see the module's steps).

        Args:
            batches: Encoded canonical batches of this partition's conversations, in decision order.
            pending_inputs: Consumed inbox offsets not yet canonical before this call, ascending (including the
                inputs of ``batches``).
            next_input_offset: The offset after the last consumed inbox record, or ``None`` to send no offset.

        Returns:
            What became canonical.

        Raises:
            ProducerFencedError: This producer was fenced; nothing more may be appended by it.
            AppenderFatalError: A fatal producer error.
            OpenTransactionError: After an outcome-unknown commit, a foreign transaction stayed open.
        """
        if self._producer is None:
            raise AppenderFatalError("checkpoint() before open(): the partition has no producer")
        if self._renew_producer:
            self._renew()
        committed: list[AppendBatch] = []
        replaced: list[tuple[Run, Run]] = []
        canonical: set[int] = set()
        transactions = aborts = 0
        input_offset: int | None = None
        deferred: list[AppendBatch] = []

        # Step 1: size check before joining.
        joined: list[Run] = []
        for run in runs_of(batches):
            sizes = [b.largest_record_bytes for b in run]
            if max(sizes) > self.max_record_bytes:
                run = self._replacement(
                    run, f"record of {max(sizes)} bytes exceeds the limit of {self.max_record_bytes} bytes", replaced
                )
            joined.append(run)

        # With nothing to append but an input offset to move (inputs re-read after a restart whose decisions are
        # already canonical), one transaction carries just the offset.
        queue: list[Group] = [Group(tuple(joined))] if joined or next_input_offset is not None else []
        while queue:
            group = queue.pop(0)
            group_batches = group.batches()
            include = {o for b in group_batches for o in b.inputs} | canonical
            offset = None if next_input_offset is None else low_watermark(pending_inputs, include, next_input_offset)
            attempt = self._transaction(group_batches, offset)
            if attempt.outcome is TransactionOutcome.COMMITTED:
                committed.extend(group_batches)
                canonical |= {o for b in group_batches for o in b.inputs}
                transactions += 1
                input_offset = offset
                continue
            if attempt.outcome is TransactionOutcome.UNKNOWN:
                # Step 7: the outcome is unknown. Fence whatever is in flight, then read what the log holds.
                read_from = self._log_end  # the log end before this transaction (the wait below moves _log_end)
                try:
                    self._producer = self._new_producer()
                    self.wait_no_open_transaction()
                    landed = self._batch_ids_since(read_from)
                except KafkaException as exc:
                    # Still unreachable: the outcome stays unknown. Give the partition up; its next claim fences,
                    # checks and restores from the log, and re-decides whatever did not land.
                    self._producer = None
                    raise AppenderFatalError(f"partition {self.partition}: commit outcome unknown and {exc}") from exc
                done = [b for b in group_batches if b.batch_id in landed]
                if done:  # a transaction is all or nothing: either every batch landed or none did
                    transactions += 1
                    committed.extend(done)
                    canonical |= {o for b in done for o in b.inputs}
                    input_offset = offset
                else:
                    queue.insert(0, group)
                continue
            # Step 6: aborted; the group policy (settled/producers/_policy.py) decides what follows.
            aborts += 1
            decision = after_abort(group, attempt.failed)
            if isinstance(decision, Defer):
                deferred = [b for g in [group, *queue] for b in g.batches()]
                break
            if isinstance(decision, Replace):
                queue[0:0] = [
                    Group((self._replacement(run, decision.reason, replaced),), alone=True) for run in decision.runs
                ]
                continue
            queue[0:0] = decision.groups
        return CheckpointResult(tuple(committed), tuple(replaced), tuple(deferred), input_offset, transactions, aborts)

    def _renew(self) -> None:
        """Replace the producer before this checkpoint's first transaction (step 6: the offsets were refused).

        Called at the start of the checkpoint after the one that aborted, so after the caller's poll: a revoke in that
        poll dropped the partition instead. The old producer's transaction was aborted; the new one's
        ``init_transactions`` fences it.

        Raises:
            AppenderFatalError: The new producer could not be initialised (the caller claims the partition again).
        """
        self._renew_producer = False
        try:
            self._producer = self._new_producer()
        except KafkaException as exc:
            raise self._fatal(exc.args[0]) from exc  # `_FENCED`: a newer owner took the partition meanwhile
        except AppenderFatalError:
            self._producer = None
            raise

    def _replacement(self, run: Run, reason: str, replaced: list[tuple[Run, Run]]) -> Run:
        failpoint("appender.before_replacement")
        replacement = tuple(self.replace_poison(run, reason))
        before = {o for b in run for o in b.inputs}
        after = {o for b in replacement for o in b.inputs}
        if before != after:
            raise AppenderFatalError(
                f"replacement of conversation {run[0].conversation_id}'s batches decides inputs {sorted(after)}, "
                f"not {sorted(before)}"
            )
        if any(b.largest_record_bytes > self.max_record_bytes for b in replacement):
            raise AppenderFatalError(
                f"replacement of conversation {run[0].conversation_id}'s batches is over the limit"
            )
        _log.warning("batches replaced", extra={"conversation_id": run[0].conversation_id, "reason": reason})
        replaced.append((run, replacement))
        return replacement

    def _transaction(self, batches: Sequence[AppendBatch], input_offset: int | None) -> _Attempt:
        """Run steps 2-5 once.

        Args:
            batches: The group's batches.
            input_offset: The input offset to commit with them (step 4), or ``None``.

        Returns:
            The outcome, with the delivery error codes of the records that failed, by batch id.

        Raises:
            ProducerFencedError: A newer owner fenced this producer.
            ProducerIdExpiredError: The coordinator no longer maps the ``transactional.id`` to a producer id.
            AppenderFatalError: Any other fatal error, or an error neither retriable nor abortable.
        """
        producer = self._producer
        assert producer is not None  # checked by checkpoint()
        failed: dict[str, set[int]] = {}
        self._delivered_log_offsets.clear()
        sending_offsets = False
        clock = time.perf_counter
        t0 = clock()
        try:
            if input_offset is not None and fault_enabled("offsets_in_separate_transaction"):
                self._offsets_in_their_own_transaction(producer, input_offset)
                input_offset = None
            # Step 2.
            self._call(producer.begin_transaction, "begin_transaction")
            t1 = clock()
            # Step 3.
            for batch in batches:
                self._produce_batch(producer, batch, failed)
            t2 = clock()
            remaining = producer.flush(self.timeout_s)
            t3 = clock()
            if remaining:
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{remaining} records not delivered"))
            failpoint("appender.after_produce")  # every record is on the broker, uncommitted
            if failed:
                raise KafkaException(KafkaError(KafkaError._INCONSISTENT, f"delivery failed for batches {failed}"))
            # Step 4.
            if input_offset is not None:
                offsets = [TopicPartition(self.input_topic, self.partition, input_offset)]
                meta = self.group_metadata()
                sending_offsets = True
                self._call(
                    lambda: producer.send_offsets_to_transaction(offsets, meta, self.timeout_s),
                    "send_offsets_to_transaction",
                )
                sending_offsets = False
            t4 = clock()
            # Step 5.
            failpoint("appender.before_commit")
            self._call(lambda: producer.commit_transaction(self.timeout_s), "commit_transaction")
            t5 = clock()
        except KafkaException as exc:
            return _Attempt(self._failed_transaction(producer, exc, sending_offsets), failed)
        if self._delivered_log_offsets:
            self._log_end = max(self._log_end, max(self._delivered_log_offsets) + 1)
        if self.observer is not None:
            self.observer.transaction_committed(
                sum(len(b.records) for b in batches),
                {
                    "begin_transaction": t1 - t0,
                    "produce": t2 - t1,
                    "flush": t3 - t2,
                    "send_offsets_to_transaction": t4 - t3,
                    "commit_transaction": t5 - t4,
                },
            )
        failpoint("appender.after_commit")
        return _Attempt(TransactionOutcome.COMMITTED, failed)

    def _failed_transaction(
        self, producer: TransactionalProducer, exc: KafkaException, sending_offsets: bool
    ) -> TransactionOutcome:
        """Classify a failed transaction: abort it when the error asks for it (step 6), or raise when it is fatal.

        Args:
            producer: The transaction's producer.
            exc: What steps 2-5 raised.
            sending_offsets: Whether it came from step 4.

        Returns:
            ``ABORTED``, or ``UNKNOWN`` when the commit or the abort timed out (step 7).

        Raises:
            ProducerFencedError: A newer owner fenced this producer.
            ProducerIdExpiredError: The coordinator no longer maps the ``transactional.id`` to a producer id.
            AppenderFatalError: Any other fatal error, or an error neither retriable nor abortable.
        """
        err: KafkaError = exc.args[0]
        if err.fatal():
            raise self._fatal(err) from exc
        if err.code() == KafkaError._TIMED_OUT:
            return TransactionOutcome.UNKNOWN
        if err.code() == KafkaError.INVALID_PRODUCER_ID_MAPPING:
            # Fatal, as in Kafka's own clients: aborting would have librdkafka re-acquire the transactional.id
            # (a new producer id or epoch), fencing whoever owns the partition now. The producer is dropped
            # without aborting; the coordinator aborts its transaction after transaction.timeout.ms.
            raise self._fatal(err) from exc
        if not (err.txn_requires_abort() or err.code() in (KafkaError._INCONSISTENT, KafkaError._APPLICATION)):
            raise self._fatal(err) from exc
        _log.warning("transaction aborted", extra={"error": str(err), "partition": self.partition})
        try:
            self._call(lambda: producer.abort_transaction(self.timeout_s), "abort_transaction")
        except KafkaException as abort_exc:
            if abort_exc.args[0].code() == KafkaError._TIMED_OUT:
                return TransactionOutcome.UNKNOWN
            raise self._fatal(abort_exc.args[0]) from abort_exc
        # Step 6: a stale group coordinator refused the offsets: a new producer for the next checkpoint.
        self._renew_producer = sending_offsets and err.code() in _STALE_COORDINATOR
        return TransactionOutcome.ABORTED

    def _offsets_in_their_own_transaction(self, producer: TransactionalProducer, input_offset: int) -> None:
        """Fault switch ``offsets_in_separate_transaction``: commit the input offset alone, before the records.

        The classic "offset stored before the durable write": a crash in between loses inputs. Breaks DUR-002.
        """
        self._call(producer.begin_transaction, "begin_transaction")
        offsets = [TopicPartition(self.input_topic, self.partition, input_offset)]
        meta = self.group_metadata()
        self._call(
            lambda: producer.send_offsets_to_transaction(offsets, meta, self.timeout_s), "send_offsets_to_transaction"
        )
        self._call(lambda: producer.commit_transaction(self.timeout_s), "commit_transaction")
        failpoint("appender.between_split_transactions")

    def _produce_batch(self, producer: TransactionalProducer, batch: AppendBatch, failed: dict[str, set[int]]) -> None:
        batch_id, log_topic, delivered = batch.batch_id, self.log_topic, self._delivered_log_offsets

        def on_delivery(err: KafkaError | None, msg: Any) -> None:  # one callback per batch, not per record
            if err is not None:
                _log.warning("delivery failed", extra={"batch_id": batch_id, "error": str(err)})
                failed.setdefault(batch_id, set()).add(err.code())
            elif msg.topic() == log_topic:
                delivered.append(msg.offset())

        for rec in batch.records:
            while True:
                try:
                    producer.produce(
                        rec.topic,
                        value=rec.value,
                        key=rec.key,
                        partition=self.partition,
                        headers=list(rec.headers),
                        on_delivery=on_delivery,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)  # local queue full: serve delivery reports, then try again
                except KafkaException as exc:
                    err: KafkaError = exc.args[0]
                    if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                        failed.setdefault(batch_id, set()).add(err.code())
                        raise KafkaException(KafkaError(KafkaError._INCONSISTENT, str(err))) from exc
                    raise

    def _call(self, fn: Callable[[], Any], what: str) -> Any:
        """Call a transactional API, repeating it while it fails with a retriable error, within one call's timeout."""
        deadline = time.monotonic() + self.timeout_s
        for _ in range(_MAX_RETRIABLE):
            try:
                return fn()
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.retriable() and err.code() != KafkaError._TIMED_OUT and time.monotonic() < deadline:
                    time.sleep(self.settings.retry_backoff_ms / 1000)
                    continue
                if err.retriable() and err.code() != KafkaError._TIMED_OUT:
                    raise AppenderFatalError(
                        f"{what} kept failing with a retriable error for {self.timeout_s} s: {err}"
                    ) from exc
                raise
        raise AppenderFatalError(f"{what} still failed with a retriable error after {_MAX_RETRIABLE} calls")

    def _fatal(self, err: KafkaError) -> Exception:
        self._producer = None
        if err.code() == KafkaError._FENCED:
            return ProducerFencedError(f"partition {self.partition}: fenced by a newer owner ({err})")
        if err.code() == KafkaError.INVALID_PRODUCER_ID_MAPPING:
            return ProducerIdExpiredError(
                f"partition {self.partition}: the coordinator no longer maps this transactional.id to a producer id "
                f"(transactional.id.expiration.ms passed while this owner was stopped?): {err}"
            )
        return AppenderFatalError(f"partition {self.partition}: fatal producer error {err}")

    def _batch_ids_since(self, start_offset: int) -> set[str]:
        assert self.partition_log is not None  # set by __post_init__
        return self.partition_log.batch_ids_since(start_offset, 30.0)
