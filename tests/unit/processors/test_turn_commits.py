"""How many transactions a turn takes (issue 24 item 1): the worker loop's phases over the in-memory appender.

A real `PartitionOwner`, `Conductor` and `TransactionalAppender`; the producer is `tests/unit/producers/_fake.py`'s
(confluent-kafka's protocol, no broker), so every committed transaction and its log records are counted. The loop is
driven as `settled.processors.Worker.turn` drives it: inbox records handed to the owner, ``before_checkpoint``, the
checkpoint, ``after_checkpoint``. Pinned (docs/architecture.md "Commit boundaries of a turn"):

* a submission to an idle conversation: its admission and its attempt's start commit in one transaction, the run
  begins only after that commit, and its settlement is the turn's second and last transaction;
* three submissions queued on one conversation: the admissions and the first start in one transaction, then each
  settlement with the next submission's start in one transaction: four in all, not six.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait

import pytest

from settled import _failpoints
from settled._settings import Settings
from settled.processors import Conductor, InboxInput, LedgerDecider, PartitionOwner
from settled.processors._conductor import AgentRun
from settled.processors._partition import Decision
from settled.producers import TransactionalAppender
from settled.producers._txproducer import FaultInjectingProducer
from settled.protocol import PartitionState, claim
from settled.schemas import Codec, LogBatch, SubmissionProposed
from tests.unit.producers._fake import FakeKafka, FakePartitionLog, FakeProducer
from tests.unit.protocol._sim import T0, proposal

SETTINGS = Settings(namespace="unit-turn", kafka_bootstrap="fake:9092", partitions=1)
CODEC = Codec()
TIMEOUT_S = 10.0


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    _failpoints.reset()
    yield
    _failpoints.reset()


class _Loop:
    """One partition's worker loop over a `FakeKafka`; runs end only when the test releases them."""

    def __init__(self, pool: ThreadPoolExecutor) -> None:
        self.kafka = FakeKafka()
        self.started: list[str] = []  # submission ids, in the order their runs began
        self.release = threading.Event()
        self._offset = 0
        appender = TransactionalAppender(
            settings=SETTINGS,
            partition=0,
            input_topic=SETTINGS.topic("inbox"),
            group_metadata=lambda: "group-metadata",
            replace_poison=self._no_poison,
            producer_factory=lambda _config: FaultInjectingProducer(FakeProducer(self.kafka)),
            partition_log=FakePartitionLog(self.kafka, SETTINGS.topic("log")),
        )
        self.owner: PartitionOwner[PartitionState] = PartitionOwner(
            settings=SETTINGS,
            partition=0,
            decider=LedgerDecider(partition=0, partition_count=1),
            appender=appender,
            encode=CODEC.encode,
            decode_batch=lambda value, topic, partition, offset: CODEC.decode_batch(value, offset=offset).batch,
            clock=lambda: T0,
            worker_id="w1",
            encode_batch=CODEC.encode_batch_dict,
        )
        self.conductor = Conductor(owner=self.owner, agent=self._agent, pool=pool, clock=lambda: T0)
        appender.open()
        # Claim step 5 without a restore (the log is empty): the claim is the first transaction.
        self.owner._stage(Decision("~partition/0", (claim(self.owner.overlay, "w1", T0),)), epoch=1)
        self.owner.checkpoint()
        self._ends = [self._log_length()]  # where each committed transaction's log records end

    @staticmethod
    def _no_poison(run: object, reason: str) -> tuple[()]:
        raise AssertionError(f"no replacement expected: {reason}")

    def _agent(self, run: AgentRun) -> str:
        self.started.append(run.submission_id)
        if not self.release.wait(TIMEOUT_S):
            raise AssertionError("the test never released the run")
        return '"ok"'

    def _log_length(self) -> int:
        return len(self.kafka.committed.get(SETTINGS.topic("log"), []))

    def transactions(self) -> list[list[str]]:
        """The committed transactions after the claim's, each as its log batches' event names, in order."""
        log = self.kafka.committed.get(SETTINGS.topic("log"), [])
        # FakeKafka keeps no transaction marker: `turn` records where each commit's records end instead.
        return [[self._names(r.value) for r in log[a:b]] for a, b in zip(self._ends, self._ends[1:], strict=False)]

    @staticmethod
    def _names(value: bytes) -> str:
        batch: LogBatch = CODEC.decode_batch(value, offset=0).batch
        return "+".join(type(e).__name__ for e in batch.events)

    def turn(self, *records: SubmissionProposed) -> None:
        """One loop turn: decide ``records``, stage the runs' ends and what is next, checkpoint, act on it."""
        for record in records:
            value = CODEC.encode(record)
            self.owner.handle(
                InboxInput(SETTINGS.topic("inbox"), 0, self._offset, record.conversation_id.encode(), value, record)
            )
            self._offset += 1
        self.conductor.before_checkpoint()
        committed_before = len(self.kafka.transactions)
        if self.owner.has_pending:
            self.owner.checkpoint()
        assert len(self.kafka.transactions) - committed_before <= 1, "one checkpoint, at most one transaction"
        if len(self.kafka.transactions) > committed_before:
            self._ends.append(self._log_length())
        self.conductor.after_checkpoint()

    def wait_runs(self) -> None:
        """Release the running runs and wait until each has ended."""
        running = [r.future for r in self.conductor._running.values()]
        self.release.set()
        _, not_done = wait(running, TIMEOUT_S)
        assert not not_done, "a run did not end"
        self.release.clear()


@pytest.fixture
def loop() -> Iterator[_Loop]:
    with ThreadPoolExecutor(2) as pool:
        lp = _Loop(pool)
        yield lp
        lp.release.set()


ADMITTED = "SubmissionAdmitted+SubmissionReady"
STARTED = "AttemptStarted+InputApplied"


def test_a_turn_on_an_idle_conversation_takes_two_transactions(loop: _Loop) -> None:
    loop.turn(proposal("s1", "k1"))
    assert loop.transactions() == [[ADMITTED, STARTED]], "admission and the attempt's start: one transaction"
    assert loop.conductor._running, "the run begins once that transaction committed"
    loop.wait_runs()
    loop.turn()
    assert loop.transactions() == [[ADMITTED, STARTED], ["Settlement"]]
    assert loop.started == ["s1"]
    assert len(loop.kafka.transactions) == 3 and set(loop.kafka.transactions) == {"commit"}  # the claim's + two


def test_the_run_does_not_begin_before_its_start_commits(loop: _Loop) -> None:
    record = proposal("s1", "k1")
    loop.owner.handle(InboxInput(SETTINGS.topic("inbox"), 0, 0, b"c1", CODEC.encode(record), record))
    loop.conductor.before_checkpoint()
    assert loop.owner.has_pending and not loop.conductor._running and loop.started == []
    loop.owner.checkpoint()
    loop.conductor.after_checkpoint()
    assert list(loop.conductor._staged) == [] and len(loop.conductor._running) == 1


def test_a_queue_of_three_takes_four_transactions_each_settlement_with_the_next_start(loop: _Loop) -> None:
    loop.turn(proposal("s1", "k1"), proposal("s2", "k2"), proposal("s3", "k3"))
    for _ in range(3):
        loop.wait_runs()
        loop.turn()
    assert loop.transactions() == [
        [ADMITTED, ADMITTED, ADMITTED, STARTED],
        ["Settlement", STARTED],
        ["Settlement", STARTED],
        ["Settlement"],
    ]
    assert loop.started == ["s1", "s2", "s3"]
