"""The worker process loop: one consumer group over ``settled.inbox``, one `PartitionOwner` per owned partition.

Single-threaded: each turn polls the group consumer, hands every record to its partition's owner, then checkpoints
every owner with pending work. A newly assigned partition is paused at once (claim step 1) and claimed in the loop
(steps 2-5), then resumed (step 6). A revoked partition (SIGTERM, a rebalance) is released gracefully: its conductor
starts nothing new, its running attempts get ``Settings.revoke_grace_s`` to finish and commit their settlements, the
rest are recorded as ``AttemptInterrupted("graceful_revoke")``, it is checkpointed, then dropped; a lost one is
dropped at once, appending nothing. An owner that gets fenced is dropped; one that hits another fatal
producer error is dropped and claimed again from the log. docs/design.md §3.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from settled._errors import ErrorCategory, SettledError
from settled._failpoints import failpoint
from settled._faults import fault_enabled
from settled._metrics import WorkerMetrics
from settled._settings import Settings
from settled.processors._batch_probe import failing_batch_last_offset, probe_consumer_config
from settled.processors._conductor import HeldSettlement, ResumeGate
from settled.processors._inbox import decode_input
from settled.processors._partition import Decider, InboxInput, PartitionOwner
from settled.processors._watchdog import PhaseStamp, TurnWatchdog, turn_watchdog_s
from settled.producers import (
    TOPICS,
    AppenderFatalError,
    OpenTransactionError,
    PartitionCountMismatchError,
    ProducerFencedError,
    ProducerIdExpiredError,
    TopicInfo,
    TransactionalAppender,
    admin_config,
    consume_promptly,
    consumer_config,
    describe_topics,
    producer_config,
)
from settled.schemas import Codec, LogBatch, QuarantineReason

__all__ = [
    "INSTANCE_FENCED_EXIT_CODE",
    "MEMBERSHIP_LOST_EXIT_CODE",
    "InstanceFencedError",
    "InstanceHolder",
    "StaticMembershipLostError",
    "Worker",
    "WorkerConfig",
    "instance_fence_error",
]

_log = logging.getLogger(__name__)

S = TypeVar("S")


#: Consumer errors that say nothing about a record: logged, never quarantined.
_TRANSIENT = frozenset(
    {
        KafkaError._PARTITION_EOF,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._MAX_POLL_EXCEEDED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)


#: Consumer errors about the records at their offset (issue 4 item 6): the batch there is quarantined and skipped.
#: Any other error that names an offset (e.g. ``TOPIC_AUTHORIZATION_FAILED`` at the fetch position) is about the
#: fetch, not the record, and is logged.
_RECORD_ERRORS = frozenset(
    {
        KafkaError._BAD_COMPRESSION,  # e.g. a zstd batch decompressing past receive.message.max.bytes
        KafkaError._BAD_MSG,  # a CRC mismatch or a record that does not parse
        KafkaError.INVALID_MSG,  # the broker's CORRUPT_MESSAGE
        KafkaError.MSG_SIZE_TOO_LARGE,  # a batch larger than receive.message.max.bytes
        KafkaError._NOT_IMPLEMENTED,  # an unsupported compression codec or message format
    }
)


#: librdkafka's default producer ``message.max.bytes``: the largest record it sends, framing included, in bytes.
PRODUCER_MESSAGE_MAX_BYTES = 1_000_000

#: What a record's framing adds to its key, value and headers, in bytes, with room to spare (a record batch's header
#: is 61 bytes, a record's varints at most 41, its header's 10; measured: librdkafka refuses a record whose key, value
#: and one header total 999,980 bytes against its 1,000,000-byte ``message.max.bytes``, and takes 999,960).
RECORD_OVERHEAD_BYTES = 256

#: How long a partition whose claim failed (broker unreachable, open foreign transaction) waits before the next try.
_CLAIM_RETRY_S = 1.0

#: Errors of the topic check that mean no broker answered (unreachable, timed out, its name not resolved yet): the
#: worker waits and asks again (`Worker._check_topics`) instead of exiting, which a supervisor would turn into a
#: restart loop. Any other error (a missing topic, authorization) still fails at once.
_BROKER_UNREACHABLE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._RESOLVE,
    }
)

#: The first wait before asking an unreachable broker again, in seconds; each further wait doubles, up to
#: `BROKER_WAIT_MAX_S`.
BROKER_WAIT_FIRST_S = 0.5

#: The longest wait between two tries of an unreachable broker, in seconds (librdkafka's ``reconnect.backoff.max.ms``
#: default is 10 s too).
BROKER_WAIT_MAX_S = 10.0

#: How often the loop thread looks at the stop flag while the topic check's admin calls run, in seconds.
_STOP_CHECK_S = 0.1


def broker_wait_s(tries: int) -> float:
    """How long the worker waits after its ``tries``-th unanswered topic check before the next one, in seconds.

    Args:
        tries: How many checks in a row the broker has not answered (1 after the first).

    Returns:
        `BROKER_WAIT_FIRST_S` doubled per further try, at most `BROKER_WAIT_MAX_S`.

    Raises:
        ValueError: ``tries`` is below 1.
    """
    if tries < 1:
        raise ValueError(f"tries must be at least 1, got {tries}")
    return min(BROKER_WAIT_MAX_S, BROKER_WAIT_FIRST_S * 2.0 ** min(tries - 1, 32))


def _broker_unreachable(exc: BaseException) -> bool:
    """Whether a topic check's error says only that no broker answered (module constant `_BROKER_UNREACHABLE`)."""
    if isinstance(exc, TimeoutError):  # an admin future's result(timeout=...) ran out
        return True
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0].code() in _BROKER_UNREACHABLE
    return False


#: Bound on a claim's restore (reading the whole log partition, claim step 4), in seconds; the turn watchdog gives a
#: claim this much on top of its turn bound.
_RESTORE_TIMEOUT_S = 120.0


#: ``settled worker``'s exit code when another worker with its ``SETTLED_WORKER_INSTANCE_ID`` fenced it (Kafka's
#: ``FENCED_INSTANCE_ID``): ``EX_CONFIG``, a configuration error. A supervisor must not restart it as is (systemd
#: ``RestartPreventExitStatus=78``): restarted, it would fence the other worker, which would exit in turn, a crash loop.
INSTANCE_FENCED_EXIT_CODE = 78


