"""The appender's group policy: what a checkpoint does after a transaction aborted (step 6 of the appender).

Pure: no I/O, no clock. `TransactionalAppender.checkpoint` (`settled/producers/_appender.py`) commits the joined
conversations as one group; when a transaction aborts it asks `after_abort` what to do with the group, given the
record-level delivery errors of the aborted transaction:

- **deferred** — no record failed (a rebalance fenced the group metadata, a coordinator error): nothing to blame, so
  this group and every queued one go back to the caller, who polls (which rejoins the group) and checkpoints again.
- **alone** — records failed in a shared transaction: a broker rejects whole record batches and the idempotent
  producer's later batches fail too, so delivery errors cannot pin the culprit; every conversation of the group is
  retried alone.
- **collateral** — a conversation alone failed with no record fault (its records were failed by someone else's, or
  by a transient broker error): retried alone again, up to `MAX_COLLATERAL` times, then deferred with the rest.
- **poisoned twice** — a conversation alone failed with a record fault (`RECORD_FAULTS`): retried alone once more,
  marked; failing again with one, it is poison and replaced by its typed failure (``replace_poison``).

Fault switch ``collateral_condemned`` (`settled._faults`): the delivery errors of a shared transaction are taken as
the culprits, so every conversation with a failed record is replaced at once, and the healthy neighbours whose
records failed only as collateral fail with the poison. Caught by ``tests/unit/producers/test_group_policy.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from confluent_kafka import KafkaError

from settled._faults import fault_enabled
from settled.producers._batches import AppendBatch, Run

__all__ = [
    "MAX_COLLATERAL",
    "RECORD_FAULTS",
    "AbortDecision",
    "Defer",
    "Group",
    "Replace",
    "Retry",
    "TransactionOutcome",
    "after_abort",
    "runs_of",
]

#: How many times a conversation alone is retried after failing with no record fault before it is deferred.
MAX_COLLATERAL = 3

#: Delivery errors that a record itself causes (a conversation failing alone with one of them twice is poison).
RECORD_FAULTS = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_MSG,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_TIMESTAMP,
        KafkaError.INVALID_REQUIRED_ACKS,
        KafkaError.POLICY_VIOLATION,
    }
)


class TransactionOutcome(enum.Enum):
    """How one transaction (appender steps 2-5) ended."""

    COMMITTED = "committed"
    """Committed: every batch of the group is canonical."""
    ABORTED = "aborted"
    """Aborted: nothing of the group is canonical; the policy decides what comes next."""
    UNKNOWN = "unknown"
    """The commit or abort timed out: the appender reads the log to learn what landed (step 7)."""


@dataclass(frozen=True)
class Group:
    """Conversations committed together in one transaction.

    Attributes:
        runs: Each conversation's run of batches, in decision order.
        alone: Whether this is one conversation retried alone after a shared transaction failed.
        failures: How many times it failed alone with no record fault (collateral).
        poisoned: Whether it already failed alone with a record fault once.
    """

    runs: tuple[Run, ...]
    alone: bool = False
    failures: int = 0
    poisoned: bool = False

    def batches(self) -> list[AppendBatch]:
        """Return every batch of the group, conversation by conversation."""
        return [b for run in self.runs for b in run]


@dataclass(frozen=True)
class Retry:
    """Put ``groups`` at the front of the queue, in order."""

    groups: tuple[Group, ...]


@dataclass(frozen=True)
class Replace:
    """Replace each of ``runs`` by its typed failure (giving ``reason``) and append each replacement alone, next."""

    runs: tuple[Run, ...]
    reason: str


@dataclass(frozen=True)
class Defer:
    """Append nothing more in this checkpoint: this group and every queued one go back to the caller."""


AbortDecision = Retry | Replace | Defer
"""What `after_abort` decides."""


def runs_of(batches: Sequence[AppendBatch]) -> list[Run]:
    """Group batches into runs, one per conversation, in first-appearance order, each run in decision order.

    Args:
        batches: Batches of several conversations, in decision order.

    Returns:
        The runs.
    """
    by_conversation: dict[str, list[AppendBatch]] = {}
    for batch in batches:
        by_conversation.setdefault(batch.conversation_id, []).append(batch)
    return [tuple(run) for run in by_conversation.values()]


def after_abort(group: Group, failed: Mapping[str, Set[int]]) -> AbortDecision:
    """Decide what follows an aborted transaction of ``group`` (the module's policy).

    Args:
        group: The group whose transaction aborted.
        failed: Batch id -> the ``KafkaError`` codes its records' delivery failed with in that transaction (empty
            when no record failed).

    Returns:
        `Defer`, `Retry` or `Replace`.
    """
    if not failed:
        return Defer()
    if not group.alone:
        if fault_enabled("collateral_condemned"):
            # Fault switch: the delivery errors of a shared transaction are taken as the culprits, so a healthy
            # neighbour whose records failed only as collateral is replaced with the poison. Breaks DUR-014.
            blamed = tuple(run for run in group.runs if any(b.batch_id in failed for b in run))
            return Replace(blamed, "its records failed in a shared transaction")
        return Retry(tuple(Group((run,), alone=True) for run in group.runs))
    (run,) = group.runs
    if not any(codes & RECORD_FAULTS for codes in failed.values()):
        if group.failures >= MAX_COLLATERAL:
            return Defer()
        return Retry((Group((run,), alone=True, failures=group.failures + 1),))
    if group.poisoned:
        faults = sorted({KafkaError(code).name() for codes in failed.values() for code in codes})
        return Replace((run,), f"its records failed alone twice ({', '.join(faults)})")
    return Retry((Group((run,), alone=True, poisoned=True),))
