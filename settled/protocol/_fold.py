"""Conversation state as a fold of canonical events (docs/design.md §1b, §3, §4; docs/semantics.md §3, §5, §12, §13).

One fold serves the worker's restore, its pending overlay, the recovery classifier (DUR-013) and a reference
projection for tests: `apply` folds one canonical batch (a `settled.schemas.LogBatch` or anything shaped like it)
into a `PartitionState` and returns a new state; the old one is unchanged. It is deterministic and total over the
log event types: every event type has a rule, and every state change is an edge of `settled.protocol.EDGES`.

The fold refuses, with a typed error, what a correct owner never writes (docs/design.md §3: "a fencing bug shows up as
an error, not as silent corruption"):

* a batch whose owner epoch is below the latest preceding `OwnershipClaimed` (`StaleEpochError`), a claim that does
  not raise the epoch, a batch appended at an epoch that was never claimed;
* a batch that does not continue its conversation's chain (`settled.schemas.ChainBreakError`: event sequence or
  previous digest);
* a transition that is not an edge, or an event in a state that does not permit it (`IllegalTransitionError`), among
  them a second terminal outcome (DUR-002), an attempt start while another submission holds the lane (DUR-005) or
  while an earlier submission is still queued (DUR-004), a settlement other than ``aborted`` after an abort was
  recorded (DUR-012);
* an inbox input decided twice, an idempotency key admitted twice, a gap in the submission sequence, an attempt
  number that skips (`LogInconsistencyError`).

Pending overlay (docs/design.md §3): the worker keeps the committed state and a scratch state, ``apply(committed, b)``
for every batch of the open transaction; decisions read the scratch, so a key proposed twice inside one open
transaction is admitted once. On commit the scratch becomes the committed state; on abort it is dropped.

Cost: states are copy-on-write. `apply` copies, per batch, the conversation maps the batch writes (the key index
on an admission, the submission map on a transition) and the partition's conversation map; restoring with `fold`
copies each map once for the whole run of batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, TypeVar

from settled.protocol._errors import IllegalTransitionError, LogInconsistencyError, StaleEpochError
from settled.protocol._joining import joinable_prefix
from settled.protocol._states import (
    TERMINAL_STATES,
    WAITING_STATES,
    Edge,
    SubmissionState,
    cause_qualifier,
    find_edge,
    outcome_state,
    waiting_state,
)
from settled.schemas import (
    AbortRecorded,
    AccessGranted,
    AccessLevel,
    AccessRevoked,
    ApprovalDecided,
    AttemptInterrupted,
    AttemptStarted,
    AvroRecord,
    ChainBreakError,
    CommandRejected,
    EffectRecorded,
    Genesis,
    InputApplied,
    InputQuarantined,
    InputRef,
    LanePolicy,
    LaneSet,
    LogEvent,
    ModelResponseCompleted,
    ModelResponseDelta,
    ModelResponseInterrupted,
    OwnershipClaimed,
    RecoveryDecision,
    RecoveryDecisionKind,
    ResolutionKind,
    Settlement,
    SettlementOutcome,
    SignalReceived,
    SteeringDelivered,
    SteeringReceived,
    StepRecorded,
    StepRetryScheduled,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionReady,
    SubmissionRejected,
    SubmissionRetryScheduled,
    SubmissionsJoined,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    ToolCallUnknown,
    UnknownResolved,
    WaitKind,
    WaitRequested,
    WaitResolved,
    json_digest,
)

__all__ = [
    "GRACEFUL_REVOKE",
    "RETRY_BUDGET_EXHAUSTED",
    "BatchLike",
    "ConversationState",
    "InputKey",
    "KeyEntry",
    "PartitionState",
    "Submission",
    "Transition",
    "apply",
    "apply_conversation",
    "apply_traced",
    "fold",
    "input_key",
    "lane_command_target",
    "scope_digest",
]

S = SubmissionState

GRACEFUL_REVOKE = "graceful_revoke"
"""`AttemptInterrupted.reason` of an attempt its owner stopped on a graceful revoke: no death, so the attempt is not
charged to ``max_attempts`` (docs/design.md §3, §5)."""

RETRY_BUDGET_EXHAUSTED = "retry_budget_exhausted"
"""The error type of a submission that settled failed because its retry budget was spent: a dead letter (issue 22
item 4; `settled.protocol.dead_letter_reason`). The fold keeps a dead letter's payload until it is retried."""

InputKey = tuple[str, int, int]
"""An inbox input's (topic, partition, offset)."""

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def _empty() -> Mapping[Any, Any]:
    return _EMPTY


class _Layered(Mapping[str, "ConversationState"]):
    """A partition's conversation map after a fold: a shared read-only base and the conversations changed since.

    ``base`` is shared with earlier states; ``top`` holds the conversations changed since that base (a newer state of a
    base conversation, or a new one). Folding a batch used to copy the whole map to replace the one conversation it
    changed: O(conversations) per batch (measured: 7 µs at 2,000 conversations, 76 µs at 20,000, 1.4 ms at 100,000;
    a partition keeps every conversation it ever held, so a long-lived worker's CPU per turn grew with its history;
    docs/architecture.md "Records per transaction"). `_with_changed` copies only ``top`` and merges it into a new base
    once it holds more than `_top_limit` conversations: O(√conversations) per batch. Reads see exactly what the merged
    dict would hold, in its order (the base's keys, then the new ones); nothing is ever removed from a partition's
    map. Never mutated.
    """

    __slots__ = ("_base", "_len", "_top")

    def __init__(self, base: Mapping[str, ConversationState], top: dict[str, ConversationState]) -> None:
        self._base = base
        self._top = top
        self._len = len(base) + sum(1 for cid in top if cid not in base)

    def __getitem__(self, conversation_id: str) -> ConversationState:
        found = self._top.get(conversation_id)
        return self._base[conversation_id] if found is None else found

    def get(self, conversation_id: str, default: Any = None) -> Any:
        found = self._top.get(conversation_id)
        return self._base.get(conversation_id, default) if found is None else found

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._top or conversation_id in self._base

    def __iter__(self) -> Iterator[str]:
        yield from self._base
        base = self._base
        yield from (cid for cid in self._top if cid not in base)

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"_Layered({dict(self)!r})"


def _top_limit(base_len: int) -> int:
    """How many changed conversations `_Layered` holds over its base before they are merged into a new one."""
    return max(32, math.isqrt(base_len))


def _with_changed(
    conversations: Mapping[str, ConversationState], changed: dict[str, ConversationState]
) -> Mapping[str, ConversationState]:
    """The conversation map with ``changed`` put in (a new map; ``conversations`` is not modified).

    Args:
        conversations: The map before (a state's, never mutated).
        changed: The conversations to put in: their new states by id.

    Returns:
        A `_Layered` over the same base, or, once the changed ones outgrow `_top_limit`, a merged read-only dict.
    """
    if isinstance(conversations, _Layered):
        base: Mapping[str, ConversationState] = conversations._base
        top = {**conversations._top, **changed}
    else:
        base, top = conversations, changed
    if len(top) <= _top_limit(len(base)):
        return _Layered(base, top)
    merged = _copy(base)
    merged.update(top)
    return MappingProxyType(merged)


def input_key(ref: InputRef) -> InputKey:
    """Return the hashable key of an input reference.

    Args:
        ref: Where an inbox record was read.

    Returns:
        ``(topic, partition, offset)``.
    """
    return (ref.topic, ref.partition, ref.offset)


def lane_command_target(lane: LanePolicy) -> str:
    """The target ``ConversationState.applied_commands`` keeps for an applied `SetLane` (issue 22 item 1).

    Args:
        lane: The lane it set.

    Returns:
        ``~lane/<lane>`` (a repeat of the command id must set the same lane).
    """
    return f"~lane/{lane.value}"


def scope_digest(principal: str, conversation_id: str, idempotency_key: str) -> str:
    """Return the key-index entry of an idempotency key: its scope is principal + conversation (docs/design.md §4).

    The index lives in memory only (the fold rebuilds it from the log), so this encoding may change freely; it
    must only be injective: each part is UTF-8 encoded and prefixed with its byte length.

    Args:
        principal: Who submits.
        conversation_id: The conversation.
        idempotency_key: The client's key.

    Returns:
        Lowercase hex SHA-256 of the length-prefixed parts.
    """
    digest = hashlib.sha256()
    for part in (principal, conversation_id, idempotency_key):
        raw = part.encode("utf-8")
        digest.update(len(raw).to_bytes(8, "big"))
        digest.update(raw)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """What admission keeps per idempotency key for the life of the log (docs/design.md §3 "Memory", §4).

    Attributes:
        submission_id: The admitted submission.
        payload_digest: Digest of its canonical payload (compared with a retry's).
        submission_seq: Its submission sequence (the receipt's).
    """

    submission_id: str
    payload_digest: str
    submission_seq: int