class InstanceFencedError(SettledError):
    """Another worker joined the group with this worker's ``group.instance.id`` and fenced it (``FENCED_INSTANCE_ID``).

    Two running workers were given one ``SETTLED_WORKER_INSTANCE_ID``: a configuration error, not a crash. The worker
    stops (appending nothing more) and ``settled worker`` exits with `INSTANCE_FENCED_EXIT_CODE`.
    """

    category = ErrorCategory.CONFLICT


#: ``settled worker``'s exit code when the broker fenced its static membership but no live member holds its instance
#: id (a broker restart can lose a member's join): ``EX_TEMPFAIL``, as the turn watchdog's; restart it.
MEMBERSHIP_LOST_EXIT_CODE = 75


class StaticMembershipLostError(SettledError):
    """The broker fenced this worker's ``group.instance.id`` but no live member holds it (``FENCED_INSTANCE_ID``).

    A broker restart can leave the group coordinator holding a join of this worker's that the worker never heard
    answered: the worker's next request carries a member id the coordinator replaced, and librdkafka reports the fence
    as fatal. The join the coordinator kept is nobody's, so it expires after the session timeout, and a restarted
    worker rejoins with the id at once: the worker stops (appending nothing more) and ``settled worker`` exits with
    `MEMBERSHIP_LOST_EXIT_CODE`.
    """

    category = ErrorCategory.UNAVAILABLE


class _FenceSeen(Exception):
    """The loop's consumer reported a static member's fence; `Worker.run` judges it once the loop has ended."""


@dataclass(frozen=True)
class InstanceHolder:
    """A group member holding a ``group.instance.id``, as the group coordinator describes it.

    The coordinator keeps a static member's ``client.id`` and host from its first join when a later join with the
    same instance id replaces it (seen on Kafka 4.1), so only the member id tells one join from another.

    Attributes:
        member_id: The member id the coordinator gave the join holding the instance id.
        host: The address that member's first join came from.
    """

    member_id: str
    host: str


def instance_fence_error(
    group_id: str, instance_id: str, reason: str, holders: list[InstanceHolder] | None
) -> InstanceFencedError | StaticMembershipLostError:
    """Tell a fence by a twin (another live worker with this instance id) from a lost membership.

    Args:
        group_id: The workers' consumer group.
        instance_id: This worker's ``group.instance.id``.
        reason: librdkafka's error text.
        holders: The group's members holding ``instance_id`` once a session timeout has passed since the fence
            (a live twin heartbeats and stays; this worker's own lost join expires); None when the group could
            not be described.

    Returns:
        `InstanceFencedError` naming the holder when one is still there, else `StaticMembershipLostError` (none is;
        or, with ``holders`` None, none could be confirmed: the restarted worker then fences a twin, if there is
        one, and the twin finds this one live in its turn, so the two never loop).
    """
    if holders:
        named = ", ".join(f"member {h.member_id} (first joined from {h.host})" for h in holders)
        return InstanceFencedError(
            f"another worker joined group {group_id} with this worker's instance id "
            f"SETTLED_WORKER_INSTANCE_ID={instance_id!r} and fenced it ({reason}); it still holds the id a session "
            f"timeout later: {named}. Each running worker needs its own instance id; this one stops"
        )
    found = "could not be described" if holders is None else "has no member with it a session timeout later"
    return StaticMembershipLostError(
        f"group {group_id} fenced this worker's instance id SETTLED_WORKER_INSTANCE_ID={instance_id!r} ({reason}), "
        f"but the group {found}: the broker lost this worker's membership (a broker restart can); this one stops "
        "to be restarted"
    )


#: How often the fenced worker describes its group while it waits for a lost join to expire, in seconds.
_FENCE_POLL_S = 0.5

#: Most claims run side by side (`Worker._claim`): each holds a producer and, in turn, two offset readers and a log
#: reader.
_PARALLEL_CLAIMS = 12


def _claim_outcome(owner: PartitionOwner[Any]) -> BaseException | None:
    """Run ``owner.claim`` (steps 2-5) and return what it raised, or None; on a claim thread of `Worker._claim`."""
    try:
        owner.claim(_RESTORE_TIMEOUT_S)
    except BaseException as exc:  # noqa: BLE001 - handed to the loop's thread, which handles or re-raises it
        return exc
    return None


#: Most checkpoints run side by side (`Worker._checkpoint_all`): one per owned partition with pending work.
_PARALLEL_CHECKPOINTS = 12


@dataclass(frozen=True)
class _Checkpointed:
    """How one owner's checkpoint ended (`_checkpoint_outcome`).

    Attributes:
        error: The producer error the loop handles by dropping the partition (`Worker._checkpointed`), or None.
        commit_s: Seconds the checkpoint took when it committed batches (for the commit metric), else None.
    """

    error: ProducerFencedError | AppenderFatalError | None = None
    commit_s: float | None = None


