"""Barrier records: prove that nothing else happened without a fixed sleep.

A test that must show that a worker did *not* do something (settle twice, re-run a tool, append after a rejection)
sends a barrier submission after the event of interest, on a conversation of the same partition, waits until the
barrier's settlement is on the settlements topic, and then asserts on what precedes it. A worker decides a partition's
inbox records in order and starts a conversation's next submission only once the previous one is settled
(docs/semantics.md §5), so whatever it would wrongly have done in response to the earlier records is in the topics
before the barrier's settlement; a fixed sleep proves that only on a machine fast enough for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from settled._settings import Settings
from settled.schemas import SettlementRecord, SubmissionProposed
from tests.harness.factories import proposal
from tests.integration.helpers import CODEC, produce_inbox, read_topic

T = TypeVar("T")

#: How often `pass_barrier` reads the settlements topic again, in seconds.
POLL_S = 0.2


@dataclass(frozen=True)
class Barrier:
    """A barrier submission whose settlement has been read.

    Attributes:
        proposal: The barrier submission.
        partition: The settlements partition its settlement is on.
        offset: Its settlement's offset there.
    """

    proposal: SubmissionProposed
    partition: int
    offset: int


def _find(s: Settings, submission_id: str) -> tuple[int, int] | None:
    for r in read_topic(s, "settlements"):
        assert r.value is not None
        rec = CODEC.decode(r.value)
        if isinstance(rec, SettlementRecord) and rec.submission_id == submission_id:
            return r.partition, r.offset
    return None


def pass_barrier(s: Settings, conversation: str, value: Any = "barrier", *, timeout_s: float = 90.0) -> Barrier:
    """Send a barrier submission on ``conversation`` and wait until its settlement is on the settlements topic.

    Args:
        s: The test's settings.
        conversation: A conversation of the partition whose earlier records the test asserts on (the same
            conversation also waits for its earlier submissions to settle first).
        value: The barrier's input (one the test's app completes, e.g. an empty plan for the engine app).
        timeout_s: How long to wait for the barrier's settlement, in seconds.

    Returns:
        The barrier, with where its settlement is.

    Raises:
        AssertionError: The barrier was not settled within ``timeout_s``.
    """
    barrier = proposal(conversation, value=value)
    produce_inbox(s, [(conversation.encode(), CODEC.encode(barrier))])
    deadline = time.monotonic() + timeout_s
    while True:
        found = _find(s, barrier.submission_id)
        if found is not None:
            return Barrier(barrier, *found)
        if time.monotonic() >= deadline:
            raise AssertionError(f"the barrier submission on {conversation!r} was not settled within {timeout_s} s")
        time.sleep(POLL_S)


def settlements_before(s: Settings, barrier: Barrier) -> list[SettlementRecord]:
    """The settlement records on the barrier's partition that precede the barrier's settlement, in offset order.

    Args:
        s: The test's settings.
        barrier: A barrier `pass_barrier` returned.

    Returns:
        The records before the barrier's settlement on its partition.
    """
    out: list[SettlementRecord] = []
    for r in read_topic(s, "settlements"):
        if r.partition != barrier.partition or r.offset >= barrier.offset:
            continue
        assert r.value is not None
        rec = CODEC.decode(r.value)
        assert isinstance(rec, SettlementRecord)
        out.append(rec)
    return out


def before_first(records: Sequence[T], is_barrier: Callable[[T], bool]) -> list[T]:
    """The records read before the first barrier record, in read order.

    Args:
        records: Records of one partition in offset order (e.g. a one-partition ``Tail``'s ``records``).
        is_barrier: Whether a record is the barrier's (e.g. its receipt, settlement or log batch).

    Returns:
        The prefix before it.

    Raises:
        AssertionError: No barrier record among ``records`` (read them up to the barrier's settlement first).
    """
    for i, record in enumerate(records):
        if is_barrier(record):
            return list(records[:i])
    raise AssertionError("no barrier record among the records read: read up to the barrier's settlement first")