@dataclass(frozen=True, slots=True)
class Submission:
    """One admitted submission as the fold sees it.

    Attributes:
        submission_id: Its id.
        submission_seq: Its conversation-local submission sequence (1, 2, ...; DUR-004).
        principal: Who submitted.
        idempotency_key: The client key.
        payload_digest: Digest of the canonical payload (recomputed at admission).
        state: Its state (docs/semantics.md §3).
        input_json: The turn's input; dropped once settled.
        tools_offered: Tool names offered for the turn; dropped once settled.
        admitted_input_ref: The inbox record it was admitted from.
        attempt_count: Attempts started (`AttemptStarted`; docs/design.md §5).
        revoked_count: Attempts ended by a graceful revoke (`AttemptInterrupted` with reason
            `GRACEFUL_REVOKE`): an ownership change the log explains, no death, so not charged to ``max_attempts``
            (docs/design.md §5; see `charged_attempts`).
        attempt_id: The current (or last) attempt's id.
        input_applied: True once `InputApplied` is canonical (docs/semantics.md §4).
        abort_command_ids: Ids of the aborts recorded for it (DUR-012).
        abort_reason: The first recorded abort's reason.
        reserved_outcome: The outcome fixed before the settlement (a resolution's decision, or aborted).
        open_calls: Prepared calls without a settlement or Unknown mark.
        unknown_calls: Calls marked Unknown and not yet resolved (DUR-009).
        outcome: The terminal outcome, once settled.
        waits: Ids of the waits requested and not yet decided (issue 16); not empty exactly while Waiting.
        suspended_count: Attempts that ended by waiting (Running → Waiting): no death, so not charged to
            ``max_attempts`` (see `charged_attempts`).
        approvals: (approval id, argument digest) of every approval the run requested, open or decided (issue 16
            item 4; `approval_digest`).
        retries: Retries scheduled so far (`SubmissionRetryScheduled`; issue 22 item 4).
        retry_wait_id: The wait id of the retry scheduled last, until its `WaitRequested` takes the submission
            Ready → Waiting (the two are appended in one batch).
        error_type: For a failed settlement: its error type (`RETRY_BUDGET_EXHAUSTED` for a dead letter).
        retry_of: For a submission admitted by a `RetrySubmission`: the dead letter it retries (issue 22 item 4).
        retried_as: For a dead letter: the submission that retries it, once admitted (a second retry is a duplicate).
        joined_to: For a submission an active run joined (issue 22 item 2): that run, its host.
        joined: For a host: the submissions it joined, in join order (`SubmissionsJoined`); they settle with it.
    """

    submission_id: str
    submission_seq: int
    principal: str
    idempotency_key: str
    payload_digest: str
    state: SubmissionState
    input_json: str | None
    tools_offered: tuple[str, ...]
    admitted_input_ref: InputRef | None
    attempt_count: int = 0
    revoked_count: int = 0
    attempt_id: str | None = None
    input_applied: bool = False
    abort_command_ids: tuple[str, ...] = ()
    abort_reason: str | None = None
    reserved_outcome: SettlementOutcome | None = None
    open_calls: frozenset[str] = frozenset()
    unknown_calls: frozenset[str] = frozenset()
    outcome: SettlementOutcome | None = None
    waits: frozenset[str] = frozenset()
    suspended_count: int = 0
    approvals: frozenset[tuple[str, str]] = frozenset()
    retries: int = 0
    retry_wait_id: str | None = None
    error_type: str | None = None
    retry_of: str | None = None
    retried_as: str | None = None
    joined_to: str | None = None
    joined: tuple[str, ...] = ()

    @property
    def dead_lettered(self) -> bool:
        """True for a submission that settled failed because its retry budget was spent (issue 22 item 4)."""
        return self.outcome is SettlementOutcome.FAILED and self.error_type == RETRY_BUDGET_EXHAUSTED

    def approval_digest(self, approval_id: str) -> str | None:
        """Return the argument digest an approval the run requested is bound to, or None if it requested none.

        Args:
            approval_id: The approval (its wait id).

        Returns:
            The digest, or None.
        """
        return next((digest for aid, digest in self.approvals if aid == approval_id), None)

    @property
    def wait_kinds(self) -> Mapping[str, WaitKind]:
        """The run's open waits, by wait id, with their kind: the generic wait of issue 16 under both its labels.

        A call in doubt is a wait of kind `unknown` whose id is the call id (open from its `ToolCallUnknown` until
        its `UnknownResolved`); a signal or approval wait is open from its `WaitRequested` until its
        `WaitResolved`. Empty unless the run is in a waiting state (`WAITING_STATES`) or in Recovery with a call
        already marked Unknown.
        """
        if not self.unknown_calls and not self.waits:
            return _EMPTY
        approvals = {aid for aid, _ in self.approvals}
        kinds = {call_id: WaitKind.UNKNOWN for call_id in self.unknown_calls}
        for wait_id in self.waits:
            kinds[wait_id] = WaitKind.APPROVAL if wait_id in approvals else WaitKind.SIGNAL
        return MappingProxyType(kinds)

    def suspended_on(self, wait_id: str) -> WaitKind | None:
        """Return the kind of an open wait the run is suspended on, or None: the check every delivery makes.

        Args:
            wait_id: The wait (a call id for a wait of kind `unknown`).

        Returns:
            Its kind while the run is in a waiting state (`WAITING_STATES`) and the wait is open; otherwise None.
        """
        if self.state not in WAITING_STATES:
            return None
        return self.wait_kinds.get(wait_id)

    @property
    def abort_requested(self) -> bool:
        """True once an abort is recorded for it (its intent authorizes only an aborted settlement)."""
        return bool(self.abort_command_ids)

    @property
    def terminal(self) -> bool:
        """True once settled."""
        return self.state in TERMINAL_STATES

    @property
    def charged_attempts(self) -> int:
        """Attempts charged to ``max_attempts``: deaths and uncaught errors (docs/design.md §5, issue 16).

        Those started, less those a graceful revoke ended and those that ended by waiting.
        """
        return self.attempt_count - self.revoked_count - self.suspended_count


@dataclass(frozen=True, slots=True)
class ConversationState:
    """A conversation's folded state (docs/design.md §1b, §3, §4).

    Attributes:
        conversation_id: The conversation.
        submissions: Every admitted submission by id, settled ones included (compacted).
        queue: Ids of the nonterminal submissions in submission-sequence order (FIFO, DUR-004).
        active_submission_id: The submission holding the lane: started and not settled (at most one, DUR-005).
        last_submission_seq: The last allocated submission sequence.
        last_event_seq: Event sequence of the conversation's last canonical event.
        last_batch_digest: Digest of its last batch (the next batch's ``prev_batch_digest``).
        owner_epoch: Epoch of the partition's latest `OwnershipClaimed`.
        key_index: `scope_digest` of (principal, conversation, key) → `KeyEntry`, kept for the life of the log
            (docs/design.md §4).
        decided_inputs: Inbox inputs whose decision is canonical; re-read ones are skipped (docs/design.md §3).
        applied_commands: Command id → target submission id of every applied command (abort, resolution); an
            access command's target is its grantee (issue 20).
        access: Principal → the access granted to it (`AccessGranted`, less `AccessRevoked`; issue 20). The opener
            (`settled.protocol.conversation_opener`) is not listed: its access comes from opening the conversation.
        flow_runs: Flow run id → the submission that opened it, of every flow run the conversation opened (issue 18),
            kept for the life of the log: a turn naming a run id not here is rejected ``unknown_target``.
        lane: The conversation's lane policy (issue 22 item 1): recorded on the admission that opens it (queue for a
            conversation whose opening admission recorded none).
    """

    conversation_id: str
    submissions: Mapping[str, Submission] = field(default_factory=_empty)
    queue: tuple[str, ...] = ()
    active_submission_id: str | None = None
    last_submission_seq: int = 0
    last_event_seq: int = 0
    last_batch_digest: str | None = None
    owner_epoch: int = 0
    key_index: Mapping[str, KeyEntry] = field(default_factory=_empty)
    decided_inputs: frozenset[InputKey] = frozenset()
    applied_commands: Mapping[str, str] = field(default_factory=_empty)
    access: Mapping[str, AccessLevel] = field(default_factory=_empty)
    flow_runs: Mapping[str, str] = field(default_factory=_empty)
    lane: LanePolicy = LanePolicy.QUEUE

    def submission(self, submission_id: str) -> Submission | None:
        """Return a submission by id.

        Args:
            submission_id: The id.

        Returns:
            The submission, or None when the conversation has not admitted it.
        """
        return self.submissions.get(submission_id)

    def state_of(self, submission_id: str) -> SubmissionState:
        """Return a submission's state; `SubmissionState.PROPOSED` for one that is not admitted.

        Args:
            submission_id: The id.

        Returns:
            Its state.
        """
        found = self.submissions.get(submission_id)
        return S.PROPOSED if found is None else found.state

    def lookup_key(self, principal: str, idempotency_key: str) -> KeyEntry | None:
        """Resolve an idempotency key in this conversation (docs/design.md §4).

        Args:
            principal: Who submits.
            idempotency_key: The client key.

        Returns:
            The admitted submission's entry, or None when the key is new.
        """
        return self.key_index.get(scope_digest(principal, self.conversation_id, idempotency_key))

    def is_decided(self, ref: InputRef) -> bool:
        """Tell whether an inbox input's decision is already canonical (docs/design.md §3).

        Args:
            ref: The input.

        Returns:
            True when a folded event carries this input reference.
        """
        return input_key(ref) in self.decided_inputs

    def active(self) -> Submission | None:
        """Return the submission holding the lane, if any (DUR-005).

        Returns:
            The active submission or None.
        """
        return None if self.active_submission_id is None else self.submissions[self.active_submission_id]