def _checkpoint_outcome(owner: PartitionOwner[Any]) -> _Checkpointed:
    """Run ``owner.checkpoint()`` and say how it ended; any other exception propagates.

    Called on the loop's thread, or on a checkpoint thread of `Worker._checkpoint_all`: it touches only that owner,
    its appender and its producer.
    """
    started_s = time.perf_counter()
    try:
        committed = owner.checkpoint()
    except (ProducerFencedError, AppenderFatalError) as exc:  # ProducerIdExpiredError is an AppenderFatalError
        return _Checkpointed(error=exc)
    return _Checkpointed(commit_s=time.perf_counter() - started_s if committed else None)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class WorkerConfig:
    """Tuning of the worker loop.

    Attributes:
        poll_timeout_s: How long one poll waits for records, in seconds, while no run is in flight.
        busy_wait_s: While runs are in flight, the loop polls without waiting and then waits at most this long
            for a run to hand over a record or end (it wakes at once when one does), so inbox records are still
            read within about this bound.
        max_poll_records: Most records taken per poll (and so per group-commit transaction per partition).
        max_input_bytes: settled's hard size limit for one inbox record value, in bytes; larger ones are quarantined.
        max_record_bytes: Largest record (key, value and headers) the appender produces, in bytes; ``None`` (the
            default) takes the smallest of the ``max.message.bytes`` of the topics it writes and the producer's
            ``message.max.bytes`` (librdkafka's default 1,000,000), less `RECORD_OVERHEAD_BYTES`. An explicit value
            overrides them (a test uses a value above a topic's limit to exercise the broker's own rejection).
        fetch_max_bytes: The group consumer's ``fetch.max.bytes`` (librdkafka's default).
        receive_message_max_bytes: The group consumer's ``receive.message.max.bytes`` (librdkafka's default; at
            least ``fetch_max_bytes + 512``): the largest fetch response, and the most one compressed record batch
            may decompress to. A batch decompressing past it is quarantined whole (issue 4 item 6); keep it above
            the inbox topic's ``max.message.bytes``.
        consumer_overrides: Further librdkafka properties of the group consumer (e.g. ``max.poll.interval.ms``).
        parallel_checkpoints: Whether the checkpoints of a turn's partitions with pending work run side by side
            (each on its own producer, so their round trips to the broker overlap) instead of one after the other
            (docs/architecture.md, "Records per transaction (issue 24 item 3)").
        turn_watchdog_s: Bound on one phase of a turn (a poll, one partition's checkpoint), in seconds: past it the
            process logs CRITICAL naming the phase, dumps every thread's stack and exits with
            ``WATCHDOG_EXIT_CODE`` (75) so a supervisor restarts it (librdkafka#5456; `settled.processors._watchdog`).
            A claim gets the restore and open-transaction bounds on top, a graceful release ``revoke_grace_s``.
            ``None`` takes ``Settings.worker_turn_watchdog_s`` (unset: `default_turn_watchdog_s`); 0 disables it.
    """

    poll_timeout_s: float = 0.05
    busy_wait_s: float = 0.005
    max_poll_records: int = 500
    max_input_bytes: int = 1_000_000
    max_record_bytes: int | None = None
    fetch_max_bytes: int = 52_428_800
    receive_message_max_bytes: int = 100_000_000
    consumer_overrides: Mapping[str, str | int] = field(default_factory=dict)
    parallel_checkpoints: bool = True
    turn_watchdog_s: float | None = None

    @property
    def consumer_limits(self) -> dict[str, int]:
        """The size properties of the group consumer (and of the probe that must fail where it fails)."""
        return {"fetch.max.bytes": self.fetch_max_bytes, "receive.message.max.bytes": self.receive_message_max_bytes}


class PartitionConductor(Protocol):
    """What runs beside a partition's owner: attempts, scheduling (see `settled.processors.Conductor`)."""

    def before_checkpoint(self) -> None:
        """Stage what finished runs and the scheduler decided."""
        ...

    def after_checkpoint(self) -> None:
        """Act on what just committed (start runs, cancel aborted ones)."""
        ...

    def close(self) -> None:
        """Stop everything of the partition (its ownership ended)."""
        ...


@runtime_checkable
class DrainingConductor(PartitionConductor, Protocol):
    """A conductor that can release its partition gracefully (see `settled.processors.Conductor`; docs/design.md §3)."""

    def begin_drain(self) -> None:
        """Start no new attempt or tool call; let running runs finish."""
        ...

    @property
    def drained(self) -> bool:
        """Whether no run can still settle."""
        ...

    def interrupt_remaining(self) -> int:
        """Stage ``AttemptInterrupted("graceful_revoke")`` for the attempts still running; return how many."""
        ...


@runtime_checkable
class ProcessMember(Protocol):
    """A conductor that shares the worker process's wake-up and death gate (see `settled.processors.Conductor`)."""

    def join_process(self, wake: Callable[[], None], gate: ResumeGate) -> None:
        """Wake the loop through ``wake`` when there is work; share ``gate`` with the process's other conductors."""
        ...


@runtime_checkable
class HoldingConductor(Protocol):
    """A conductor whose uncommitted tool results outlive a drop of its partition (see `settled.processors.Conductor`).

    A tool result that returns while the broker is unreachable cannot commit; the partition is then dropped (lost, a
    fatal producer error). The worker keeps the results and hands them to its next claim of the partition when that
    claim directly follows its own (no other owner in between), so the call settles instead of going Unknown.
    """

    def unsent_settlements(self) -> tuple[HeldSettlement, ...]:
        """The tool results not committed when the conductor was closed."""
        ...

    def adopt(self, held: tuple[HeldSettlement, ...]) -> None:
        """Commit ``held`` (results the previous owner of this process could not) before recovery runs."""
        ...