@dataclass(frozen=True, slots=True)
class PartitionState:
    """The folded state of one log partition: its conversations and its ownership (docs/design.md §3).

    Attributes:
        partition: The partition number.
        conversations: Conversation id → state.
        claim_epoch: Epoch of the latest `OwnershipClaimed` (0 before the first claim).
        claimed_by: Worker id of that claim.
        partition_count: Partition count fixed by the `Genesis` record, once folded.
        quarantined_inputs: Inbox inputs decided by `InputQuarantined`, whatever conversation's batch held them (an
            undecodable record has no trustworthy conversation; docs/design.md §3).
    """

    partition: int
    conversations: Mapping[str, ConversationState] = field(default_factory=_empty)
    claim_epoch: int = 0
    claimed_by: str | None = None
    partition_count: int | None = None
    quarantined_inputs: frozenset[InputKey] = frozenset()

    def conversation(self, conversation_id: str) -> ConversationState:
        """Return a conversation's state, empty when the partition has none yet.

        Args:
            conversation_id: The conversation.

        Returns:
            Its state (a new empty one carrying the partition's claim epoch when unknown).
        """
        found = self.conversations.get(conversation_id)
        if found is not None:
            return found
        return ConversationState(conversation_id=conversation_id, owner_epoch=self.claim_epoch)

    def is_decided(self, ref: InputRef, conversation_id: str | None = None) -> bool:
        """Tell whether an inbox input's decision is canonical (docs/design.md §3).

        Args:
            ref: The input.
            conversation_id: Its conversation, when the record could be decoded.

        Returns:
            True when it was quarantined, or decided in ``conversation_id``.
        """
        if input_key(ref) in self.quarantined_inputs:
            return True
        if conversation_id is None:
            return False
        found = self.conversations.get(conversation_id)
        return found is not None and found.is_decided(ref)


@dataclass(frozen=True, slots=True)
class Transition:
    """One state change the fold made: which submission, which edge, which event.

    Attributes:
        conversation_id: The conversation.
        submission_id: The submission.
        edge: The table edge taken (an element of `settled.protocol.EDGES`).
        event: The causing event.
    """

    conversation_id: str
    submission_id: str
    edge: Edge
    event: AvroRecord


class BatchLike(Protocol):
    """What the fold reads of a canonical batch; `settled.schemas.LogBatch` has this shape."""

    @property
    def conversation_id(self) -> str:
        """The conversation."""

    @property
    def first_event_seq(self) -> int:
        """Event sequence of the first event."""

    @property
    def owner_epoch(self) -> int:
        """The appender's logical owner epoch."""

    @property
    def prev_batch_digest(self) -> str | None:
        """The conversation's previous batch digest."""

    @property
    def batch_digest(self) -> str:
        """This batch's digest."""

    @property
    def events(self) -> Sequence[LogEvent]:
        """The events."""


# --------------------------------------------------------------------------------------------------- builders


def _name(event: AvroRecord) -> str:
    return type(event).__name__


_RUNNING = frozenset({S.RUNNING})
_RECOVERY = frozenset({S.RECOVERY})
_UNKNOWN = frozenset({waiting_state(WaitKind.UNKNOWN)})
_RUNNING_OR_RECOVERY = frozenset({S.RUNNING, S.RECOVERY})
_RUNNING_OR_WAITING = frozenset({S.RUNNING, S.WAITING})


# The fold's values are built as drafts: an instance of a plain class with the same slots as the frozen dataclass,
# filled by plain attribute stores (which CPython's specializing interpreter turns into direct slot writes), whose
# ``__class__`` is then set to the frozen class. Python allows that assignment between two classes whose instances
# have the same layout (same base, same slots, in the same order), and the object is then exactly what the frozen
# class's ``__init__`` builds: that ``__init__`` stores each field through ``object.__setattr__`` instead, one call
# per field, about 5x slower for a `Submission` here. Each builder below is written out field by field (no generated
# code); `_check_builder` makes a field added to a dataclass but not to its builder fail at import.


def _draft_class(cls: type[Any]) -> type[Any]:
    """Return the draft class of a frozen slots dataclass: a plain class with the same slots, in the same order.

    Args:
        cls: The frozen slots dataclass.

    Returns:
        The draft class (``_<Name>Draft``).

    Raises:
        TypeError: ``cls``'s ``__init__`` does more than store its fields (a field with ``init=False``, a
            ``__post_init__``), or its instances' layout is not its fields' slots.
    """
    found = dataclasses.fields(cls)
    names = tuple(f.name for f in found)
    if any(not f.init for f in found) or hasattr(cls, "__post_init__") or vars(cls).get("__slots__") != names:
        raise TypeError(f"{cls.__name__}'s __init__ does more than store its fields: the fold must call it")
    draft = type(f"_{cls.__name__}Draft", (), {"__slots__": names, "__module__": __name__})
    probe: Any = object.__new__(draft)
    probe.__class__ = cls  # a layout that differs raises TypeError here, at import
    return draft


def _check_builder(cls: type[Any], made: object) -> None:
    """Check that a builder below made a ``cls`` with every field set.

    Args:
        cls: The dataclass.
        made: What its builder returned.

    Raises:
        TypeError: ``made`` is not a ``cls``, or a field of ``cls`` is missing from its builder.
    """
    missing = [f.name for f in dataclasses.fields(cls) if not hasattr(made, f.name)]
    if type(made) is not cls or missing:
        raise TypeError(f"the fold's builder of {cls.__name__} does not set {missing}: add them to it")


_new = object.__new__
_SubmissionDraft = _draft_class(Submission)
_ConversationDraft = _draft_class(ConversationState)
_TransitionDraft = _draft_class(Transition)
_KeyEntryDraft = _draft_class(KeyEntry)
_SUBMISSION_FIELDS = frozenset(f.name for f in dataclasses.fields(Submission))


def _new_transition(conversation_id: str, submission_id: str, edge: Edge, event: AvroRecord) -> Transition:
    """Return ``Transition(conversation_id, submission_id, edge, event)``, built as a draft (`_ConvBuilder.move`).

    Args:
        conversation_id: The conversation.
        submission_id: The submission.
        edge: The edge taken.
        event: The causing event.

    Returns:
        The transition.
    """
    made = _new(_TransitionDraft)
    made.conversation_id = conversation_id
    made.submission_id = submission_id
    made.edge = edge
    made.event = event
    made.__class__ = Transition
    done: Transition = made
    return done


def _new_key_entry(submission_id: str, payload_digest: str, submission_seq: int) -> KeyEntry:
    """Return ``KeyEntry(submission_id, payload_digest, submission_seq)``, built as a draft (an admission).

    Args:
        submission_id: The admitted submission.
        payload_digest: Its payload's digest.
        submission_seq: Its submission sequence.

    Returns:
        The entry.
    """
    made = _new(_KeyEntryDraft)
    made.submission_id = submission_id
    made.payload_digest = payload_digest
    made.submission_seq = submission_seq
    made.__class__ = KeyEntry
    done: KeyEntry = made
    return done


def _new_conversation(
    conversation_id: str,
    submissions: Mapping[str, Submission],
    queue: tuple[str, ...],
    active_submission_id: str | None,
    last_submission_seq: int,
    last_event_seq: int,
    last_batch_digest: str | None,
    owner_epoch: int,
    key_index: Mapping[str, KeyEntry],
    decided_inputs: frozenset[InputKey],
    applied_commands: Mapping[str, str],
    access: Mapping[str, AccessLevel],
    flow_runs: Mapping[str, str],
    lane: LanePolicy,
) -> ConversationState:
    """Return ``ConversationState(...)`` with every field, built as a draft (`_ConvBuilder.freeze`: one per batch).

    Args:
        conversation_id: See `ConversationState`, as every other argument.
        submissions: The submissions.
        queue: The queue.
        active_submission_id: The active submission.
        last_submission_seq: The last submission sequence.
        last_event_seq: The last event sequence.
        last_batch_digest: The last batch's digest.
        owner_epoch: The owner epoch.
        key_index: The key index.
        decided_inputs: The decided inputs.
        applied_commands: The applied commands.
        access: The access granted.
        flow_runs: The flow runs it opened.
        lane: The lane policy.

    Returns:
        The conversation's state.
    """
    made = _new(_ConversationDraft)
    made.conversation_id = conversation_id
    made.submissions = submissions
    made.queue = queue
    made.active_submission_id = active_submission_id
    made.last_submission_seq = last_submission_seq
    made.last_event_seq = last_event_seq
    made.last_batch_digest = last_batch_digest
    made.owner_epoch = owner_epoch
    made.key_index = key_index
    made.decided_inputs = decided_inputs
    made.applied_commands = applied_commands
    made.access = access
    made.flow_runs = flow_runs
    made.lane = lane
    made.__class__ = ConversationState
    done: ConversationState = made
    return done


def _replace(sub: Submission, **changes: Any) -> Submission:
    """Return ``dataclasses.replace(sub, **changes)``, built as a draft (the fold's commonest value).

    Args:
        sub: The submission.
        **changes: New values of some of its fields.

    Returns:
        A new submission with ``sub``'s fields but those changed.

    Raises:
        TypeError: A change names no field of `Submission` (as ``dataclasses.replace`` does).
    """
    made = _new(_SubmissionDraft)
    made.submission_id = sub.submission_id
    made.submission_seq = sub.submission_seq
    made.principal = sub.principal
    made.idempotency_key = sub.idempotency_key
    made.payload_digest = sub.payload_digest
    made.state = sub.state
    made.input_json = sub.input_json
    made.tools_offered = sub.tools_offered
    made.admitted_input_ref = sub.admitted_input_ref
    made.attempt_count = sub.attempt_count
    made.revoked_count = sub.revoked_count
    made.attempt_id = sub.attempt_id
    made.input_applied = sub.input_applied
    made.abort_command_ids = sub.abort_command_ids
    made.abort_reason = sub.abort_reason
    made.reserved_outcome = sub.reserved_outcome
    made.open_calls = sub.open_calls
    made.unknown_calls = sub.unknown_calls
    made.outcome = sub.outcome
    made.waits = sub.waits
    made.suspended_count = sub.suspended_count
    made.approvals = sub.approvals
    made.retries = sub.retries
    made.retry_wait_id = sub.retry_wait_id
    made.error_type = sub.error_type
    made.retry_of = sub.retry_of
    made.retried_as = sub.retried_as
    made.joined_to = sub.joined_to
    made.joined = sub.joined
    for name, value in changes.items():
        if name not in _SUBMISSION_FIELDS:
            raise TypeError(f"Submission has no field {name!r}")
        setattr(made, name, value)
    made.__class__ = Submission
    done: Submission = made
    return done


_PROPOSED = Submission("", 0, "", "", "", S.PROPOSED, None, (), None)
"""A proposed submission with every defaulted field at its default: an admission's submission is built from it."""

_ANY: Any = None
_check_builder(Submission, _replace(_PROPOSED))
_check_builder(ConversationState, _new_conversation(*[_ANY] * _new_conversation.__code__.co_argcount))
_check_builder(Transition, _new_transition(_ANY, _ANY, _ANY, _ANY))
_check_builder(KeyEntry, _new_key_entry(_ANY, _ANY, _ANY))


_EDGES: dict[tuple[SubmissionState, SubmissionState, type[AvroRecord], str | None], Edge | None] = {}


def _edge(source: SubmissionState, target: SubmissionState, event: AvroRecord) -> Edge | None:
    """`find_edge`, remembered per (source, target, event type, qualifier): all an edge's ``admits`` reads."""
    key = (source, target, type(event), cause_qualifier(event))
    try:
        return _EDGES[key]
    except KeyError:
        found = _EDGES[key] = find_edge(source, target, event)
        return found


_K = TypeVar("_K")
_V = TypeVar("_V")


def _copy(mapping: Mapping[_K, _V]) -> dict[_K, _V]:
    """Return a new dict of a mapping's items (a read-only proxy or a dict is copied in C).

    ``dict(proxy)`` copies a `MappingProxyType` item by item: ~15x slower for a conversation's submissions.
    """
    if isinstance(mapping, MappingProxyType):
        return mapping.copy()
    if type(mapping) is dict:
        return mapping.copy()
    return dict(mapping)