@dataclass
class Worker(Generic[S]):
    """A settled worker process: consumes the inbox, owns partitions, appends canonical batches.

    Attributes:
        settings: Namespace, Kafka and group settings.
        decider_factory: Builds the decider for a partition.
        config: Loop tuning.
        clock: Returns "now" (aware UTC).
        worker_id: This process's id (recorded in ``OwnershipClaimed``).
        codec: The record codec (single-object encoding unless a registry is configured).
        conductor_factory: Builds what runs beside each claimed partition's owner (attempts); ``None`` for a loop
            that only decides inputs.
        metrics: Where checkpoint commit durations and each transaction's records and Kafka call durations are
            observed (``SETTLED_METRICS_PORT``); None observes nothing.
    """

    settings: Settings
    decider_factory: Callable[[int], Decider[S]]
    config: WorkerConfig = field(default_factory=WorkerConfig)
    clock: Callable[[], datetime] = _utcnow
    worker_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    codec: Codec = field(default_factory=Codec)
    conductor_factory: Callable[[PartitionOwner[S]], PartitionConductor] | None = None
    metrics: WorkerMetrics | None = None
    conductors: dict[int, PartitionConductor] = field(default_factory=dict, init=False)
    owners: dict[int, PartitionOwner[S]] = field(default_factory=dict, init=False)
    _to_claim: set[int] = field(default_factory=set, init=False)
    _claim_not_before: dict[int, float] = field(default_factory=dict, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _consumer: Consumer | None = field(default=None, init=False)
    _skip_below: dict[int, int] = field(default_factory=dict, init=False)
    _record_limit: int = field(default=1_000_000, init=False)
    _partition_count: int = field(default=0, init=False)
    _wake: threading.Event = field(default_factory=threading.Event, init=False)  # set by conductors with work
    _gate: ResumeGate = field(default_factory=ResumeGate, init=False)  # shared by this process's conductors
    _stamp: PhaseStamp = field(default_factory=PhaseStamp, init=False)  # what the loop does now (the watchdog's)
    _turn_bound_s: float = field(default=0.0, init=False)  # 0: no watchdog (set by run())
    _checkpoint_pool: ThreadPoolExecutor | None = field(default=None, init=False)  # `_checkpoint_all`'s threads
    # Per partition dropped with tool results not committed: the dropped owner's epoch and those results.
    _held: dict[int, tuple[int, tuple[HeldSettlement, ...]]] = field(default_factory=dict, init=False)

    @property
    def partition_count(self) -> int:
        """The topics' partition count, known once `run` has checked the topics."""
        return self._partition_count

    @property
    def group_id(self) -> str:
        """The workers' consumer group."""
        return f"{self.settings.namespace}.{self.settings.app_id}.workers"

    def stop(self) -> None:
        """Ask the loop to finish its turn, checkpoint, leave the group and return (a graceful revoke)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """Make SIGTERM and SIGINT a graceful stop."""

        def handler(_sig: int, _frame: FrameType | None) -> None:
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Run the loop until `stop` is called (or ``until()`` is true).

        While it runs, a `TurnWatchdog` thread ends the process with ``WATCHDOG_EXIT_CODE`` when one phase of a turn
        runs past ``WorkerConfig.turn_watchdog_s`` (0 disables it).

        Args:
            until: Optional predicate checked every turn.

        Raises:
            ValueError: The configured watchdog bound is negative or not finite.
            InstanceFencedError: Another live worker holds this worker's ``group.instance.id``.
            StaticMembershipLostError: The broker fenced that id and no live member holds it.
        """
        self._turn_bound_s = turn_watchdog_s(self.config.turn_watchdog_s, self.settings)
        watchdog: TurnWatchdog | None = None
        if self._turn_bound_s > 0:
            watchdog = TurnWatchdog(self._stamp, TurnWatchdog.interval_for(self._turn_bound_s))
            watchdog.start()
        fence: _FenceSeen | None = None
        try:
            self._run(until)
        except _FenceSeen as exc:
            fence = exc
        finally:
            if watchdog is not None:
                watchdog.stop()
        if fence is not None:  # every partition is dropped and the consumer closed: judge who fenced it
            raise self._judge_fence(str(fence)) from fence

    @contextmanager
    def _phase(self, name: str, extra_s: float = 0.0) -> Iterator[None]:
        """Stamp what the loop does for the turn watchdog: ``name`` may take the turn bound plus ``extra_s``."""
        if self._turn_bound_s <= 0:
            yield
            return
        with self._stamp.phase(name, self._turn_bound_s + extra_s):
            yield

    def _run(self, until: Callable[[], bool] | None) -> None:
        if not self._check_topics():
            _log.info("worker stopped while waiting for the broker", extra={"worker_id": self.worker_id})
            return
        static: dict[str, str] = {}
        if self.settings.worker_instance_id is not None:
            # Static membership (KIP-345): a restart with the same id gets the member's partitions back at once.
            static["group.instance.id"] = self.settings.worker_instance_id
        consumer = Consumer(
            consumer_config(
                self.settings,
                self.group_id,
                **self.config.consumer_limits,
                **static,
                **dict(self.config.consumer_overrides),
            )
        )
        self._consumer = consumer
        _log.info(
            "worker started",
            extra={
                "group": self.group_id,
                "instance_id": self.settings.worker_instance_id,
                "worker_id": self.worker_id,
            },
        )
        consumer.subscribe(
            [self.settings.topic("inbox")], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        try:
            while not self._stop.is_set() and not (until is not None and until()):
                with self._phase("turn"):
                    self.turn()
            self._release(sorted(self.owners))  # a graceful revoke of every partition (docs/design.md §3)
        except BaseException:
            # An unhandled error ends the loop: drop every partition, appending nothing, so the runs' waits on
            # their records end (a run waiting for a commit that never comes would keep the process from exiting).
            for p in sorted(self.owners):
                self._drop(p)
            raise
        finally:
            if self._checkpoint_pool is not None:
                self._checkpoint_pool.shutdown(wait=True)  # idle here: every checkpoint of a turn is waited for
                self._checkpoint_pool = None
            with self._phase("closing the group consumer"):
                consumer.close()  # leaves the group: the partitions move at once
            self._consumer = None

    def _check_topics(self) -> bool:
        """Check the topics before joining the group, waiting for the broker as long as it does not answer.

        A try that fails because no broker answered (`_broker_unreachable`) is logged (``waiting for the broker``,
        with its cause and the wait) and repeated after `broker_wait_s`; `stop` ends the wait at once, also while a
        try's admin calls still wait for the broker. Each try is its own watchdog phase (``checking the topics``);
        the waits between tries are in none, so the turn watchdog never ends a worker that waits for its broker.

        Returns:
            True once the topics are checked; False when `stop` was called first.

        Raises:
            PartitionCountMismatchError: A topic is missing, or the topics are not co-partitioned.
            KafkaException: An admin call failed for another reason than an unreachable broker.
        """
        tries = 0
        while not self._stop.is_set():
            # Every admin call of the check is bounded by kafka_call_timeout_s: one listing, one per topic's configs.
            cause: Exception | None = None
            with self._phase("checking the topics", extra_s=len(TOPICS) * self.settings.kafka_call_timeout_s):
                try:
                    infos = self._describe_topics()
                except Exception as exc:
                    if not _broker_unreachable(exc):
                        raise
                    cause, infos = exc, None
            if cause is None:
                if infos is None:
                    return False
                if tries:
                    _log.info("the broker answered", extra={"tries": tries + 1})
                self._keep_topics(infos)
                return True
            tries += 1
            wait_s = broker_wait_s(tries)
            _log.warning(
                "waiting for the broker",
                extra={
                    "cause": str(cause),
                    "bootstrap": self.settings.kafka_bootstrap,
                    "tries": tries,
                    "wait_s": wait_s,
                },
            )
            self._stop.wait(wait_s)
        return False

    def _describe_topics(self) -> list[TopicInfo] | None:
        """`describe_topics` on a thread of its own, so that `stop` is honoured while its calls wait for a broker.

        A blocking librdkafka admin call cannot be interrupted, and the signal handler only runs once the loop
        thread is back in Python: the loop thread waits here in slices of `_STOP_CHECK_S`. A call left behind by a
        stop ends within its own timeout on its daemon thread (the process is exiting).

        Returns:
            The topics, or None when `stop` was called before the calls returned.

        Raises:
            Exception: What `describe_topics` raised.
        """
        outcome: list[list[TopicInfo] | BaseException] = []

        def describe() -> None:
            try:
                outcome.append(describe_topics(self.settings, self.settings.kafka_call_timeout_s))
            except BaseException as exc:  # noqa: BLE001 - handed to the loop thread, which re-raises it
                outcome.append(exc)

        thread = threading.Thread(target=describe, name="settled-check-topics", daemon=True)
        thread.start()
        while thread.is_alive():
            if self._stop.is_set():
                return None
            thread.join(_STOP_CHECK_S)
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def _keep_topics(self, infos: list[TopicInfo]) -> None:
        """Check what `describe_topics` found and keep the partition count and the record limit."""
        missing = [i.name for i in infos if not i.partitions]
        if missing:
            raise PartitionCountMismatchError(f"topics missing: {', '.join(missing)}; run `settled topics create`")
        counts = {i.name: i.partitions for i in infos}
        if len(set(counts.values())) != 1:
            raise PartitionCountMismatchError(f"settled's topics are not co-partitioned: {counts}")
        self._partition_count = infos[0].partitions
        limits = [int(i.config["max.message.bytes"]) for i in infos if i.name != self.settings.topic("inbox")]
        producer_limit = int(producer_config(self.settings).get("message.max.bytes", PRODUCER_MESSAGE_MAX_BYTES))
        # The producer refuses a record over its own message.max.bytes (librdkafka counts the record's framing
        # too), whatever the topics allow: the smallest limit wins, less the framing.
        self._record_limit = self.config.max_record_bytes or min(*limits, producer_limit) - RECORD_OVERHEAD_BYTES

    def turn(self) -> None:
        """One turn: claim new partitions, poll, decide, checkpoint."""
        consumer = self._consumer
        assert consumer is not None  # run() sets it
        busy = any(getattr(c, "busy", False) for c in self.conductors.values())
        with self._phase("polling the inbox"):
            if busy:
                # Runs are in flight: a record one hands over (or its end) is staged as soon as it comes, not at the
                # next poll. Poll without waiting, then wait for a run's wake-up, bounded so the inbox is still read
                # within `WorkerConfig.busy_wait_s`. A wake-up arriving after the clear below is seen next turn.
                msgs = consume_promptly(consumer, self.config.max_poll_records, 0)
                if not msgs:
                    self._wake.wait(min(self.config.poll_timeout_s, self.config.busy_wait_s))
            else:
                msgs = consume_promptly(consumer, self.config.max_poll_records, self.config.poll_timeout_s)
        self._wake.clear()
        # Claims happen after the poll that may have revoked a partition (rebalance callbacks run inside it).
        now_s = time.monotonic()
        due = [p for p in sorted(self._to_claim) if now_s >= self._claim_not_before.get(p, 0.0)]
        if due:
            with self._phase(f"claim of partitions {due}", extra_s=self._claim_extra_s()):
                self._claim(due)
        with self._phase(f"deciding {len(msgs)} inbox records"):
            self._decide(msgs)
        # One phase per loop, not per partition: a stamp costs ~10 µs, and these loops run every turn.
        active = [(p, conductor) for p, conductor in self.conductors.items() if p in self.owners]
        with self._phase(f"staging the runs of partitions {[p for p, _ in active]}"):
            for _p, conductor in active:
                conductor.before_checkpoint()
        failpoint("worker.before_checkpoint")
        self._checkpoint_all([owner for owner in self.owners.values() if owner.has_pending])
        active = [(p, conductor) for p, conductor in self.conductors.items() if p in self.owners]
        with self._phase(f"acting on the checkpoints of partitions {[p for p, _ in active]}"):
            for _p, conductor in active:
                conductor.after_checkpoint()

    def _decide(self, msgs: list[Message]) -> None:
        """Hand every polled record to its partition's owner (consumer errors are logged or quarantined)."""
        for msg in msgs:
            part = msg.partition()
            err = msg.error()
            if err is not None and err.code() == KafkaError._FATAL:
                raise self._fatal_consumer_error(err)
            if err is not None and (part is None or part < 0 or msg.offset() is None or err.code() in _TRANSIENT):
                _log.warning("consumer error", extra={"error": str(err), "partition": part})
                continue
            if err is not None and err.code() not in _RECORD_ERRORS:
                _log.error(
                    "consumer error at an offset, not about its record",
                    extra={"error": str(err), "partition": part, "offset": msg.offset()},
                )
                continue
            if part is None or part not in self.owners:
                continue
            if (msg.offset() or 0) < self._skip_below.get(part, -1):
                continue  # a repeat of the error of a batch already quarantined and skipped
            self.owners[part].handle(self._input(msg))

    def _fatal_consumer_error(self, err: KafkaError) -> Exception:
        """The error ending the loop for a fatal consumer error: the consumer is unusable, the worker must stop.

        librdkafka's only fatal consumer error is a static member's fence (``FENCED_INSTANCE_ID``, reported as
        ``_FATAL``; confluent-kafka-python#869): `run` judges it once the loop has dropped every partition
        (`_judge_fence`). Anything else fatal is raised as librdkafka reports it (``KafkaException``).
        """
        if self.settings.worker_instance_id is not None and "group.instance.id" in err.str():
            return _FenceSeen(err.str())
        return KafkaException(err)

    def _judge_fence(self, reason: str) -> InstanceFencedError | StaticMembershipLostError:
        """Wait until a session timeout has passed since the fence, then ask the group who holds the instance id.

        A twin heartbeats and keeps the id; a join of this worker's that the coordinator kept but the worker never
        heard answered (a broker restart can leave one) expires after the session timeout. Ends early when no member
        holds the id. Waits at most 1.5 session timeouts plus 1 s.
        """
        instance_id = self.settings.worker_instance_id
        assert instance_id is not None  # only a static member is fenced
        wait_s = 1.5 * self.settings.session_timeout_ms / 1000 + 1.0
        _log.warning(
            "fenced as a static member: waiting for the join that holds the instance id to expire, unless a live "
            "worker holds it",
            extra={"instance_id": instance_id, "group": self.group_id, "wait_s": wait_s, "error": reason},
        )
        deadline = time.monotonic() + wait_s
        admin = AdminClient(admin_config(self.settings))
        last: list[InstanceHolder] | None = None
        while True:
            holders = self._instance_holders(admin, instance_id)
            if holders is not None:
                last = holders
            if last == [] or time.monotonic() >= deadline:
                return instance_fence_error(self.group_id, instance_id, reason, last)
            time.sleep(_FENCE_POLL_S)  # the coordinator expires a silent member by its session deadline, not on a call

    def _instance_holders(self, admin: AdminClient, instance_id: str) -> list[InstanceHolder] | None:
        """The group's members holding ``instance_id``, from the coordinator; None (logged) when it does not answer."""
        timeout_s = self.settings.kafka_call_timeout_s
        try:
            group = admin.describe_consumer_groups([self.group_id], request_timeout=timeout_s)[self.group_id].result()
        except KafkaException as exc:
            _log.warning("the fenced worker's group could not be described", extra={"error": str(exc)})
            return None
        return [InstanceHolder(m.member_id, m.host) for m in group.members if m.group_instance_id == instance_id]

    def _claim_extra_s(self) -> float:
        """What a claim may take beyond the turn bound: its restore and its wait for a foreign open transaction."""
        return _RESTORE_TIMEOUT_S + TransactionalAppender.open_transaction_wait_s

    def _claim(self, partitions: list[int]) -> None:
        """Claim ``partitions`` (docs/design.md §3 steps 2-6): their fences and restores run side by side.

        Each claim's steps 2-5 (``init_transactions``, the open-transaction check, the restore, ``OwnershipClaimed``)
        touch only that partition's owner, producer and readers, and mostly wait on the broker; run one after the
        other they made a restarted worker with 12 partitions wait 12 claims (measured: 4.7 s of a 9.7 s restart,
        ``bench/restart.py``) before the partition of an interrupted run resumed it. So they run on up to
        `_PARALLEL_CLAIMS` threads; everything else (the group consumer, the owners and conductors tables, step 6)
        stays on the loop's thread, partition by partition in order, after every claim ended.
        """
        prepared = [(p, *self._new_owner(p)) for p in partitions]
        outcomes: list[BaseException | None]
        if len(prepared) == 1:
            outcomes = [_claim_outcome(prepared[0][1])]
        else:
            with ThreadPoolExecutor(min(len(prepared), _PARALLEL_CLAIMS), thread_name_prefix="claim") as pool:
                outcomes = list(pool.map(_claim_outcome, [owner for _, owner, _ in prepared]))
        for (p, owner, conductor), outcome in zip(prepared, outcomes, strict=True):
            self._after_claim(p, owner, conductor, outcome)

    def _new_owner(self, p: int) -> tuple[PartitionOwner[S], PartitionConductor | None]:
        """A new owner of ``p`` (not yet claimed) and the conductor that runs beside it."""
        consumer = self._consumer
        assert consumer is not None
        decider = self.decider_factory(p)
        owner: PartitionOwner[S] = PartitionOwner(
            settings=self.settings,
            partition=p,
            decider=decider,
            appender=TransactionalAppender(
                settings=self.settings,
                partition=p,
                input_topic=self.settings.topic("inbox"),
                group_metadata=consumer.consumer_group_metadata,
                replace_poison=lambda run, reason: owner.replace_poison(run, reason),
                max_record_bytes=self._record_limit,
                observer=self.metrics,
            ),
            encode=self.codec.encode,
            encode_batch=self.codec.encode_batch_dict,
            decode_batch=self._decode_batch,
            clock=self.clock,
            worker_id=self.worker_id,
        )
        # Built before the claim, so it sees the restored batches (the conductor's journals, issue 6).
        conductor = self.conductor_factory(owner) if self.conductor_factory is not None else None
        if isinstance(conductor, ProcessMember):
            conductor.join_process(self._wake.set, self._gate)
        return owner, conductor

    def _after_claim(
        self, p: int, owner: PartitionOwner[S], conductor: PartitionConductor | None, outcome: BaseException | None
    ) -> None:
        """Finish the claim of ``p`` on the loop's thread: register the owner and resume (step 6), or retry later.

        Raises:
            BaseException: ``outcome`` when it is not one a claim retries (e.g. a broken chain in the log).
        """
        consumer = self._consumer
        assert consumer is not None
        if p not in self._to_claim:
            # An earlier partition's step 6 served a rebalance that revoked this one meanwhile: nothing to resume.
            owner.appender.close()
            if conductor is not None:
                conductor.close()
            _log.info("revoked while claiming", extra={"partition": p})
            return
        if isinstance(outcome, ProducerFencedError | KafkaException | AppenderFatalError | OpenTransactionError):
            # The partition stays paused and is claimed again later, from scratch (nothing of this attempt was
            # appended). The broker is unreachable or a foreign transaction is still open: after _CLAIM_RETRY_S. A
            # newer producer of this transactional.id fenced the claim (a newer owner, whose group revokes the
            # partition from us at a coming poll and so takes it off the claims, or a zombie of ours): as after a
            # fenced checkpoint, once a session timeout has passed with it still assigned, so that it is never left
            # assigned, paused and unowned.
            fenced = isinstance(outcome, ProducerFencedError)
            _log.warning(
                "fenced while claiming" if fenced else "claim failed, retrying",
                extra={"partition": p, "error": str(outcome)},
            )
            owner.appender.close()
            if conductor is not None:
                conductor.close()
            retry_s = self.settings.session_timeout_ms / 1000 if fenced else _CLAIM_RETRY_S
            self._claim_not_before[p] = time.monotonic() + retry_s
            return
        if outcome is not None:
            raise outcome
        self._to_claim.discard(p)
        genesis = owner.genesis
        if genesis is None or genesis.partition_count != self._partition_count:
            found = "no genesis record" if genesis is None else f"a genesis of {genesis.partition_count} partitions"
            raise PartitionCountMismatchError(
                f"{self.settings.topic('log')}[{p}] has {found}, but the topics have {self._partition_count} "
                "partitions: halting (docs/design.md §2: adding partitions would re-admit keys)"
            )
        self.owners[p] = owner
        if conductor is not None:
            self.conductors[p] = conductor
        self._hand_over_held(p, owner.epoch, conductor)
        self._skip_below.pop(p, None)
        tp = TopicPartition(self.settings.topic("inbox"), p)
        committed = consumer.committed([tp], timeout=self.settings.kafka_call_timeout_s)[0]
        if p not in self.owners:
            # The group revoked the partition while this claim waited on the broker (the revoke callback dropped
            # the owner): nothing to resume; whoever holds it now claims it with a higher epoch.
            _log.info("revoked while claiming", extra={"partition": p})
            return
        self._rewind(consumer, tp, committed)
        consumer.resume([tp])  # claim step 6

    def _hand_over_held(self, p: int, epoch: int, conductor: PartitionConductor | None) -> None:
        """Give a new claim the tool results this process's previous owner of ``p`` could not commit.

        Only when this claim's epoch directly follows the dropped owner's: no other owner claimed the partition in
        between, so none can have classified the calls (as Unknown, or run them again). Otherwise they are dropped
        and the log's owner classifies the calls (docs/design.md §5).
        """
        held = self._held.pop(p, None)
        if held is None:
            return
        dropped_epoch, settlements = held
        if epoch == dropped_epoch + 1 and isinstance(conductor, HoldingConductor):
            conductor.adopt(settlements)
            return
        _log.warning(
            "tool results held across a drop are dropped: another owner claimed the partition in between",
            extra={"partition": p, "dropped_epoch": dropped_epoch, "epoch": epoch, "held": len(settlements)},
        )

    def _rewind(self, consumer: Consumer, tp: TopicPartition, committed: TopicPartition) -> None:
        """Seek the claimed inbox partition to its last committed input offset, or to its start when it has none.

        Every claim rewinds, not only the first: a partition dropped and claimed again (a fatal producer error, a
        fenced checkpoint) has a consumer position past inputs it read whose decisions never committed, and
        resuming there would skip them for good. Inputs re-read whose decisions are canonical are skipped by the
        owner (restore collects every decided offset), so the rewind never decides an input twice.

        A consumer that has returned no record of the partition since its assignment (position unset) already
        fetches from the committed offset, or from the start (``auto.offset.reset=earliest``), and one whose position
        is the committed offset is already there: neither seeks, because a seek discards the records already
        fetched and, to a logical offset, costs an offset lookup before the partition's first input is read.
        """
        if fault_enabled("claim_without_rewind"):
            # Fault switch (tests/fault_switches.toml): the claim resumes at the consumer's position, so inputs read
            # before a drop and not yet decided are skipped. Breaks "no skipped input", on purpose.
            return
        position = consumer.position([tp])[0].offset
        if position < 0 or position == committed.offset:
            return
        target = committed.offset if committed.offset >= 0 else OFFSET_BEGINNING
        consumer.seek(TopicPartition(tp.topic, tp.partition, target))

    def _checkpoint_all(self, owners: list[PartitionOwner[S]]) -> None:
        """Checkpoint every owner with pending work; with more than one, their checkpoints run side by side.

        Each partition has its own producer and transaction (docs/design.md §3), and a checkpoint mostly waits on
        the broker (measured: 85 % of the loop's time went to the transactions' Kafka calls at 50 turns in flight
        on 12 partitions, `bench/records_per_txn.py`), so one after the other the turn waited for the sum of their
        round trips. They run on up to `_PARALLEL_CHECKPOINTS` threads (`WorkerConfig.parallel_checkpoints`); the
        loop waits for every one of them, then handles their errors partition by partition on its own thread, as
        `_checkpoint` does, so no owner is dropped while a thread still checkpoints it. An unexpected exception is
        raised once every checkpoint ended.

        Args:
            owners: The owners with pending work.
        """
        if len(owners) <= 1 or not self.config.parallel_checkpoints:
            for owner in owners:
                self._checkpoint(owner)
            return
        if self._checkpoint_pool is None:
            self._checkpoint_pool = ThreadPoolExecutor(_PARALLEL_CHECKPOINTS, thread_name_prefix="checkpoint")
        with self._phase(f"checkpoints of partitions {[owner.partition for owner in owners]}"):
            futures = [self._checkpoint_pool.submit(_checkpoint_outcome, owner) for owner in owners]
            wait(futures)
        unexpected = [exc for f in futures if (exc := f.exception()) is not None]
        for owner, future in zip(owners, futures, strict=True):
            if future.exception() is None:
                self._checkpointed(owner, future.result())
        if unexpected:
            raise unexpected[0]

    def _checkpoint(self, owner: PartitionOwner[S]) -> None:
        with self._phase(f"checkpoint of partition {owner.partition}"):
            outcome = _checkpoint_outcome(owner)
        self._checkpointed(owner, outcome)

    def _checkpointed(self, owner: PartitionOwner[S], outcome: _Checkpointed) -> None:
        """Observe a checkpoint's commit time, or drop its partition after a producer error (on the loop's thread)."""
        if outcome.commit_s is not None and self.metrics is not None:
            self.metrics.commit_duration_seconds.observe(outcome.commit_s)
        exc = outcome.error
        if isinstance(exc, ProducerFencedError):
            # Either a newer owner took the partition (then the group revokes it from us at a coming poll) or the
            # coordinator aborted our own transaction for running past transaction.timeout.ms (then the partition
            # is still ours). Drop it now; claim it again once a session timeout has passed with it still assigned.
            _log.warning("fenced: dropping the partition", extra={"partition": owner.partition})
            self._drop(owner.partition)
            self._pause_and_claim([owner.partition], not_before_s=self.settings.session_timeout_ms / 1000)
        elif isinstance(exc, ProducerIdExpiredError):
            # The coordinator forgot our producer id (transactional.id.expiration.ms passed while we were stopped):
            # the partition may have a newer owner, which a new init_transactions would fence. Drop everything and
            # claim again only through the claim order, once the group had a session timeout to revoke it.
            _log.error(
                "producer id expired: dropping the partition", exc_info=exc, extra={"partition": owner.partition}
            )
            self._drop(owner.partition)
            self._pause_and_claim([owner.partition], not_before_s=self.settings.session_timeout_ms / 1000)
        elif isinstance(exc, AppenderFatalError):
            _log.error(
                "fatal producer error: claiming the partition again", exc_info=exc, extra={"partition": owner.partition}
            )
            self._drop(owner.partition)
            self._pause_and_claim([owner.partition])

    def _drop(self, p: int) -> None:
        self._skip_below.pop(p, None)
        conductor = self.conductors.pop(p, None)
        if conductor is not None:
            conductor.close()  # its runs stop; their late effects and results append nothing
        owner = self.owners.pop(p, None)
        if owner is not None:
            owner.appender.close()
        if owner is not None and isinstance(conductor, HoldingConductor):
            held = conductor.unsent_settlements()
            if held:
                # Kept for this process's next claim of the partition (`_hand_over_held`).
                self._held[p] = (owner.epoch, held)

    def _pause_and_claim(self, partitions: list[int], not_before_s: float = 0.0) -> None:
        consumer = self._consumer
        assert consumer is not None
        consumer.pause([TopicPartition(self.settings.topic("inbox"), p) for p in partitions])  # claim step 1
        self._to_claim.update(partitions)
        for p in partitions:
            self._claim_not_before[p] = time.monotonic() + not_before_s

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        self._pause_and_claim([tp.partition for tp in partitions])
        _log.info("assigned", extra={"partitions": [tp.partition for tp in partitions]})

    def _release(self, partitions: list[int]) -> None:
        """Release owned partitions gracefully (docs/design.md §3 "Once a revoke is pending, start no new tool").

        Their conductors start nothing new; running attempts get ``Settings.revoke_grace_s`` to finish, their
        settlements committed turn by turn; the attempts still running then are recorded as
        ``AttemptInterrupted("graceful_revoke")`` (docs/design.md §5: an ownership change the log explains, no death);
        a last checkpoint commits that, and the partitions are dropped.

        Args:
            partitions: The partitions to release (those not owned are skipped).
        """
        owned = [p for p in partitions if p in self.owners]
        if not owned:
            return
        with self._phase(f"graceful release of partitions {owned}", extra_s=self.settings.revoke_grace_s):
            self._release_owned(owned)

    def _release_owned(self, owned: list[int]) -> None:
        draining: dict[int, DrainingConductor] = {}
        for p in owned:
            conductor = self.conductors.get(p)
            if isinstance(conductor, DrainingConductor):
                conductor.begin_drain()
                draining[p] = conductor
        deadline = time.monotonic() + self.settings.revoke_grace_s
        while draining:
            for p, conductor in list(draining.items()):
                if p not in self.owners:
                    del draining[p]  # dropped (fenced, fatal) meanwhile
                    continue
                conductor.before_checkpoint()  # stages what finished runs recorded and their settlements
                owner = self.owners[p]
                if owner.has_pending:
                    self._checkpoint(owner)
                if p in self.owners:
                    conductor.after_checkpoint()  # resolves committed effects: the runs go on
            if all(c.drained for c in draining.values()) or time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        for p, conductor in draining.items():
            if p not in self.owners:
                continue
            conductor.before_checkpoint()
            interrupted = conductor.interrupt_remaining()
            if interrupted:
                _log.info("attempts interrupted by a graceful revoke", extra={"partition": p, "count": interrupted})
        for p in owned:
            last = self.owners.get(p)
            if last is not None and last.has_pending:
                self._checkpoint(last)  # graceful: in-flight appends finish before the partition moves
            self._drop(p)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release([tp.partition for tp in partitions])
        for tp in partitions:
            self._drop(tp.partition)
            self._to_claim.discard(tp.partition)
        consumer.incremental_unassign(partitions)
        _log.info("revoked", extra={"partitions": [tp.partition for tp in partitions]})

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._drop(tp.partition)
            self._to_claim.discard(tp.partition)
        consumer.incremental_unassign(partitions)
        _log.warning("lost", extra={"partitions": [tp.partition for tp in partitions]})

    def _unreadable_batch(self, topic: str, partition: int, offset: int, err: KafkaError) -> InboxInput:
        """Quarantine input for a batch the consumer reports unreadable at ``offset``; seek the consumer past it.

        librdkafka reports such a batch at its base offset again on every fetch and never moves past it
        (`settled.processors._batch_probe`), so the worker finds the batch's last offset, seeks past it, and decides
        the whole batch as one quarantined input whose committed offset passes it.
        """
        consumer = self._consumer
        assert consumer is not None  # run() sets it
        last = failing_batch_last_offset(
            probe_consumer_config(self.settings, self.config.consumer_limits),
            topic,
            partition,
            offset,
            self.settings.kafka_call_timeout_s,
        )
        consumer.seek(TopicPartition(topic, partition, last + 1))
        self._skip_below[partition] = last + 1
        detail = f"consumer error at offsets {offset}..{last} ({last - offset + 1} records): {err.str()}"
        _log.warning("unreadable batch quarantined", extra={"partition": partition, "offset": offset, "last": last})
        return InboxInput(
            topic, partition, offset, None, None, None, detail, QuarantineReason.CONSUMER_ERROR, last_offset=last
        )

    def _decode_batch(self, value: bytes, topic: str, partition: int, offset: int) -> LogBatch:
        return self.codec.decode_batch(value, topic=topic, partition=partition, offset=offset).batch

    def _input(self, msg: Message) -> InboxInput:
        topic = msg.topic() or self.settings.topic("inbox")
        partition = msg.partition() or 0
        offset = msg.offset() or 0
        err = msg.error()
        key = msg.key()
        key_bytes = key.encode() if isinstance(key, str) else key
        if err is not None:
            return self._unreadable_batch(topic, partition, offset, err)
        value = msg.value()
        raw = value.encode() if isinstance(value, str) else value
        headers = _headers(msg)
        return decode_input(
            self.codec,
            topic,
            partition,
            offset,
            key_bytes,
            raw,
            max_input_bytes=self.config.max_input_bytes,
            headers=headers,
        )


def _headers(msg: Message) -> tuple[tuple[str, bytes], ...]:
    """A consumed record's headers as (name, bytes) pairs (a header without a value: empty bytes)."""
    out: list[tuple[str, bytes]] = []
    for pair in msg.headers() or ():
        name, value = pair[0], pair[1]
        out.append((str(name), value if isinstance(value, bytes) else str(value or "").encode()))
    return tuple(out)