class _ConvBuilder:
    """Mutable working copy of a `ConversationState`; maps are copied on first write."""

    __slots__ = (
        "_access", "_commands", "_flows", "_inputs", "_keys", "_subs", "active", "base", "cid", "lane",
        "last_batch_digest", "last_event_seq", "last_submission_seq", "owner_epoch", "queue", "settled_hosts", "trace",
    )  # fmt: skip

    def __init__(self, base: ConversationState, trace: list[Transition]) -> None:
        self.base = base
        self.cid = base.conversation_id
        self.trace = trace
        self.queue = base.queue
        self.active = base.active_submission_id
        self.last_submission_seq = base.last_submission_seq
        self.last_event_seq = base.last_event_seq
        self.last_batch_digest = base.last_batch_digest
        self.owner_epoch = base.owner_epoch
        self.lane = base.lane
        self.settled_hosts: tuple[str, ...] = ()  # hosts with joined submissions settled in the batch being folded
        self._subs: dict[str, Submission] | None = None
        self._keys: dict[str, KeyEntry] | None = None
        self._inputs: set[InputKey] | None = None
        self._commands: dict[str, str] | None = None
        self._access: dict[str, AccessLevel] | None = None
        self._flows: dict[str, str] | None = None

    # -- copy-on-write access ---------------------------------------------------------------------------------

    def subs(self) -> Mapping[str, Submission]:
        return self.base.submissions if self._subs is None else self._subs

    def put(self, sub: Submission) -> None:
        if self._subs is None:
            self._subs = _copy(self.base.submissions)
        self._subs[sub.submission_id] = sub

    def keys(self) -> Mapping[str, KeyEntry]:
        return self.base.key_index if self._keys is None else self._keys

    def add_key(self, digest: str, entry: KeyEntry) -> None:
        if self._keys is None:
            self._keys = _copy(self.base.key_index)
        self._keys[digest] = entry

    def commands(self) -> Mapping[str, str]:
        return self.base.applied_commands if self._commands is None else self._commands

    def flow_runs(self) -> Mapping[str, str]:
        return self.base.flow_runs if self._flows is None else self._flows

    def add_command(self, command_id: str, submission_id: str) -> None:
        if self._commands is None:
            self._commands = _copy(self.base.applied_commands)
        self._commands[command_id] = submission_id

    def set_access(self, grantee: str, access: AccessLevel | None) -> None:
        if self._access is None:
            self._access = _copy(self.base.access)
        if access is None:
            self._access.pop(grantee, None)
        else:
            self._access[grantee] = access

    def add_flow_run(self, run_id: str, submission_id: str) -> None:
        if self._flows is None:
            self._flows = _copy(self.base.flow_runs)
        self._flows[run_id] = submission_id

    def decide(self, event: AvroRecord, ref: InputRef | None) -> None:
        """Record an inbox input as decided; each input is decided exactly once (docs/design.md §3)."""
        if ref is None:
            return
        key = input_key(ref)
        current: frozenset[InputKey] | set[InputKey] = (
            self.base.decided_inputs if self._inputs is None else self._inputs
        )
        if key in current:
            raise LogInconsistencyError(
                self.cid, _name(event), "input_ref", key, "this inbox input is already decided (docs/design.md §3)"
            )
        if self._inputs is None:
            self._inputs = set(self.base.decided_inputs)
        self._inputs.add(key)

    def freeze(self) -> ConversationState:
        base = self.base
        return _new_conversation(  # ConversationState's fields in their order
            self.cid,
            base.submissions if self._subs is None else MappingProxyType(self._subs),
            self.queue,
            self.active,
            self.last_submission_seq,
            self.last_event_seq,
            self.last_batch_digest,
            self.owner_epoch,
            base.key_index if self._keys is None else MappingProxyType(self._keys),
            base.decided_inputs if self._inputs is None else frozenset(self._inputs),
            base.applied_commands if self._commands is None else MappingProxyType(self._commands),
            base.access if self._access is None else MappingProxyType(self._access),
            base.flow_runs if self._flows is None else MappingProxyType(self._flows),
            self.lane,
        )

    # -- helpers ----------------------------------------------------------------------------------------------

    def get(self, submission_id: str, event: AvroRecord, target: SubmissionState | None) -> Submission:
        found = self.subs().get(submission_id)
        if found is None:
            raise IllegalTransitionError(
                submission_id, S.PROPOSED, target, _name(event), "the conversation has not admitted this submission"
            )
        return found

    def move(self, sub: Submission, target: SubmissionState, event: AvroRecord, **changes: Any) -> Submission:
        """Take the table edge ``sub.state -> target`` caused by ``event``, or raise `IllegalTransitionError`."""
        edge = _edge(sub.state, target, event)
        if edge is None:
            raise IllegalTransitionError(
                sub.submission_id,
                sub.state,
                target,
                _name(event),
                "not an edge of the state table (docs/semantics.md §3)",
            )
        self.trace.append(_new_transition(self.cid, sub.submission_id, edge, event))
        moved = _replace(sub, state=target, **changes)
        self.put(moved)
        return moved

    def require(self, sub: Submission, states: frozenset[SubmissionState], event: AvroRecord, why: str) -> None:
        """Check that an in-state event (one that changes no state) is permitted in the submission's state."""
        if sub.state not in states:
            allowed = ", ".join(sorted(state.value for state in states))
            raise IllegalTransitionError(
                sub.submission_id, sub.state, None, _name(event), f"{why}; permitted only in: {allowed}"
            )

    def require_attempt(self, sub: Submission, attempt_id: str, event: AvroRecord) -> None:
        if sub.attempt_id != attempt_id:
            raise LogInconsistencyError(
                self.cid,
                _name(event),
                "attempt_id",
                attempt_id,
                f"submission {sub.submission_id!r} runs attempt {sub.attempt_id!r}; a stale attempt cannot append "
                "(docs/semantics.md §6)",
            )

    def fail(self, event: AvroRecord, field_name: str, value: object, reason: str) -> LogInconsistencyError:
        return LogInconsistencyError(self.cid, _name(event), field_name, value, reason)

    def repeated_command(
        self, event: AbortRecorded | UnknownResolved | ApprovalDecided | SignalReceived | SteeringReceived
    ) -> bool:
        """Whether ``event``'s command id was applied before: its record then only marks its input decided.

        Raises:
            LogInconsistencyError: The command id was applied to another submission.
        """
        previous_target = self.commands().get(event.command_id)
        if previous_target is None:
            return False
        if previous_target != event.submission_id:
            raise self.fail(
                event, "submission_id", event.submission_id, f"command already applied to {previous_target!r}"
            )
        return True

    # -- the rules, one per event type -------------------------------------------------------------------------

    def on_claim(self, event: OwnershipClaimed) -> None:
        """The new owner's claim: an attempt still running in the log lost its worker (Running → Recovery).

        See docs/semantics.md §3.
        """
        self.owner_epoch = event.owner_epoch
        if self.active is None:
            return
        sub = self.subs()[self.active]
        if sub.state is S.RUNNING:
            self.move(sub, S.RECOVERY, event)

    def on_admitted(self, event: SubmissionAdmitted, batch_epoch: int) -> None:
        existing = self.subs().get(event.submission_id)
        if existing is not None:
            raise IllegalTransitionError(
                event.submission_id, existing.state, S.ADMITTED, _name(event), "the submission is already admitted"
            )
        if event.conversation_id != self.cid:
            raise self.fail(event, "conversation_id", event.conversation_id, "admitted into another conversation")
        if event.submission_seq != self.last_submission_seq + 1:
            raise self.fail(
                event,
                "submission_seq",
                event.submission_seq,
                f"expected {self.last_submission_seq + 1}: the submission sequence has no gaps (DUR-004)",
            )
        digest = scope_digest(event.principal, event.conversation_id, event.idempotency_key)
        known = self.keys().get(digest)
        if known is not None:
            raise self.fail(
                event,
                "idempotency_key",
                event.idempotency_key,
                f"key already admitted as submission {known.submission_id!r} (DUR-001: admitted once per key)",
            )
        original = None
        if event.retry_of is not None:  # a dead letter admitted again (issue 22 item 4; settled.protocol.retry)
            original = self.subs().get(event.retry_of)
            if original is None or not original.dead_lettered:
                raise self.fail(event, "retry_of", event.retry_of, "no such dead-lettered submission")
            if original.retried_as is not None:
                raise self.fail(event, "retry_of", event.retry_of, f"already retried as {original.retried_as!r}")
        self.decide(event, event.input_ref)
        if event.flow_run_id is not None and event.flow_run_id not in self.flow_runs():
            self.add_flow_run(event.flow_run_id, event.submission_id)  # the turn that opens the run
        if original is not None:  # its payload was kept for this retry only
            self.put(_replace(original, retried_as=event.submission_id, input_json=None, tools_offered=()))
        proposed = _replace(  # Submission(...) with these fields and every other one at its default
            _PROPOSED,
            submission_id=event.submission_id,
            submission_seq=event.submission_seq,
            principal=event.principal,
            idempotency_key=event.idempotency_key,
            payload_digest=event.payload_digest,
            input_json=event.input_json,
            tools_offered=event.tools_offered,
            admitted_input_ref=event.input_ref,
            retry_of=event.retry_of,
        )
        self.move(proposed, S.ADMITTED, event)
        self.add_key(digest, _new_key_entry(event.submission_id, event.payload_digest, event.submission_seq))
        self.last_submission_seq = event.submission_seq
        self.queue = (*self.queue, event.submission_id)
        if event.lane is not None:  # the admission that opens the conversation records its lane (issue 22 item 1)
            self.lane = event.lane

    def on_ready(self, event: SubmissionReady, batch_epoch: int) -> None:
        sub = self.get(event.submission_id, event, S.READY)
        if event.submission_seq != sub.submission_seq:
            raise self.fail(event, "submission_seq", event.submission_seq, f"the submission's is {sub.submission_seq}")
        self.move(sub, S.READY, event)

    def on_rejected(self, event: SubmissionRejected, batch_epoch: int) -> None:
        self.decide(event, event.input_ref)

    def on_duplicate(self, event: SubmissionDuplicate, batch_epoch: int) -> None:
        original = self.subs().get(event.original_submission_id)
        if original is None:
            raise self.fail(
                event, "original_submission_id", event.original_submission_id, "no such admitted submission"
            )
        if original.idempotency_key != event.idempotency_key:
            raise self.fail(
                event, "idempotency_key", event.idempotency_key, f"the original's key is {original.idempotency_key!r}"
            )
        self.decide(event, event.input_ref)

    def on_quarantined(self, event: InputQuarantined, batch_epoch: int) -> None:
        self.decide(event, event.input_ref)

    def on_command_rejected(self, event: CommandRejected, batch_epoch: int) -> None:
        self.decide(event, event.input_ref)

    def on_abort(self, event: AbortRecorded, batch_epoch: int) -> None:
        self.decide(event, event.input_ref)
        if self.repeated_command(event):  # the record only marks its input decided (DUR-012: idempotent)
            return
        sub = self.get(event.submission_id, event, None)
        if sub.terminal:
            raise IllegalTransitionError(
                sub.submission_id, sub.state, None, _name(event), "a settled submission cannot be aborted (DUR-012)"
            )
        if sub.reserved_outcome is not None and sub.reserved_outcome is not SettlementOutcome.ABORTED:
            raise IllegalTransitionError(
                sub.submission_id,
                sub.state,
                None,
                _name(event),
                f"outcome {sub.reserved_outcome.value} is already reserved (docs/semantics.md §12)",
            )
        changes: dict[str, Any] = {"abort_command_ids": (*sub.abort_command_ids, event.command_id)}
        if not sub.abort_requested:
            changes["abort_reason"] = event.reason
        if sub.state is S.TERMINALIZING:
            changes["reserved_outcome"] = SettlementOutcome.ABORTED
        self.put(_replace(sub, **changes))
        self.add_command(event.command_id, event.submission_id)

    def on_attempt_started(self, event: AttemptStarted, batch_epoch: int) -> None:
        sub = self.get(event.submission_id, event, S.RUNNING)
        if sub.joined_to is not None:
            raise IllegalTransitionError(
                sub.submission_id,
                sub.state,
                S.RUNNING,
                _name(event),
                f"joined into run {sub.joined_to!r}: it runs and settles only with its host (issue 22 item 2)",
            )
        if sub.state is S.READY:
            if sub.abort_requested:
                raise IllegalTransitionError(
                    sub.submission_id,
                    sub.state,
                    S.RUNNING,
                    _name(event),
                    "an abort is recorded (docs/semantics.md §13)",
                )
            if self.active is not None and self.active != sub.submission_id:
                raise IllegalTransitionError(
                    sub.submission_id,
                    sub.state,
                    S.RUNNING,
                    _name(event),
                    f"submission {self.active!r} holds the lane (DUR-005: at most one active per conversation)",
                )
            if self.queue and self.queue[0] != sub.submission_id:
                head = self.subs()[self.queue[0]]
                raise IllegalTransitionError(
                    sub.submission_id,
                    sub.state,
                    S.RUNNING,
                    _name(event),
                    f"submission {head.submission_id!r} (seq {head.submission_seq}) is ahead of seq "
                    f"{sub.submission_seq} and not settled (DUR-004: FIFO by submission sequence)",
                )
        if event.attempt != sub.attempt_count + 1:
            raise self.fail(event, "attempt", event.attempt, f"expected {sub.attempt_count + 1}")
        if event.owner_epoch != batch_epoch:
            raise self.fail(event, "owner_epoch", event.owner_epoch, f"the batch's owner epoch is {batch_epoch}")
        self.move(sub, S.RUNNING, event, attempt_count=event.attempt, attempt_id=event.attempt_id)
        self.active = sub.submission_id

    def on_interrupted(self, event: AttemptInterrupted, batch_epoch: int) -> None:
        sub = self.get(event.submission_id, event, None)
        self.require(sub, _RUNNING, event, "only a running attempt is interrupted")
        self.require_attempt(sub, event.attempt_id, event)
        revoked = sub.revoked_count + (1 if event.reason == GRACEFUL_REVOKE else 0)
        if sub.open_calls or sub.unknown_calls:
            self.move(sub, S.RECOVERY, event, revoked_count=revoked)
        else:
            self.move(sub, S.READY, event, revoked_count=revoked)

    def on_input_applied(self, event: InputApplied, batch_epoch: int) -> None:
        sub = self.get(event.submission_id, event, None)
        self.require(sub, _RUNNING, event, "input is applied by a running attempt (docs/semantics.md §4)")
        self.require_attempt(sub, event.attempt_id, event)
        if sub.input_json is not None and event.input_digest != json_digest(sub.input_json):
            raise self.fail(event, "input_digest", event.input_digest, "not the digest of the admitted input")
        self.put(_replace(sub, input_applied=True))

    def on_running_record(
        self,
        event: ModelResponseDelta
        | ModelResponseCompleted
        | ModelResponseInterrupted
        | ToolCallRefused
        | StepRecorded
        | EffectRecorded
        | StepRetryScheduled
        | SteeringDelivered,
        batch_epoch: int,
    ) -> None:
        sub = self.get(event.submission_id, event, None)
        if sub.state is not S.RUNNING:  # the checks of require / require_attempt, inlined: the commonest events
            self.require(sub, _RUNNING, event, "only a running attempt appends history")
        if sub.attempt_id != event.attempt_id:
            self.require_attempt(sub, event.attempt_id, event)

    def on_joined(self, event: SubmissionsJoined, batch_epoch: int) -> None:
        """A running host takes in the contiguous ready prefix queued behind it (issue 22 item 2, DUR-016)."""
        host = self.get(event.submission_id, event, None)
        self.require(host, _RUNNING, event, "only a running attempt joins queued submissions")
        self.require_attempt(host, event.attempt_id, event)
        ids = tuple(event.joined_ids)
        prefix = joinable_prefix(self.queue, self.subs(), host.submission_id)
        if not ids or list(ids) != prefix[: len(ids)]:
            raise self.fail(
                event,
                "joined_ids",
                list(ids),
                f"not a non-empty prefix of the ready submissions queued behind the host: {prefix}",
            )
        for submission_id in ids:
            sub = self.subs()[submission_id]
            joining = self.move(sub, S.JOINING, event)
            self.move(joining, S.JOINED, event, joined_to=host.submission_id, input_applied=True)
        self.put(_replace(self.subs()[host.submission_id], joined=(*host.joined, *ids)))

    def on_prepared(self, event: ToolCallPrepared, batch_epoch: int) -> None:
        sub = self.get(event.submission_id, event, None)
        self.require(sub, _RUNNING, event, "only a running attempt prepares calls")
        self.require_attempt(sub, event.attempt_id, event)
        if event.call_id in sub.open_calls or event.call_id in sub.unknown_calls:
            raise self.fail(event, "call_id", event.call_id, "the call is already prepared and not settled")
        self.put(_replace(sub, open_calls=sub.open_calls | {event.call_id}))

    def on_tool_settled(self, event: ToolCallSettled, batch_epoch: int) -> None:
        sub = self.get(event.submission_id, event, None)
        self.require(sub, _RUNNING_OR_RECOVERY, event, "a call settles in its run or by reconciliation")
        if event.call_id not in sub.open_calls:
            raise self.fail(event, "call_id", event.call_id, "no prepared, unsettled call with this id (DUR-009)")
        self.put(_replace(sub, open_calls=sub.open_calls - {event.call_id}))

    def on_tool_unknown(self, event: ToolCallUnknown, batch_epoch: int) -> None:
        sub = self.get(event.submission_id, event, None)
        if event.call_id not in sub.open_calls:
            raise self.fail(event, "call_id", event.call_id, "no prepared, unsettled call with this id (DUR-009)")
        changes: dict[str, Any] = {
            "open_calls": sub.open_calls - {event.call_id},
            "unknown_calls": sub.unknown_calls | {event.call_id},
        }
        if sub.state is S.RUNNING:
            self.move(sub, S.RECOVERY, event, **changes)
        else:
            self.require(sub, _RECOVERY, event, "a call is marked Unknown by its run or by recovery")
            self.put(_replace(sub, **changes))

    def on_recovery_decision(self, event: RecoveryDecision, batch_epoch: int) -> None:
        sub = self.get(event.submission_id, event, None)
        self.require(sub, _RECOVERY, event, "the classifier decides a submission in recovery (DUR-013)")
        if event.decision is RecoveryDecisionKind.UNKNOWN:
            if not sub.unknown_calls:
                raise self.fail(event, "decision", event.decision.value, "no call is marked Unknown (ToolCallUnknown)")
            self.suspend(sub, WaitKind.UNKNOWN, event)
        elif event.decision is RecoveryDecisionKind.TERMINALIZE:
            reserved = SettlementOutcome.ABORTED if sub.abort_requested else None
            self.move(sub, S.TERMINALIZING, event, reserved_outcome=reserved)
        else:
            if sub.unknown_calls:
                raise IllegalTransitionError(
                    sub.submission_id,
                    sub.state,
                    S.READY,
                    _name(event),
                    f"calls {sorted(sub.unknown_calls)} are Unknown:"
                    " they block continuation until resolved (docs/semantics.md §3)",
                )
            self.move(sub, S.READY, event, open_calls=frozenset())

    def on_unknown_resolved(self, event: UnknownResolved, batch_epoch: int) -> None:
        self.decide(event, event.input_ref)
        if self.repeated_command(event):
            return
        sub = self.get(event.submission_id, event, None)
        self.require(sub, _UNKNOWN, event, "only an Unknown submission is resolved")
        if event.call_id not in sub.unknown_calls:
            raise self.fail(event, "call_id", event.call_id, "the call is not Unknown")
        if event.kind is ResolutionKind.OUTCOME_FOR_SUBMISSION:
            # The kind's own rule: a resolution may fix the submission's outcome instead of resuming it.
            if event.outcome is None:
                raise self.fail(event, "outcome", None, "required for outcome_for_submission")
            reserved = SettlementOutcome.ABORTED if sub.abort_requested else event.outcome
            remaining = sub.unknown_calls - {event.call_id}
            self.move(sub, S.TERMINALIZING, event, unknown_calls=remaining, reserved_outcome=reserved)
        else:
            self.end_wait(sub, event.call_id, event)
        self.add_command(event.command_id, event.submission_id)

    def on_wait_requested(self, event: WaitRequested, batch_epoch: int) -> None:
        """A run asks to wait: the first request of its batch suspends it (Running → Waiting; issue 16).

        A run hands its waits over as its last records, once no call of it is in flight: requests made together
        (a parallel batch) follow the first in Waiting, from the same attempt.
        """
        sub = self.get(event.submission_id, event, S.WAITING)
        if event.kind is WaitKind.UNKNOWN:
            raise self.fail(
                event,
                "kind",
                event.kind.value,
                "a wait of kind unknown is requested by ToolCallUnknown and RecoveryDecision unknown, not by its run",
            )
        if sub.state is S.READY:
            # A retry's backoff (issue 22 item 4): the owner's timed wait, right after its SubmissionRetryScheduled.
            if event.wait_id != sub.retry_wait_id:
                raise self.fail(
                    event,
                    "wait_id",
                    event.wait_id,
                    f"a Ready submission waits only for its retry ({sub.retry_wait_id})",
                )
            self.require_attempt(sub, event.attempt_id, event)
            self.suspend(sub, event.kind, event, waits=frozenset({event.wait_id}), retry_wait_id=None)
            return
        self.require(sub, _RUNNING_OR_WAITING, event, "only a running attempt asks to wait")
        self.require_attempt(sub, event.attempt_id, event)
        if sub.open_calls or sub.unknown_calls:
            raise self.fail(
                event, "wait_id", event.wait_id, f"calls {sorted(sub.open_calls | sub.unknown_calls)} are not settled"
            )
        if event.wait_id in sub.waits:
            raise self.fail(event, "wait_id", event.wait_id, "the wait is already requested and not decided")
        waits = sub.waits | {event.wait_id}
        approvals = sub.approvals
        if event.kind is WaitKind.APPROVAL:
            digest = _approval_digest_of(event.details_json)
            if digest is None:
                raise self.fail(event, "details_json", event.details_json, "an approval names its args_digest")
            approvals = approvals | {(event.wait_id, digest)}
        if sub.state is S.RUNNING:
            suspended = sub.suspended_count + 1
            self.suspend(sub, event.kind, event, waits=waits, suspended_count=suspended, approvals=approvals)
        else:
            self.put(_replace(sub, waits=waits, approvals=approvals))

    def on_wait_resolved(self, event: WaitResolved, batch_epoch: int) -> None:
        """A wait decided (delivered or expired); the last one of the run makes it Ready again (issue 16)."""
        sub = self.get(event.submission_id, event, S.READY)
        if event.wait_id not in sub.waits:
            raise self.fail(event, "wait_id", event.wait_id, "no such wait is open (a wait is decided once)")
        self.require(sub, frozenset({S.WAITING}), event, "only a waiting run's waits are decided")
        self.end_wait(sub, event.wait_id, event)

    # -- the generic wait (issue 16): one suspension and one delivery for every kind ----------------------------

    def suspend(self, sub: Submission, kind: WaitKind, event: AvroRecord, **changes: Any) -> None:
        """Suspend a run on a wait of ``kind``: it holds its lane and no worker until its waits are delivered.

        The first wait of a run takes it into the waiting state labelled for the kind (`waiting_state`): Running →
        Waiting on a `WaitRequested`, Recovery → Unknown on a `RecoveryDecision` ``unknown``.
        """
        self.move(sub, waiting_state(kind), event, **changes)

    def end_wait(self, sub: Submission, wait_id: str, event: AvroRecord) -> None:
        """Deliver one open wait of a suspended run (every kind); the last one makes it Ready (Waiting → Ready).

        A run resumes only once every wait it is suspended on is decided. Resuming from a wait of kind `unknown`
        also drops the calls recovery left open: the next attempt prepares again only what a decision names.
        """
        if sub.wait_kinds.get(wait_id) is WaitKind.UNKNOWN:
            unknown = sub.unknown_calls - {wait_id}
            if unknown or sub.waits:
                self.put(_replace(sub, unknown_calls=unknown))
            else:
                self.move(sub, S.READY, event, unknown_calls=unknown, open_calls=frozenset())
            return
        waits = sub.waits - {wait_id}
        if waits or sub.unknown_calls:
            self.put(_replace(sub, waits=waits))
        else:
            self.move(sub, S.READY, event, waits=waits)

    def on_retry_scheduled(self, event: SubmissionRetryScheduled, batch_epoch: int) -> None:
        """A charged attempt ended within the budget: the next starts at ``wake_at`` (issue 22 item 4).

        The submission is Ready (its attempt interrupted, or recovery resumed it); the `WaitRequested` of the same
        batch takes it to Waiting until the wake-up.
        """
        sub = self.get(event.submission_id, event, None)
        self.require(sub, frozenset({S.READY}), event, "a retry is scheduled for a Ready submission")
        self.require_attempt(sub, event.attempt_id, event)
        if event.retry != sub.retries + 1:
            raise self.fail(event, "retry", event.retry, f"expected {sub.retries + 1}")
        if sub.retry_wait_id is not None:
            raise self.fail(event, "wait_id", event.wait_id, f"retry wait {sub.retry_wait_id!r} is not requested yet")
        self.put(_replace(sub, retries=event.retry, retry_wait_id=event.wait_id))

    def on_approval_decided(self, event: ApprovalDecided, batch_epoch: int) -> None:
        """A verified approval decision accepted (issue 16 item 4); a repeated id only marks its input decided.

        The same batch resolves the wait with a `WaitResolved` naming the decision as its source.
        """
        self.decide(event, event.input_ref)
        if self.repeated_command(event):
            return
        sub = self.get(event.submission_id, event, None)
        self.require(sub, frozenset({S.WAITING}), event, "only a waiting run's approval is decided")
        if event.approval_id not in sub.waits:
            raise self.fail(event, "approval_id", event.approval_id, "no such approval is open")
        self.add_command(event.command_id, event.submission_id)

    def on_signal_received(self, event: SignalReceived, batch_epoch: int) -> None:
        """A signal accepted for an unsettled run (issue 16); a repeated signal id only marks its input decided."""
        self.decide(event, event.input_ref)
        if self.repeated_command(event):
            return
        sub = self.get(event.submission_id, event, None)
        if sub.terminal:
            raise IllegalTransitionError(
                sub.submission_id, sub.state, None, _name(event), "a settled run takes no signal (issue 16)"
            )
        self.add_command(event.command_id, event.submission_id)

    def on_steering_received(self, event: SteeringReceived, batch_epoch: int) -> None:
        """A steering message accepted for an unsettled run (issue 22 item 3); a repeated id only decides its input."""
        self.decide(event, event.input_ref)
        if self.repeated_command(event):
            return
        sub = self.get(event.submission_id, event, None)
        if sub.terminal:
            raise IllegalTransitionError(
                sub.submission_id, sub.state, None, _name(event), "a settled run takes no steering (issue 22)"
            )
        self.add_command(event.command_id, event.submission_id)

    def on_access_granted(self, event: AccessGranted, batch_epoch: int) -> None:
        """Access granted to a principal (issue 20): it replaces any earlier grant; a repeated command only decides."""
        self.decide(event, event.input_ref)
        if self._repeated_access(event):
            return
        self.set_access(event.grantee, event.access)
        self.add_command(event.command_id, event.grantee)

    def on_access_revoked(self, event: AccessRevoked, batch_epoch: int) -> None:
        """A principal's granted access ends (issue 20); a repeated command only marks its input decided."""
        self.decide(event, event.input_ref)
        if self._repeated_access(event):
            return
        self.set_access(event.grantee, None)
        self.add_command(event.command_id, event.grantee)

    def _repeated_access(self, event: AccessGranted | AccessRevoked) -> bool:
        previous_target = self.commands().get(event.command_id)
        if previous_target is None:
            return False
        if previous_target != event.grantee:
            raise self.fail(event, "grantee", event.grantee, f"command already applied to {previous_target!r}")
        return True

    def on_lane_set(self, event: LaneSet, batch_epoch: int) -> None:
        """The conversation's lane changed by a `SetLane` (issue 22 item 1); a repeated command only decides its input.

        Raises:
            LogInconsistencyError: The command id was applied to something else (another lane, a submission).
        """
        self.decide(event, event.input_ref)
        target = lane_command_target(event.lane)
        previous_target = self.commands().get(event.command_id)
        if previous_target is not None:
            if previous_target != target:
                raise self.fail(event, "lane", event.lane, f"command already applied to {previous_target!r}")
            return
        self.lane = event.lane
        self.add_command(event.command_id, target)

    def on_settlement(self, event: Settlement, batch_epoch: int) -> None:
        target = outcome_state(event.outcome)
        sub = self.get(event.submission_id, event, target)
        if sub.terminal:
            raise IllegalTransitionError(
                sub.submission_id,
                sub.state,
                target,
                _name(event),
                "the submission is already settled (DUR-002: exactly one terminal outcome)",
            )
        if sub.abort_requested and event.outcome is not SettlementOutcome.ABORTED:
            raise IllegalTransitionError(
                sub.submission_id,
                sub.state,
                target,
                _name(event),
                "an abort is recorded: only an aborted settlement is authorized (DUR-012, §13)",
            )
        if sub.reserved_outcome is not None and event.outcome is not sub.reserved_outcome:
            raise IllegalTransitionError(
                sub.submission_id,
                sub.state,
                target,
                _name(event),
                f"outcome {sub.reserved_outcome.value} is reserved"
                " (docs/semantics.md §12: conflicting outcomes are rejected)",
            )
        if event.attempt_count != sub.attempt_count:
            raise self.fail(event, "attempt_count", event.attempt_count, f"the submission made {sub.attempt_count}")
        if event.joined_to != sub.joined_to:
            raise self.fail(event, "joined_to", event.joined_to, f"the submission's host is {sub.joined_to!r}")
        if sub.joined_to is not None:
            self.require_host_settled(sub, sub.joined_to, event)
        if sub.state is not S.TERMINALIZING and sub.state is not S.JOINED:
            # Reserve and append are one transaction here (issue 5 item 5): pass through Terminalizing.
            sub = self.move(sub, S.TERMINALIZING, event)
        # A dead letter keeps its payload until it is retried (settled.protocol.retry admits it again).
        dead_letter = event.outcome is SettlementOutcome.FAILED and event.error_type == RETRY_BUDGET_EXHAUSTED
        self.move(
            sub,
            target,
            event,
            outcome=event.outcome,
            error_type=event.error_type,
            input_json=sub.input_json if dead_letter else None,
            tools_offered=sub.tools_offered if dead_letter else (),
            open_calls=frozenset(),
            unknown_calls=frozenset(),
            reserved_outcome=None,
            waits=frozenset(),
        )
        self.queue = tuple(sid for sid in self.queue if sid != sub.submission_id)
        if sub.joined:
            self.settled_hosts = (*self.settled_hosts, sub.submission_id)
        if self.active == sub.submission_id:
            self.active = None  # the lane is released with the canonical settlement (docs/semantics.md §12 steps 3-4)

    def require_host_settled(self, sub: Submission, host_id: str, event: Settlement) -> None:
        """A joined submission settles only with its host: after it in its batch, with its outcome (issue 22 item 2)."""
        host = self.subs()[host_id]
        if host.outcome is not event.outcome or host_id not in self.settled_hosts:
            raise IllegalTransitionError(
                sub.submission_id,
                sub.state,
                outcome_state(event.outcome),
                _name(event),
                f"joined into run {host_id!r}, which is {host.state.value}: a joined submission settles only with "
                "its host, after it in the same batch, with its outcome (issue 22 item 2)",
            )


def _approval_digest_of(details_json: str | None) -> str | None:
    """Read an approval request's ``args_digest`` from its details (`settled.protocol.approval_details`)."""
    if details_json is None:
        return None
    details = json.loads(details_json)
    digest = details.get("args_digest") if isinstance(details, dict) else None
    return digest if isinstance(digest, str) else None


_Rule = Callable[[_ConvBuilder, Any, int], None]

_RULES: dict[type[AvroRecord], _Rule] = {
    SubmissionAdmitted: _ConvBuilder.on_admitted,
    SubmissionReady: _ConvBuilder.on_ready,
    SubmissionRejected: _ConvBuilder.on_rejected,
    SubmissionDuplicate: _ConvBuilder.on_duplicate,
    InputQuarantined: _ConvBuilder.on_quarantined,
    AbortRecorded: _ConvBuilder.on_abort,
    CommandRejected: _ConvBuilder.on_command_rejected,
    AttemptStarted: _ConvBuilder.on_attempt_started,
    AttemptInterrupted: _ConvBuilder.on_interrupted,
    InputApplied: _ConvBuilder.on_input_applied,
    ModelResponseDelta: _ConvBuilder.on_running_record,
    ModelResponseCompleted: _ConvBuilder.on_running_record,
    ModelResponseInterrupted: _ConvBuilder.on_running_record,
    ToolCallPrepared: _ConvBuilder.on_prepared,
    ToolCallSettled: _ConvBuilder.on_tool_settled,
    ToolCallRefused: _ConvBuilder.on_running_record,
    ToolCallUnknown: _ConvBuilder.on_tool_unknown,
    UnknownResolved: _ConvBuilder.on_unknown_resolved,
    StepRecorded: _ConvBuilder.on_running_record,
    EffectRecorded: _ConvBuilder.on_running_record,
    StepRetryScheduled: _ConvBuilder.on_running_record,
    SubmissionRetryScheduled: _ConvBuilder.on_retry_scheduled,  # a workflow retry (issue 17): its wait suspends the run
    Settlement: _ConvBuilder.on_settlement,
    RecoveryDecision: _ConvBuilder.on_recovery_decision,
    WaitRequested: _ConvBuilder.on_wait_requested,
    WaitResolved: _ConvBuilder.on_wait_resolved,
    SignalReceived: _ConvBuilder.on_signal_received,
    SteeringReceived: _ConvBuilder.on_steering_received,
    SteeringDelivered: _ConvBuilder.on_running_record,
    LaneSet: _ConvBuilder.on_lane_set,
    SubmissionsJoined: _ConvBuilder.on_joined,
    ApprovalDecided: _ConvBuilder.on_approval_decided,
    AccessGranted: _ConvBuilder.on_access_granted,
    AccessRevoked: _ConvBuilder.on_access_revoked,
}
"""Conversation-scoped rules; `Genesis` and `OwnershipClaimed` are partition-scoped (`_PartitionBuilder`)."""

PARTITION_EVENT_TYPES: tuple[type[AvroRecord], ...] = (Genesis, OwnershipClaimed)


class _PartitionBuilder:
    """Mutable working copy of a `PartitionState` across one or more batches."""

    __slots__ = ("_quarantined", "base", "claim_epoch", "claimed_by", "convs", "only", "partition_count", "trace")

    def __init__(self, base: PartitionState, only: str | None = None) -> None:
        self.base = base
        self.only = only  # `apply_conversation`: the one conversation folded (the base's others are not read)
        self.trace: list[Transition] = []
        self.convs: dict[str, _ConvBuilder] = {}
        self.claim_epoch = base.claim_epoch
        self.claimed_by = base.claimed_by
        self.partition_count = base.partition_count
        self._quarantined: set[InputKey] | None = None

    def conv(self, conversation_id: str) -> _ConvBuilder:
        found = self.convs.get(conversation_id)
        if found is None:
            base = None if self.only is not None else self.base.conversations.get(conversation_id)
            if base is None:
                base = ConversationState(conversation_id=conversation_id, owner_epoch=self.claim_epoch)
            found = self.convs[conversation_id] = _ConvBuilder(base, self.trace)
        return found

    def batch(self, batch: BatchLike) -> None:
        cid = batch.conversation_id
        epoch = batch.owner_epoch
        if epoch < self.claim_epoch:
            raise StaleEpochError(cid, epoch, self.claim_epoch, "the batch was appended under a superseded owner")
        events = tuple(batch.events)
        if not events:
            raise ChainBreakError(
                None,
                "empty_batch",
                f"a batch of conversation {cid!r} holds no event",
                conversation_id=cid,
                field="events",
            )
        conv = self.conv(cid)
        conv.settled_hosts = ()
        if batch.first_event_seq != conv.last_event_seq + 1:
            raise ChainBreakError(
                None,
                "seq_gap",
                f"a batch of conversation {cid!r} starts at event {batch.first_event_seq}, "
                f"expected {conv.last_event_seq + 1}",
                conversation_id=cid,
                field="first_event_seq",
            )
        if batch.prev_batch_digest != conv.last_batch_digest:
            raise ChainBreakError(
                None,
                "prev_digest_mismatch",
                f"a batch of conversation {cid!r} follows {batch.prev_batch_digest}, "
                f"the previous batch is {conv.last_batch_digest}",
                conversation_id=cid,
                field="prev_batch_digest",
            )
        rules = _RULES
        for event in events:
            kind = type(event)
            rule = rules.get(kind)
            if rule is not None:
                rule(conv, event, epoch)
                if kind is InputQuarantined and event.input_ref is not None:  # type: ignore[union-attr]
                    if self._quarantined is None:
                        self._quarantined = set(self.base.quarantined_inputs)
                    self._quarantined.add(input_key(event.input_ref))  # type: ignore[union-attr]
            elif isinstance(event, OwnershipClaimed):
                self.claim(cid, epoch, event)
            elif isinstance(event, Genesis):
                self.genesis(cid, event)
            else:  # pragma: no cover - _RULES covers LOG_EVENT_TYPES, a unit test checks it
                raise LogInconsistencyError(cid, _name(event), "type", _name(event), "not a settled log event")
        if epoch != self.claim_epoch:
            raise StaleEpochError(
                cid, epoch, self.claim_epoch, "the batch's epoch was never claimed (docs/design.md §3 claim order)"
            )
        conv.last_event_seq = batch.first_event_seq + len(events) - 1
        conv.last_batch_digest = batch.batch_digest

    def claim(self, cid: str, batch_epoch: int, event: OwnershipClaimed) -> None:
        if self.only is not None:
            raise ValueError("a batch with an ownership claim changes every conversation: fold it with apply_traced")
        if event.partition != self.base.partition:
            raise LogInconsistencyError(
                cid, _name(event), "partition", event.partition, f"this is {self.base.partition}"
            )
        if event.owner_epoch <= self.claim_epoch:
            raise StaleEpochError(cid, event.owner_epoch, self.claim_epoch, "a claim must raise the owner epoch")
        if event.owner_epoch != batch_epoch:
            raise StaleEpochError(cid, batch_epoch, self.claim_epoch, f"the claim inside is epoch {event.owner_epoch}")
        self.claim_epoch = event.owner_epoch
        self.claimed_by = event.worker_id
        for conversation_id in dict.fromkeys((*self.base.conversations, *self.convs)):
            self.conv(conversation_id).on_claim(event)

    def genesis(self, cid: str, event: Genesis) -> None:
        if self.partition_count is not None and self.partition_count != event.partition_count:
            raise LogInconsistencyError(
                cid,
                _name(event),
                "partition_count",
                event.partition_count,
                f"genesis already fixed {self.partition_count} partitions (docs/design.md §2)",
            )
        self.partition_count = event.partition_count

    def freeze_head(self) -> PartitionState:
        """The partition-level fields after the batches, with the base's conversations (not updated)."""
        return PartitionState(
            partition=self.base.partition,
            conversations=self.base.conversations,
            claim_epoch=self.claim_epoch,
            claimed_by=self.claimed_by,
            partition_count=self.partition_count,
            quarantined_inputs=(
                self.base.quarantined_inputs if self._quarantined is None else frozenset(self._quarantined)
            ),
        )

    def freeze(self) -> PartitionState:
        conversations: Mapping[str, ConversationState] = self.base.conversations
        if self.convs:
            conversations = _with_changed(conversations, {cid: b.freeze() for cid, b in self.convs.items()})
        return PartitionState(
            partition=self.base.partition,
            conversations=conversations,
            claim_epoch=self.claim_epoch,
            claimed_by=self.claimed_by,
            partition_count=self.partition_count,
            quarantined_inputs=(
                self.base.quarantined_inputs if self._quarantined is None else frozenset(self._quarantined)
            ),
        )


# ---------------------------------------------------------------------------------------------------- the fold


def apply_traced(state: PartitionState, batch: BatchLike) -> tuple[PartitionState, tuple[Transition, ...]]:
    """Fold one canonical batch and return the new state with the transitions it made.

    Args:
        state: The partition's state before the batch (unchanged).
        batch: The batch (`settled.schemas.LogBatch` or alike), of one conversation of this partition.

    Returns:
        The new state and the edges taken, in event order.

    Raises:
        StaleEpochError: If the batch's owner epoch is below the latest preceding claim, a claim does not raise the
            epoch, or the batch's epoch was never claimed (docs/design.md §3).
        ChainBreakError: If the batch does not continue its conversation's event sequence and digest chain.
        IllegalTransitionError: If an event's transition is not an edge of the table, or the event is not permitted in
            its submission's state (docs/semantics.md §3).
        LogInconsistencyError: If an event contradicts the state otherwise (an input decided twice, a key admitted
            twice, a sequence gap; docs/design.md §3, §4).
    """
    builder = _PartitionBuilder(state)
    builder.batch(batch)
    return builder.freeze(), tuple(builder.trace)


def apply_conversation(
    head: PartitionState, conversation: ConversationState | None, batch: BatchLike
) -> tuple[PartitionState, ConversationState, tuple[Transition, ...]]:
    """Fold one batch that changes only its own conversation (no `OwnershipClaimed`), given that conversation alone.

    The result equals `apply_traced` of a state holding the partition-level fields of ``head`` and only this
    conversation, without building that state: what the projection calls per batch, keeping the conversations apart.

    Args:
        head: The partition's state before the batch; only its partition-level fields are read (claim epoch, claimed
            by, partition count, quarantined inputs), never its conversations.
        conversation: The batch's conversation before it, or None when the partition has none yet.
        batch: The batch.

    Returns:
        The partition-level state after the batch (``head`` itself when the batch changed none of its fields; its
        conversations are those of ``head``, not updated), the conversation after it, and the transitions.

    Raises:
        ValueError: The batch holds an `OwnershipClaimed` (it changes every conversation: use `apply_traced`).
        StaleEpochError: See `apply_traced`.
        ChainBreakError: See `apply_traced`.
        IllegalTransitionError: See `apply_traced`.
        LogInconsistencyError: See `apply_traced`.
    """
    cid = batch.conversation_id
    builder = _PartitionBuilder(head, only=cid)
    if conversation is not None:
        if conversation.conversation_id != cid:
            raise ValueError(f"conversation {conversation.conversation_id!r} is not the batch's {cid!r}")
        builder.convs[cid] = _ConvBuilder(conversation, builder.trace)
    builder.batch(batch)
    after = builder.convs[cid].freeze()
    if (
        builder.claim_epoch == head.claim_epoch
        and builder.claimed_by == head.claimed_by
        and builder.partition_count == head.partition_count
        and builder._quarantined is None
    ):
        return head, after, tuple(builder.trace)
    return builder.freeze_head(), after, tuple(builder.trace)


def apply(state: PartitionState, batch: BatchLike) -> PartitionState:
    """Fold one canonical batch (see `apply_traced`).

    Args:
        state: The partition's state before the batch (unchanged).
        batch: The batch.

    Returns:
        The new state.

    Raises:
        StaleEpochError: See `apply_traced`.
        ChainBreakError: See `apply_traced`.
        IllegalTransitionError: See `apply_traced`.
        LogInconsistencyError: See `apply_traced`.
    """
    return apply_traced(state, batch)[0]


def fold(state: PartitionState, batches: Iterable[BatchLike]) -> PartitionState:
    """Fold a run of batches in log order, copying each map once (the worker's restore; docs/design.md §3 step 4).

    The result equals applying the batches one by one with `apply`.

    Args:
        state: The state to start from (``PartitionState(partition=p)`` for a restore from offset 0).
        batches: The partition's batches in offset order.

    Returns:
        The folded state.

    Raises:
        StaleEpochError: See `apply_traced`.
        ChainBreakError: See `apply_traced`.
        IllegalTransitionError: See `apply_traced`.
        LogInconsistencyError: See `apply_traced`.
    """
    builder = _PartitionBuilder(state)
    for batch in batches:
        builder.batch(batch)
        builder.trace.clear()
    return builder.freeze()
