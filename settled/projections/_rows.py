"""The ledger projection as a pure function of the log: fold a batch, emit the rows it changes (docs/design.md §6).

`project_batch` folds one canonical batch with the protocol's own fold (`settled.protocol.apply_traced`) and emits,
into a `RowSet`, the rows of every conversation, submission, attempt, tool call, settlement, receipt and transcript
entry the batch touched. Rows are derived from the folded state and the batch alone (times are the batch's
``recorded_at``), so the live projector, a rebuild from offset 0 and the in-memory reference over the whole log give
the same rows, however the log was cut into chunks (the merge rules of `settled.projections.TABLES` are
associative). No I/O, no clock, no randomness here.

`ProjectionState` is the fold's `PartitionState` (kept in parts, so a batch costs O(its conversation)) plus the rows
of the tool calls still in flight (prepared or Unknown), which later events of the same call update. A chunk is
projected into a `ProjectionState.working` copy, committed (`ProjectionState.commit`) only when its transaction is.

`fold_reference` maps a `PartitionState` folded by `settled.protocol.fold` straight to the fold-derived columns of
``partitions``, ``conversations`` and ``submissions``: the independent reference `settled projections check` compares
the live and rebuilt tables with.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from types import MappingProxyType
from typing import Any

from settled._errors import ErrorCategory, SettledError
from settled.projections._tables import (
    APPROVALS,
    ATTEMPTS,
    CONVERSATION_ACCESS,
    CONVERSATIONS,
    MODEL_USAGE,
    PARTITIONS,
    RECEIPTS,
    SETTLEMENTS,
    SUBMISSIONS,
    TABLES,
    TOOL_CALLS,
    TRANSCRIPT,
    TableMode,
    TableSpec,
    merge_rows,
)
from settled.protocol import (
    TERMINAL_STATES,
    WAITING_STATES,
    ConversationState,
    PartitionState,
    Submission,
    SubmissionState,
    Transition,
    apply_conversation,
    apply_traced,
)
from settled.schemas import (
    LOG_EVENT_TYPES,
    AbortRecorded,
    AccessGranted,
    AccessRevoked,
    ApprovalDecided,
    AttemptStarted,
    CommandRejected,
    Genesis,
    LaneSet,
    LogBatch,
    ModelResponseCompleted,
    ModelResponseDelta,
    ModelResponseInterrupted,
    OwnershipClaimed,
    Settlement,
    SettlementOutcome,
    SignalReceived,
    SteeringReceived,
    StepRecorded,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionRejected,
    SubmissionsJoined,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    ToolCallUnknown,
    UnknownResolved,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
    canonical_json,
)

__all__ = [
    "FOLD_COLUMNS",
    "PARTITION_GROUP",
    "DuplicateRowError",
    "ProjectionState",
    "RowSet",
    "fold_reference",
    "is_partition_conversation",
    "project_batch",
    "project_chunk",
    "row_group",
]

S = SubmissionState
_UPSERT, _APPEND = TableMode.UPSERT, TableMode.APPEND
Row = tuple[Any, ...]
CallKey = tuple[str, str, str]
"""A tool call: (conversation id, submission id, call id)."""
SubKey = tuple[str, str]
"""A submission or an attempt within its conversation: (conversation id, submission or attempt id)."""
OpenWait = tuple[WaitRequested, datetime]
"""A wait still open: its request and the ``recorded_at`` of the batch that made it canonical (when it began)."""

_PARTITION_PREFIX = "~partition/"


@dataclass(frozen=True, slots=True)
class _Waiting:
    """One open wait of a suspended run as the projection shows it (`_BatchProjector.open_waits`)."""

    kind: WaitKind
    ordinal: int  # -1 for a wait of kind unknown (a call in doubt): those sort by name
    name: str | None
    since: datetime
    deadline: datetime | None


# Attempt status while its submission is in each state (the attempt being the submission's current one).
_ATTEMPT_STATUS: Mapping[SubmissionState, str] = MappingProxyType(
    {
        S.RUNNING: "running",
        S.RECOVERY: "recovery",
        **dict.fromkeys(WAITING_STATES, "waiting"),  # the generic wait under both its labels (unknown, waiting)
        S.READY: "interrupted",
        S.TERMINALIZING: "terminalizing",
        S.COMPLETED: "completed",
        S.FAILED: "failed",
        S.ABORTED: "aborted",
    }
)

FOLD_COLUMNS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "partitions": ("partition_count", "claim_epoch", "claimed_by"),
        "conversations": (
            "partition",
            "active_submission_id",
            "queue_depth",
            "unknown_count",
            "blocked_by_unknown",
            "last_submission_seq",
            "last_event_seq",
            "owner_epoch",
        ),
        "submissions": (
            "conversation_id",
            "partition",
            "submission_seq",
            "principal",
            "idempotency_key",
            "payload_digest",
            "state",
            "outcome",
            "attempt_count",
            "current_attempt_id",
            "input_applied",
            "abort_requested",
            "abort_reason",
            "reserved_outcome",
            "open_calls",
            "unknown_calls",
        ),
    }
)
"""The columns `fold_reference` derives straight from a folded `PartitionState`, per table."""


def is_partition_conversation(conversation_id: str) -> bool:
    """Tell whether a conversation id is a partition's own pseudo-conversation (genesis, ownership claims).

    Args:
        conversation_id: A batch's conversation id.

    Returns:
        True for ``~partition/<p>`` (`settled.producers.genesis_conversation`); those have no conversation row.
    """
    return conversation_id.startswith(_PARTITION_PREFIX)


class DuplicateRowError(SettledError, ValueError):
    """An append-only row (transcript entry, settlement) arrived twice: a batch was applied twice (DUR-015).

    Attributes:
        table: The table.
        key: The repeated key.
    """

    category = ErrorCategory.BROKEN_INVARIANT

    def __init__(self, table: str, key: tuple[Any, ...]) -> None:
        super().__init__(f"table {table}: a row with key {key!r} was already emitted (a batch applied twice)")
        self.table = table
        self.key = key


@dataclass
class RowSet:
    """Rows emitted by one or more batches, merged per key exactly as the database merges them.

    Attributes:
        tables: Table name → key → row.
        batches: Batches projected into it.
        events: Events in those batches.
        clock: A clock (e.g. ``time.perf_counter``) to time the protocol fold with; None: not timed.
        fold_s: Time spent in the protocol fold (`settled.protocol.apply_traced`) by `clock`, for benchmarks.
        deferred: Build the ``conversations`` and ``submissions`` rows once per key in `finish` instead of once per
            batch (a bulk replay: only the merged rows are written). Their merged row is a function of the last
            row emitted for the key and, for the `MergeRule.STICKY` columns, of the first row with a value, so only
            those emissions are kept (`defer_conversation`, `defer_submission`); `finish` builds exactly the row the
            per-batch merge gives. Call `finish` before reading `tables`. So are the ``attempts`` rows a batch
            emits for an attempt that stays in its state (`defer_attempt`): merged into the table when another row
            of the attempt comes (`add_attempt`) or in `finish`.
        streamed: An append-only table (`TableMode.APPEND`) whose new rows are also collected in ``fresh``, for a
            caller that writes them while the replay goes on (the bulk replay's ``COPY``); None: none is.
        fresh: The rows added to ``streamed`` since the caller last emptied this list, in the order added.
    """

    tables: dict[str, dict[tuple[Any, ...], Row]] = field(default_factory=lambda: {name: {} for name in TABLES})
    batches: int = 0
    events: int = 0
    clock: Callable[[], float] | None = None
    fold_s: float = 0.0
    deferred: bool = False
    streamed: TableSpec | None = None
    fresh: list[Row] = field(default_factory=list)
    _conv_last: dict[str, tuple[ConversationState, int, datetime, int]] = field(default_factory=dict, repr=False)
    _conv_first: dict[str, datetime] = field(default_factory=dict, repr=False)
    _sub_last: dict[SubKey, tuple[Submission, int, datetime, int]] = field(default_factory=dict, repr=False)
    _sub_first: dict[SubKey, tuple[Submission, datetime, int]] = field(default_factory=dict, repr=False)
    _sub_started: dict[SubKey, datetime] = field(default_factory=dict, repr=False)
    _sub_settled: dict[SubKey, datetime] = field(default_factory=dict, repr=False)
    _att_last: dict[SubKey, tuple[str, int, str, datetime, int]] = field(default_factory=dict, repr=False)
    _att_first: dict[SubKey, datetime] = field(default_factory=dict, repr=False)
    _att_ended: dict[SubKey, datetime] = field(default_factory=dict, repr=False)
    _att_step: dict[SubKey, str] = field(default_factory=dict, repr=False)

    def defer_conversation(self, conv: ConversationState, partition: int, t: datetime, offset: int) -> None:
        """Note a ``conversations`` row emitted by the batch at ``offset`` (``deferred`` sets; see `finish`).

        Args:
            conv: The conversation's folded state after the batch.
            partition: The log partition.
            t: The batch's ``recorded_at``.
            offset: The batch's offset.
        """
        cid = conv.conversation_id
        if cid not in self._conv_first:
            self._conv_first[cid] = t
        self._conv_last[cid] = (conv, partition, t, offset)

    def defer_submission(self, conversation_id: str, sub: Submission, partition: int, t: datetime, offset: int) -> None:
        """Note a ``submissions`` row emitted by the batch at ``offset`` (``deferred`` sets; see `finish`).

        Args:
            conversation_id: The submission's conversation.
            sub: Its folded state after the batch.
            partition: The log partition.
            t: The batch's ``recorded_at``.
            offset: The batch's offset.
        """
        key = (conversation_id, sub.submission_id)
        if key not in self._sub_first:
            self._sub_first[key] = (sub, t, offset)
        if sub.attempt_count > 0 and key not in self._sub_started:
            self._sub_started[key] = t
        if sub.state in TERMINAL_STATES and key not in self._sub_settled:
            self._sub_settled[key] = t
        self._sub_last[key] = (sub, partition, t, offset)

    def defer_attempt(
        self, attempt_id: str, sid: str, conversation_id: str, attempt: int, status: str, step: str | None,
        t: datetime, offset: int,
    ) -> None:  # fmt: skip
        """Note the ``attempts`` row of an attempt that stays in its state, emitted by the batch at ``offset``.

        The row is ``(attempt_id, sid, conversation_id, attempt, None, status, None, None, None, None, step, None, t,
        None if status == "running" else t, t, offset)`` (`_BatchProjector.attempt_row` of a status other than
        ``waiting``). Consecutive such rows of an attempt merge into one by the table's rules (each associative: the
        last value, the first non-null ``STICKY`` one, the last non-null ``LATEST`` one), so only the last row and
        the first ``started_at``, the first ``ended_at`` and the last ``current_step`` that have a value are kept;
        `add_attempt` and `finish` merge that one row into `tables`.

        Args:
            attempt_id: The attempt.
            sid: Its submission.
            conversation_id: Its conversation.
            attempt: Its attempt number.
            status: Its status (not ``waiting``).
            step: Its current step as of the batch's events, or None.
            t: The batch's ``recorded_at``.
            offset: The batch's offset.
        """
        key = (conversation_id, attempt_id)
        if key not in self._att_first:
            self._att_first[key] = t
        if status != "running" and key not in self._att_ended:
            self._att_ended[key] = t
        if step is not None:
            self._att_step[key] = step
        self._att_last[key] = (sid, attempt, status, t, offset)

    def add_attempt(self, row: Row) -> None:
        """Merge an ``attempts`` row, after the deferred rows of its attempt (`defer_attempt`).

        Args:
            row: The row, in the table's column order.
        """
        key = (row[2], row[0])  # (conversation_id, attempt_id)
        if key in self._att_last:
            self._flush_attempt(key)
        self.add(ATTEMPTS, row)

    def _flush_attempt(self, key: SubKey) -> None:
        sid, attempt, status, t, offset = self._att_last.pop(key)
        cid, attempt_id = key
        self.add(
            ATTEMPTS,
            (attempt_id, sid, cid, attempt, None, status, None, None, None, None, self._att_step.pop(key, None),
             None, self._att_first.pop(key), self._att_ended.pop(key, None), t, offset),
        )  # fmt: skip

    def finish(self) -> None:
        """Merge the deferred ``conversations``, ``submissions`` and ``attempts`` rows into `tables` (if any).

        Each is the row the per-batch merge gives: the last emitted row, with the `MergeRule.STICKY` columns taken
        from the first emission that had a value (``created_at``; ``tools_offered``, ``admitted_at``,
        ``admitted_offset``, ``first_started_at``, ``settled_at``) — the first emission's for those never null.
        """
        add = self.add
        conv_first = self._conv_first
        for cid, (conv, p, t, offset) in self._conv_last.items():
            row = _conversation_row(conv, p, t, offset)
            add(CONVERSATIONS, (*row[:9], conv_first[cid], *row[10:]))
        sub_first, started, settled = self._sub_first, self._sub_started, self._sub_settled
        for key, (sub, p, t, offset) in self._sub_last.items():
            cid = key[0]
            first, first_t, first_offset = sub_first[key]
            row = _submission_row(cid, sub, p, t, offset)
            add(
                SUBMISSIONS,
                (*row[:7], list(first.tools_offered), *row[8:19], first_t, first_offset, started.get(key),
                 settled.get(key), *row[23:]),
            )  # fmt: skip
        for pending in (self._conv_last, self._conv_first, self._sub_last, self._sub_first, started, settled):
            pending.clear()
        for attempt_key in list(self._att_last):
            self._flush_attempt(attempt_key)

    def add(self, spec: TableSpec, row: Row) -> None:
        """Merge one row into the set.

        Args:
            spec: Its table.
            row: The row, in the table's column order.

        Raises:
            DuplicateRowError: An append-only table already holds a row with this key.
        """
        rows = self.tables[spec.name]
        key = spec._key(row)  # spec.key_of without the method call (every row passes here)
        old = rows.get(key)
        if old is None:
            rows[key] = row
            if spec is self.streamed:
                self.fresh.append(row)
        elif spec.mode is _UPSERT:
            rows[key] = merge_rows(spec, old, row)
        elif spec.mode is _APPEND:
            raise DuplicateRowError(spec.name, key)
        # TableMode.FIRST: the first row stays (ON CONFLICT DO NOTHING).

    def rows(self, table: str) -> list[Row]:
        """Return a table's rows, ordered by key.

        Args:
            table: The table name.

        Returns:
            The rows.
        """
        return [row for _, row in sorted(self.tables[table].items(), key=lambda item: _sort_key(item[0]))]

    def __len__(self) -> int:
        """Return the number of rows held, all tables together."""
        return sum(len(rows) for rows in self.tables.values())

    def by_group(self) -> dict[str, RowSet]:
        """Split the rows by the conversation they belong to (`row_group`), e.g. a claim's rows per conversation.

        Returns:
            Group → a `RowSet` holding that group's rows (``batches`` and ``events`` are not split: zero).
        """
        out: dict[str, RowSet] = {}
        for name, rows in self.tables.items():
            at = _GROUP_COLUMN[name]
            for key, row in rows.items():
                group = PARTITION_GROUP if at is None else row_group(row[at])
                found = out.get(group)
                if found is None:
                    found = out[group] = RowSet()
                found.tables[name][key] = row
        return out


PARTITION_GROUP = "partition"
"""`row_group` of the ``partitions`` table's rows (they belong to no conversation)."""

_GROUP_COLUMN: Mapping[str, int | None] = MappingProxyType(
    {name: spec.columns.index("conversation_id") if "conversation_id" in spec.columns else None
     for name, spec in TABLES.items()}
)  # fmt: skip


def row_group(conversation_id: str) -> str:
    """Name a conversation's rows in the quarantine table: a digest, storable and bounded whatever the id is.

    Args:
        conversation_id: The conversation (it may hold characters PostgreSQL cannot store, e.g. NUL).

    Returns:
        ``c:`` and the first 32 hex digits of the SHA-256 of its UTF-8 bytes (lone surrogates passed through).
    """
    return "c:" + hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, v) for v in key)


_NO_CONVERSATIONS: Mapping[str, ConversationState] = MappingProxyType({})


_NO_CALLS: Mapping[str, Row] = MappingProxyType({})
_NO_WAITS: Mapping[str, OpenWait] = MappingProxyType({})


def _conversation_row(conv: ConversationState, p: int, t: datetime, offset: int) -> Row:
    """A ``conversations`` row of a conversation's folded state, emitted by the batch at ``offset``."""
    subs = conv.submissions
    unknown = sum(1 for sid in conv.queue if subs[sid].state is S.UNKNOWN)
    return (
        conv.conversation_id,
        p,
        conv.active_submission_id,
        len(conv.queue),
        unknown,
        unknown > 0,
        conv.last_submission_seq,
        conv.last_event_seq,
        conv.owner_epoch,
        t,
        t,
        offset,
    )


def _submission_row(conversation_id: str, sub: Submission, p: int, t: datetime, offset: int) -> Row:
    """A ``submissions`` row of a submission's folded state, emitted by the batch at ``offset``."""
    outcome, reserved = sub.outcome, sub.reserved_outcome
    return (
        sub.submission_id,
        conversation_id,
        p,
        sub.submission_seq,
        sub.principal,
        sub.idempotency_key,
        sub.payload_digest,
        list(sub.tools_offered),
        sub.state.value,
        None if outcome is None else outcome.value,
        "admitted",
        sub.attempt_count,
        sub.attempt_id,
        sub.input_applied,
        bool(sub.abort_command_ids),
        sub.abort_reason,
        None if reserved is None else reserved.value,
        len(sub.open_calls),
        len(sub.unknown_calls),
        t,
        offset,
        t if sub.attempt_count > 0 else None,
        t if sub.state in TERMINAL_STATES else None,
        t,
        offset,
        sub.retry_of,
    )


@dataclass(frozen=True, slots=True)
class ProjectionState:
    """What the projection of one log partition holds between batches.

    The fold's `PartitionState` is kept in parts so that one batch costs O(its conversation), not O(the partition's
    conversations): ``head`` holds the partition-level fields, ``base`` the committed conversations (one dict shared
    by every state of the partition, changed only by `commit`), ``overlay`` the conversations changed since. The
    tool calls in flight are kept alike, per submission: ``calls`` committed, ``calls_overlay`` changed since.
    `project_batch` writes into the overlays; a chunk whose transaction rolls back is dropped by dropping its
    `working` copy, the committed state stays as it was.

    Attributes:
        partition: The log partition.
        head: The folded partition-level fields (claim epoch, claimed by, partition count, quarantined inputs);
            its ``conversations`` are not read (the last batch's, or none).
        base: The committed conversations, by id.
        overlay: Conversations changed by this working copy, by id.
        calls: Submission id → call id → the ``tool_calls`` row of each call still prepared or Unknown (committed).
        calls_overlay: The submissions whose calls in flight this working copy changed: their calls (none left:
            an empty mapping). The per-submission mappings are never changed in place, only replaced.
        waits: Submission → wait id → each wait still open (issue 16: its request and when it began), committed;
            the ``attempts`` row's waiting columns and the ``approvals`` rows are derived from them.
        waits_overlay: The submissions whose open waits this working copy changed, as ``calls_overlay``.
    """

    partition: int
    head: PartitionState
    base: dict[str, ConversationState]
    overlay: dict[str, ConversationState] = field(default_factory=dict)
    calls: dict[SubKey, Mapping[str, Row]] = field(default_factory=dict)
    calls_overlay: dict[SubKey, Mapping[str, Row]] = field(default_factory=dict)
    waits: dict[SubKey, Mapping[str, OpenWait]] = field(default_factory=dict)
    waits_overlay: dict[SubKey, Mapping[str, OpenWait]] = field(default_factory=dict)

    @classmethod
    def empty(cls, partition: int) -> ProjectionState:
        """Return the state before the partition's first record.

        Args:
            partition: The log partition.

        Returns:
            An empty, committed state.
        """
        return cls(partition=partition, head=PartitionState(partition=partition), base={})

    @classmethod
    def from_fold(cls, state: PartitionState) -> ProjectionState:
        """Return the projection state of a folded partition (no tool call in flight known).

        Args:
            state: A partition folded by `settled.protocol.fold`.

        Returns:
            A committed state.
        """
        head = dataclasses.replace(state, conversations=_NO_CONVERSATIONS)
        return cls(partition=state.partition, head=head, base=dict(state.conversations))

    def conversation(self, conversation_id: str) -> ConversationState | None:
        """Return a conversation's folded state.

        Args:
            conversation_id: The conversation.

        Returns:
            Its state, or None when the partition has none.
        """
        found = self.overlay.get(conversation_id)
        return found if found is not None else self.base.get(conversation_id)

    def calls_of(self, conversation_id: str, submission_id: str) -> Mapping[str, Row]:
        """Return a submission's calls in flight.

        Args:
            conversation_id: Its conversation.
            submission_id: The submission.

        Returns:
            Call id → its ``tool_calls`` row (prepared or Unknown).
        """
        key = (conversation_id, submission_id)
        found = self.calls_overlay.get(key)
        if found is not None:
            return found
        return self.calls.get(key, _NO_CALLS)

    def waits_of(self, conversation_id: str, submission_id: str) -> Mapping[str, OpenWait]:
        """Return a submission's open waits.

        Args:
            conversation_id: Its conversation.
            submission_id: The submission.

        Returns:
            Wait id → its request and when it began.
        """
        key = (conversation_id, submission_id)
        found = self.waits_overlay.get(key)
        if found is not None:
            return found
        return self.waits.get(key, _NO_WAITS)

    def in_flight(self) -> dict[CallKey, Row]:
        """Return every call in flight, by ``(conversation id, submission id, call id)`` (for tests and diagnostics).

        Returns:
            The rows.
        """
        merged = {**self.calls, **self.calls_overlay}
        return {(*key, call_id): row for key, calls in merged.items() for call_id, row in calls.items()}

    @property
    def fold(self) -> PartitionState:
        """The whole folded `PartitionState` (costs a copy of the conversation map)."""
        return dataclasses.replace(self.head, conversations=MappingProxyType({**self.base, **self.overlay}))

    def working(self) -> ProjectionState:
        """Return a working copy: `project_batch` on it leaves this state untouched until `commit`."""
        return ProjectionState(
            self.partition, self.head, self.base, dict(self.overlay), self.calls, dict(self.calls_overlay),
            self.waits, dict(self.waits_overlay),
        )  # fmt: skip

    def commit(self) -> ProjectionState:
        """Make this working copy the partition's committed state (its overlays join the shared bases).

        Returns:
            The committed state (empty overlays). Earlier states of the partition must not be used after this.
        """
        self.base.update(self.overlay)
        for key, calls in self.calls_overlay.items():
            if calls:
                self.calls[key] = calls
            else:
                self.calls.pop(key, None)
        for key, waits in self.waits_overlay.items():
            if waits:
                self.waits[key] = waits
            else:
                self.waits.pop(key, None)
        return ProjectionState(self.partition, self.head, self.base, {}, self.calls, {}, self.waits, {})


def _ms(later: datetime, earlier: datetime | None) -> int | None:
    if earlier is None:
        return None
    return round((later - earlier).total_seconds() * 1000)


def _value(enum_value: Any) -> Any:
    return None if enum_value is None else enum_value.value


def _fields_of(name: str) -> frozenset[type[Any]]:
    """The log event types with a field ``name``."""
    return frozenset(cls for cls in LOG_EVENT_TYPES if name in cls.model_fields)


_HAS_SUBMISSION_ID = _fields_of("submission_id")
_HAS_REASON = _fields_of("reason")
_CALL_I = {column: i for i, column in enumerate(TOOL_CALLS.columns)}
_STEPS: Mapping[type[Any], Callable[[Any], tuple[str, str]]] = MappingProxyType(
    {
        StepRecorded: lambda e: (e.attempt_id, f"step:{e.name}"),
        ToolCallPrepared: lambda e: (e.attempt_id, f"tool:{e.tool}"),
        ModelResponseCompleted: lambda e: (e.attempt_id, f"model_response:{e.response_ordinal}"),
    }
)
"""The event types that are an attempt's current step: attempt id and step, per type."""
_CALL_TOOL_I = _CALL_I["tool"]
_CALL_STATUS_I = _CALL_I["status"]
_CALL_PREPARED_I = _CALL_I["prepared_at"]
_CALL_UPDATED_I = _CALL_I["updated_at"]
_CALL_OFFSET_I = _CALL_I["last_offset"]
_CALL_RESULT_DIGEST_I = _CALL_I["result_digest"]
_CALL_ERROR_TYPE_I = _CALL_I["error_type"]
_CALL_ERROR_MESSAGE_I = _CALL_I["error_message"]
_CALL_ENDED_I = _CALL_I["ended_at"]
_CALL_DURATION_I = _CALL_I["duration_ms"]
_PREPARED_COLUMNS = tuple(
    "submission_id call_id conversation_id attempt_id run_id ordinal tool args_digest idempotency_key owner_epoch "
    "status result_digest error_type error_message reason resolution_kind resolution_outcome prepared_at ended_at "
    "unknown_since duration_ms updated_at last_offset".split()
)
"""The ``tool_calls`` columns in the order `_BatchProjector.on_prepared` builds its row (a test: `TOOL_CALLS`'s)."""
_NO_COMMANDS: Mapping[str, str] = MappingProxyType({})
_NO_STEPS: Mapping[str, str] = MappingProxyType({})


class _BatchProjector:
    """Derives one batch's rows; holds the batch's working copies."""

    __slots__ = (
        "add", "after_convs", "applied_before", "applied_here", "batch", "before_convs", "cid", "claimed", "conv",
        "genesis", "handled", "head", "offset", "own", "p", "rows", "state", "steps", "t", "touched", "trace",
    )  # fmt: skip

    head: PartitionState
    before_convs: Mapping[str, ConversationState]
    after_convs: Mapping[str, ConversationState]
    trace: tuple[Transition, ...]
    claimed: bool
    genesis: bool
    own: dict[str, None]
    steps: dict[str, str]
    handled: list[tuple[int, Any, Callable[[_BatchProjector, int, Any], None]]]
    touched: dict[str, dict[str, None]]
    conv: ConversationState | None
    applied_before: Mapping[str, str]
    applied_here: set[str]

    def __init__(self, state: ProjectionState, batch: LogBatch, offset: int, rows: RowSet) -> None:
        # The other slots are set by `fold` (before_convs, after_convs, head, trace, claimed, genesis, own, steps,
        # handled), `emit` (touched) and before the event handlers run (conv, applied_before, applied_here).
        self.state = state
        self.batch = batch
        self.offset = offset
        self.rows = rows
        self.add = rows.add
        self.p = state.partition
        self.t = batch.recorded_at
        self.cid = batch.conversation_id

    # -- tool calls in flight ------------------------------------------------------------------------------------

    def call(self, key: CallKey) -> Row | None:
        return self.state.calls_of(key[0], key[1]).get(key[2])

    def set_call(self, key: CallKey, row: Row | None) -> None:
        """Put (or, with None, drop) a call in flight: its submission's calls are replaced, never changed in place."""
        cid, sid, call_id = key
        calls = dict(self.state.calls_of(cid, sid))
        if row is None:
            del calls[call_id]
        else:
            calls[call_id] = row
        self.state.calls_overlay[(cid, sid)] = calls

    def set_wait(self, key: SubKey, wait_id: str, wait: OpenWait | None) -> None:
        """Open (or, with None, close) a wait: its submission's waits are replaced, never changed in place."""
        waits = dict(self.state.waits_of(*key))
        if wait is None:
            del waits[wait_id]
        else:
            waits[wait_id] = wait
        self.state.waits_overlay[key] = waits

    def call_row(self, spec_values: dict[str, Any]) -> Row:
        return tuple(map(spec_values.get, TOOL_CALLS.columns))

    def update_call(self, key: CallKey, **changes: Any) -> Row:
        old = self.call(key)
        if old is None:
            raise ValueError(f"tool call {key!r} is not in flight in partition {self.p} at offset {self.offset}")
        row = list(old)
        for column, value in changes.items():
            row[_CALL_I[column]] = value
        row[_CALL_UPDATED_I] = self.t
        row[_CALL_OFFSET_I] = self.offset
        return tuple(row)

    # -- the batch -----------------------------------------------------------------------------------------------

    def run(self) -> ProjectionState:
        clock = self.rows.clock
        if clock is None:
            self.fold()
        else:
            started = clock()
            self.fold()
            self.rows.fold_s += clock() - started
        self.emit()
        self.keep_fold()
        return self.state_after()

    def fold(self) -> None:
        """Fold the batch (the protocol's fold) and note what its rows need (`emit`; `keep_fold` keeps the fold)."""
        events = self.batch.events
        # One pass over the events before the fold: what the rows need of each (kept in event order).
        claimed = genesis = False
        own: dict[str, None] = {}
        steps: dict[str, str] = {}
        handled: list[tuple[int, Any, Callable[[_BatchProjector, int, Any], None]]] = []
        info = _EVENT_INFO
        delta = ModelResponseDelta
        for i, event in enumerate(events):
            kind = type(event)
            if kind is delta:  # the commonest event (streamed text): it names its submission, has no step and no rows
                own[event.submission_id] = None  # type: ignore[union-attr,index]  # a ModelResponseDelta: a str
                continue
            found = info.get(kind)
            if found is None:
                if kind is OwnershipClaimed:
                    claimed = True
                elif kind is Genesis:
                    genesis = True
                continue
            handler, has_sid, step = found
            if has_sid:
                sid = event.submission_id  # type: ignore[union-attr]  # a field of every type with has_sid
                if isinstance(sid, str):
                    own[sid] = None
            if step is not None:
                of_attempt, name = step(event)
                steps[of_attempt] = name
            if handler is not None:
                handled.append((i, event, handler))
        self.claimed, self.genesis, self.own, self.steps, self.handled = claimed, genesis, own, steps, handled
        state = self.state
        cid = self.cid
        if claimed:  # a claim changes every conversation of the partition (owner epoch, running → recovery)
            before = state.fold
            after, self.trace = apply_traced(before, self.batch)
            self.before_convs, self.after_convs, self.head = before.conversations, after.conversations, after
        else:  # anything else changes only its own conversation: fold it alone
            conv_before = state.conversation(cid)
            head, conv_after, self.trace = apply_conversation(state.head, conv_before, self.batch)
            self.head = head
            self.before_convs = _NO_CONVERSATIONS if conv_before is None else {cid: conv_before}
            self.after_convs = {cid: conv_after}

    def keep_fold(self) -> None:
        """Put the folded conversations into the state's overlay: the next batch of the partition folds from them."""
        self.state.overlay.update(self.after_convs)

    def state_after(self) -> ProjectionState:
        """The partition's state after the batch (after `keep_fold`)."""
        state, head = self.state, self.head
        if head is state.head:
            return state  # nothing else changed
        # The fold's partition-level state after the batch is the next head (its conversations are not read: they
        # are in the overlay, where `ProjectionState` reads them).
        return ProjectionState(
            self.p, head, state.base, state.overlay, state.calls, state.calls_overlay, state.waits,
            state.waits_overlay,
        )  # fmt: skip

    def emit(self) -> None:
        """Emit the batch's rows (after `fold`); the tool calls in flight change here."""
        rows = self.rows
        cid = self.cid
        before_convs, after_convs = self.before_convs, self.after_convs
        claimed = self.claimed
        rows.batches += 1
        rows.events += len(self.batch.events)
        if claimed or self.genesis:
            self.partition_row()
        if self.handled:
            conv_before = before_convs.get(cid)
            self.conv = after_convs.get(cid)
            self.applied_before = conv_before.applied_commands if conv_before is not None else _NO_COMMANDS
            self.applied_here = set()
            for i, event, handler in self.handled:
                handler(self, i, event)
        touched_convs: Iterable[str] = after_convs if claimed else (cid,)
        own = self.own
        # `touched_by`, inlined (every batch passes here): the batch's own submissions, then those its transitions moved
        touched_subs: dict[str, dict[str, None]] = {cid: own} if own else {}
        for tr in self.trace:
            found = touched_subs.get(tr.conversation_id)
            if found is None:
                touched_subs[tr.conversation_id] = {tr.submission_id: None}
            else:
                found[tr.submission_id] = None
        self.touched = touched_subs
        add = self.add
        deferred = rows.deferred
        p, t, offset = self.p, self.t, self.offset
        state = self.state
        calls_overlay, calls_base = state.calls_overlay, state.calls
        for conversation_id in touched_convs:
            if conversation_id.startswith(_PARTITION_PREFIX):  # is_partition_conversation, inlined
                continue
            conv = after_convs[conversation_id]
            old = before_convs.get(conversation_id)
            if old is conv:
                continue
            if deferred:
                rows.defer_conversation(conv, p, t, offset)
            else:
                add(CONVERSATIONS, self.conversation_row(conv))
            subs = conv.submissions
            old_subs = None if old is None else old.submissions
            for sid in touched_subs.get(conversation_id, ()):
                sub = subs.get(sid)
                if sub is None or (old_subs is not None and old_subs.get(sid) is sub):
                    continue
                if deferred:
                    rows.defer_submission(conversation_id, sub, p, t, offset)
                else:
                    add(SUBMISSIONS, self.submission_row(conversation_id, sub))
                # `abandon_calls` only when the submission has calls in flight (`ProjectionState.calls_of`, inlined)
                calls = calls_overlay.get((conversation_id, sid))
                if calls is None:
                    calls = calls_base.get((conversation_id, sid))
                if calls:
                    self.abandon_calls(conversation_id, sub)
                waits = state.waits_overlay.get((conversation_id, sid))
                if waits is None:
                    waits = state.waits.get((conversation_id, sid))
                if waits:
                    self.cancel_waits(conversation_id, sub)
        self.attempt_rows(self.steps)

    def touched_by(self, own: dict[str, None]) -> dict[str, dict[str, None]]:
        """Conversation → the submissions the batch's events name (``own``), then those its transitions moved."""
        if not self.trace:
            return {self.cid: own} if own else {}
        out: dict[str, dict[str, None]] = {self.cid: own} if own else {}
        for tr in self.trace:
            found = out.get(tr.conversation_id)
            if found is None:
                out[tr.conversation_id] = {tr.submission_id: None}
            else:
                found[tr.submission_id] = None
        return out

    # -- rows ------------------------------------------------------------------------------------------------------

    def partition_row(self) -> None:
        claimed_at = None
        for event in self.batch.events:
            if isinstance(event, OwnershipClaimed):
                claimed_at = event.claimed_at
        f = self.head
        self.add(PARTITIONS, (self.p, f.partition_count, f.claim_epoch, f.claimed_by, claimed_at, self.t, self.offset))

    def conversation_row(self, conv: ConversationState) -> Row:
        return _conversation_row(conv, self.p, self.t, self.offset)

    def submission_row(self, conversation_id: str, sub: Submission) -> Row:
        return _submission_row(conversation_id, sub, self.p, self.t, self.offset)

    def attempt_rows(self, steps: Mapping[str, str]) -> None:
        """Emit the attempt rows: every attempt the batch started, ended or changed (in transition order).

        Args:
            steps: Attempt id → its current step as of the batch's events (the last one of each attempt).
        """
        rows = self.rows
        deferred = rows.deferred
        add_attempt: Callable[[Row], None] = rows.add_attempt if deferred else partial(rows.add, ATTEMPTS)
        emitted: set[SubKey] = set()  # (conversation, attempt id)
        cid = self.cid
        if self.trace:
            current: dict[SubKey, str | None] = {}  # (conversation, submission id) -> its current attempt
            after_convs = self.after_convs
            for tr in self.trace:
                cause = tr.event
                sid = tr.submission_id
                key = (tr.conversation_id, sid)
                # The batch's events (and so its steps) are its own conversation's.
                own_steps = steps if tr.conversation_id == cid else _NO_STEPS
                if isinstance(cause, AttemptStarted):
                    started = cause
                    current[key] = started.attempt_id
                    add_attempt(
                        self.attempt_row(
                            tr.conversation_id,
                            sid,
                            started.attempt_id,
                            started.attempt,
                            started.owner_epoch,
                            "running",
                            None,
                            None,
                            own_steps.get(started.attempt_id),
                        ),
                    )
                    emitted.add((tr.conversation_id, started.attempt_id))
                    continue
                if key in current:
                    attempt_id = current[key]
                else:
                    conv = self.before_convs.get(tr.conversation_id)
                    old = conv.submissions.get(sid) if conv is not None else None
                    attempt_id = current[key] = old.attempt_id if old is not None else None
                if attempt_id is None:
                    continue
                end_reason = None
                if tr.edge.source is S.RUNNING:  # the attempt stops running: why
                    reason = cause.reason if type(cause) in _HAS_REASON else None  # type: ignore[attr-defined]
                    end_reason = tr.edge.label if not isinstance(reason, str) else f"{tr.edge.label}: {reason}"
                    if isinstance(cause, OwnershipClaimed):
                        end_reason = f"{tr.edge.label}: owner epoch {cause.owner_epoch} claimed by {cause.worker_id}"
                moved = after_convs[tr.conversation_id].submissions[sid]
                add_attempt(
                    self.attempt_row(
                        tr.conversation_id,
                        sid,
                        attempt_id,
                        moved.attempt_count,
                        None,
                        _ATTEMPT_STATUS[tr.edge.target],
                        end_reason,
                        moved,
                        own_steps.get(attempt_id),
                    ),
                )
                emitted.add((tr.conversation_id, attempt_id))
        # The final row of each touched submission's current attempt (in-state changes: steps, calls).
        conv = self.after_convs.get(self.cid)
        if conv is None:
            return
        subs = conv.submissions
        for sids in self.touched.values():
            for sid in sids:
                touched = subs.get(sid)
                if touched is None or touched.attempt_id is None or (cid, touched.attempt_id) in emitted:
                    continue
                status = _ATTEMPT_STATUS.get(touched.state)
                if status is None:
                    continue
                if deferred and status != "waiting":  # see RowSet.defer_attempt: the row this would add
                    rows.defer_attempt(
                        touched.attempt_id, sid, self.cid, touched.attempt_count, status,
                        steps.get(touched.attempt_id), self.t, self.offset,
                    )  # fmt: skip
                    continue
                add_attempt(
                    self.attempt_row(
                        self.cid,
                        sid,
                        touched.attempt_id,
                        touched.attempt_count,
                        None,
                        status,
                        None,
                        touched,
                        steps.get(touched.attempt_id),
                    ),
                )

    def attempt_row(
        self,
        conversation_id: str,
        sid: str,
        attempt_id: str,
        attempt: int,
        owner_epoch: int | None,
        status: str,
        end_reason: str | None,
        sub: Submission | None,
        step: str | None,
    ) -> Row:
        waiting_kind = waiting_name = waiting_since = waiting_deadline = None
        if status == "waiting" and sub is not None:
            waiting = self.open_waits(conversation_id, sub)
            if waiting:
                waiting_kind = ",".join(sorted({w.kind.value for w in waiting}))
                names = [w.name for w in waiting if w.name is not None]
                waiting_name = ",".join(names) if names else None
                waiting_since = min(w.since for w in waiting)
                deadlines = [w.deadline for w in waiting if w.deadline is not None]
                waiting_deadline = min(deadlines) if deadlines else None
        t = self.t
        return (
            attempt_id,
            sid,
            conversation_id,
            attempt,
            owner_epoch,
            status,
            waiting_kind,
            waiting_name,
            waiting_since,
            waiting_deadline,
            step,
            end_reason,
            t,
            None if status == "running" else t,
            t,
            self.offset,
        )

    def open_waits(self, conversation_id: str, sub: Submission) -> list[_Waiting]:
        """A suspended run's open waits of every kind, as its ``attempts`` row shows them (one mapping, issue 16).

        A wait of kind `unknown` (a call in doubt) is named by its tool and waits since this batch, with no deadline;
        a signal or approval wait by its request's name, since the batch that made the request canonical, until its
        deadline. Unknown calls come by tool name, other waits in callsite order.
        """
        sid = sub.submission_id
        calls = self.state.calls_of(conversation_id, sid)
        requests = self.state.waits_of(conversation_id, sid)
        kinds = sub.wait_kinds
        unknown: list[_Waiting] = []
        for wait_id, kind in kinds.items():
            if kind is WaitKind.UNKNOWN:
                row = calls.get(wait_id)
                unknown.append(_Waiting(kind, -1, None if row is None else str(row[_CALL_TOOL_I]), self.t, None))
        unknown.sort(key=lambda w: w.name or "")
        requested = [
            _Waiting(request.kind, request.ordinal, request.name, since, request.deadline)
            for wait_id, (request, since) in requests.items()
            if wait_id in kinds
        ]
        requested.sort(key=lambda w: w.ordinal)
        return unknown + requested

    def abandon_calls(self, conversation_id: str, sub: Submission) -> None:
        """Calls the fold no longer holds open or Unknown, with no event of their own: recovery dropped them."""
        sid = sub.submission_id
        calls = self.state.calls_of(conversation_id, sid)
        if not calls:
            return
        for call_id, row in list(calls.items()):
            status = row[_CALL_STATUS_I]
            if (status == "prepared" and call_id in sub.open_calls) or (
                status == "unknown" and call_id in sub.unknown_calls
            ):
                continue
            key = (conversation_id, sid, call_id)
            self.add(TOOL_CALLS, self.update_call(key, status="abandoned", ended_at=self.t))
            self.set_call(key, None)

    def cancel_waits(self, conversation_id: str, sub: Submission) -> None:
        """Waits the fold no longer holds open, with no `WaitResolved`: the run settled (an abort) while it waited."""
        sid = sub.submission_id
        for wait_id, (request, since) in list(self.state.waits_of(conversation_id, sid).items()):
            if wait_id in sub.waits:
                continue
            self.set_wait((conversation_id, sid), wait_id, None)
            if request.kind is WaitKind.APPROVAL:
                self.add(APPROVALS, self.approval_row(request, since, "cancelled"))

    def approval_row(
        self,
        request: WaitRequested,
        since: datetime,
        status: str,
        *,
        decided_at: datetime | None = None,
        payload: Mapping[str, Any] | None = None,
        reason: str | None = None,
        command_id: str | None = None,
    ) -> Row:
        """The ``approvals`` row of an approval request, as of the batch (``status`` and, once decided, how)."""
        details = json.loads(request.details_json) if request.details_json is not None else {}
        sid = request.submission_id
        call_prefix = f"{sid}#a"  # `settled.protocol.approval_id_for` of a tool call that needs approval
        call_id = request.wait_id[len(call_prefix) :] if request.wait_id.startswith(call_prefix) else None
        payload = payload or {}
        return (
            self.cid, request.wait_id, sid, request.attempt_id, request.ordinal, call_id, details.get("tool"),
            details.get("title") or request.name, details.get("description"), details.get("args_json"),
            details.get("args_digest"), status, since, request.deadline, decided_at, payload.get("by"),
            payload.get("principal"), reason if reason is not None else payload.get("reason"), command_id, self.t,
            self.offset,
        )  # fmt: skip

    # -- events ----------------------------------------------------------------------------------------------------

    def transcript(
        self,
        i: int,
        sid: str | None,
        attempt_id: str | None,
        kind: str,
        role: str,
        name: str | None,
        call_id: str | None,
        content: str | None,
    ) -> None:
        self.add(
            TRANSCRIPT,
            (self.cid, self.batch.first_event_seq + i, sid, attempt_id, kind, role, name, call_id, content, self.t,
             self.offset),
        )  # fmt: skip

    def first_application(self, command_id: str) -> bool:
        if command_id in self.applied_before or command_id in self.applied_here:
            return False
        self.applied_here.add(command_id)
        return True

    def receipt(
        self, request_id: str, kind: str, outcome: str, reason: str | None, sid: str | None, seq: int | None
    ) -> None:
        self.add(RECEIPTS, (request_id, kind, self.cid, outcome, reason, sid, seq, self.t, self.offset))

    def on_admitted(self, i: int, event: SubmissionAdmitted) -> None:
        self.receipt(event.submission_id, "submission", "admitted", None, event.submission_id, event.submission_seq)
        if event.retry_of is not None:
            # Admitted by a `RetrySubmission`: its receipt names the command (whose id is the new submission's
            # idempotency key), so ``after=<that receipt>`` must find the command's request too.
            self.receipt(
                event.idempotency_key, "command", "applied", "retry", event.submission_id, event.submission_seq
            )
        self.transcript(i, event.submission_id, None, "input", "user", None, None, event.input_json)
        if event.submission_seq == 1:  # its principal opened the conversation (settled.protocol.conversation_opener)
            self.access_row(event.principal, "opener", None, None)

    def access_row(self, principal: str, access: str, granted_by: str | None, command_id: str | None) -> None:
        self.add(
            CONVERSATION_ACCESS,
            (self.cid, principal, access, granted_by, command_id, self.t, self.t, self.offset),
        )

    def on_access_granted(self, i: int, event: AccessGranted) -> None:
        if self.first_application(event.command_id):  # a repeated command changes nothing (the fold's rule)
            self.access_row(event.grantee, event.access.value, event.principal, event.command_id)
        self.receipt(event.command_id, "command", "applied", "access", None, None)

    def on_access_revoked(self, i: int, event: AccessRevoked) -> None:
        if self.first_application(event.command_id):
            self.access_row(event.grantee, "revoked", event.principal, event.command_id)
        self.receipt(event.command_id, "command", "applied", "access", None, None)

    def on_lane_set(self, i: int, event: LaneSet) -> None:
        self.receipt(event.command_id, "command", "applied", "lane", None, None)

    def on_duplicate(self, i: int, event: SubmissionDuplicate) -> None:
        conv = self.conv
        original = conv.submissions.get(event.original_submission_id) if conv is not None else None
        self.receipt(
            event.submission_id,
            "submission",
            "duplicate",
            None,
            event.original_submission_id,
            None if original is None else original.submission_seq,
        )

    def on_rejected(self, i: int, event: SubmissionRejected) -> None:
        field_part = f" (field {event.field})" if event.field else ""
        self.receipt(
            event.submission_id, "submission", "rejected", f"{event.reason.value}{field_part}: {event.detail}", None,
            None,
        )  # fmt: skip

    def on_abort(self, i: int, event: AbortRecorded) -> None:
        if self.first_application(event.command_id):
            self.transcript(i, event.submission_id, None, "abort", "user", None, None, event.reason)
        self.receipt(event.command_id, "command", "applied", event.reason, event.submission_id, None)

    def on_signal_received(self, i: int, event: SignalReceived) -> None:
        if self.first_application(event.command_id):
            self.transcript(
                i, event.submission_id, None, "signal", "user", event.name, event.command_id, event.payload_json
            )
        self.receipt(event.command_id, "command", "applied", "signal", event.submission_id, None)

    def on_approval_decided(self, i: int, event: ApprovalDecided) -> None:
        if self.first_application(event.command_id):
            content = canonical_json(
                {
                    "approved": event.approved,
                    "by": event.key_id,
                    "reason": event.reason,
                    "args_digest": event.args_digest,
                }
            )
            self.transcript(
                i, event.submission_id, None, "approval", "user", event.principal, event.approval_id, content
            )
        self.receipt(event.command_id, "command", "applied", "approval", event.submission_id, None)

    def on_joined(self, i: int, event: SubmissionsJoined) -> None:
        """The host's transcript line: which queued submissions its run took in (issue 22 item 2)."""
        content = canonical_json({"joined": list(event.joined_ids), "response_ordinal": event.response_ordinal})
        self.transcript(i, event.submission_id, event.attempt_id, "joined", "system", None, None, content)

    def on_steering_received(self, i: int, event: SteeringReceived) -> None:
        if self.first_application(event.command_id):
            self.transcript(i, event.submission_id, None, "steering", "user", None, event.command_id, event.text)
        self.receipt(event.command_id, "command", "applied", "steering", event.submission_id, None)

    def on_wait_requested(self, i: int, event: WaitRequested) -> None:
        content = canonical_json(
            {
                "kind": event.kind.value,
                "name": event.name,
                "deadline": None if event.deadline is None else event.deadline.isoformat(),
                "details": None if event.details_json is None else json.loads(event.details_json),
            }
        )
        self.transcript(i, event.submission_id, event.attempt_id, "wait", "system", event.name, event.wait_id, content)
        self.set_wait((self.cid, event.submission_id), event.wait_id, (event, self.t))
        if event.kind is WaitKind.APPROVAL:
            self.add(APPROVALS, self.approval_row(event, self.t, "pending"))

    def on_wait_resolved(self, i: int, event: WaitResolved) -> None:
        content = canonical_json(
            {
                "outcome": event.outcome.value,
                "source_id": event.source_id,
                "payload": None if event.payload_json is None else json.loads(event.payload_json),
            }
        )
        self.transcript(i, event.submission_id, None, "wait_resolved", "system", None, event.wait_id, content)
        key = (self.cid, event.submission_id)
        found = self.state.waits_of(*key).get(event.wait_id)
        if found is None:  # the fold refuses a decision of a wait that is not open: a state built without it
            raise ValueError(f"wait {event.wait_id!r} of {key!r} is not open in partition {self.p} at {self.offset}")
        self.set_wait(key, event.wait_id, None)
        request, since = found
        if request.kind is not WaitKind.APPROVAL:
            return
        if event.outcome is WaitOutcome.EXPIRED:
            row = self.approval_row(request, since, "expired", decided_at=event.decided_at, reason="deadline_expired")
        else:
            payload = json.loads(event.payload_json) if event.payload_json is not None else {}
            status = "approved" if payload.get("approved") else "denied"
            row = self.approval_row(
                request, since, status, decided_at=event.decided_at, payload=payload, command_id=event.source_id
            )
        self.add(APPROVALS, row)

    def on_command_rejected(self, i: int, event: CommandRejected) -> None:
        self.receipt(
            event.command_id, "command", "rejected", f"{event.reason.value}: {event.detail}", event.submission_id, None
        )

    def on_response(self, i: int, event: ModelResponseCompleted) -> None:
        self.transcript(
            i, event.submission_id, event.attempt_id, "model_response", "assistant", event.model, None, event.text
        )
        usage = event.usage
        self.add(
            MODEL_USAGE,
            (self.cid, self.batch.first_event_seq + i, event.submission_id, event.attempt_id, event.response_ordinal,
             event.provider, event.model, event.request_id, None if usage is None else usage.input_tokens,
             None if usage is None else usage.output_tokens, None if usage is None else usage.cached_input_tokens,
             None if usage is None else usage.reasoning_tokens, self.t, self.offset),
        )  # fmt: skip

    def on_response_interrupted(self, i: int, event: ModelResponseInterrupted) -> None:
        # A model_usage row like a completed response's (run_usage counts it as a call), its tokens NULL unless the
        # provider reported them before the cut: unknown, not zero (issue 19).
        detail = f"model call cut after {event.output_chars} characters ({event.delta_count} deltas): {event.error}"
        self.transcript(
            i, event.submission_id, event.attempt_id, "model_interrupted", "system", event.model, None, detail
        )
        usage = event.usage
        self.add(
            MODEL_USAGE,
            (self.cid, self.batch.first_event_seq + i, event.submission_id, event.attempt_id, event.response_ordinal,
             event.provider, event.model, None, None if usage is None else usage.input_tokens,
             None if usage is None else usage.output_tokens, None if usage is None else usage.cached_input_tokens,
             None if usage is None else usage.reasoning_tokens, self.t, self.offset),
        )  # fmt: skip

    def on_prepared(self, i: int, event: ToolCallPrepared) -> None:
        t = self.t
        # The row in `TOOL_CALLS` column order (`_PREPARED_COLUMNS`, checked at import), as `call_row` builds it.
        row = (
            event.submission_id, event.call_id, self.cid, event.attempt_id, event.run_id, event.ordinal, event.tool,
            event.args_digest, event.idempotency_key, event.owner_epoch, "prepared", None, None, None, None, None,
            None, t, None, None, None, t, self.offset,
        )  # fmt: skip
        self.set_call((self.cid, event.submission_id, event.call_id), row)
        self.add(TOOL_CALLS, row)
        self.transcript(
            i, event.submission_id, event.attempt_id, "tool_call", "assistant", event.tool, event.call_id,
            event.args_json,
        )  # fmt: skip

    def on_tool_settled(self, i: int, event: ToolCallSettled) -> None:
        key = (self.cid, event.submission_id, event.call_id)
        old = self.call(key)
        if old is None:  # what `update_call` raises
            raise ValueError(f"tool call {key!r} is not in flight in partition {self.p} at offset {self.offset}")
        error = event.error
        t = self.t
        # `update_call` with these columns, by position (every settled call passes here).
        changed = list(old)
        changed[_CALL_STATUS_I] = "error" if error is not None else "settled"
        changed[_CALL_RESULT_DIGEST_I] = event.result_digest
        changed[_CALL_ERROR_TYPE_I] = None if error is None else error.type
        changed[_CALL_ERROR_MESSAGE_I] = None if error is None else error.message
        changed[_CALL_ENDED_I] = t
        changed[_CALL_DURATION_I] = _ms(t, old[_CALL_PREPARED_I])
        changed[_CALL_UPDATED_I] = t
        changed[_CALL_OFFSET_I] = self.offset
        row = tuple(changed)
        self.set_call(key, None)
        self.add(TOOL_CALLS, row)
        content = event.result_json
        if error is not None:
            content = canonical_json(
                {"error": {"type": error.type, "message": error.message, "non_retryable": error.non_retryable}}
            )
        self.transcript(
            i, event.submission_id, event.attempt_id, "tool_result", "tool", str(row[_CALL_TOOL_I]), event.call_id,
            content,
        )  # fmt: skip

    def on_tool_refused(self, i: int, event: ToolCallRefused) -> None:
        t = self.t
        self.add(
            TOOL_CALLS,
            self.call_row(
                {
                    "submission_id": event.submission_id,
                    "call_id": event.call_id,
                    "conversation_id": self.cid,
                    "attempt_id": event.attempt_id,
                    "tool": event.tool,
                    "args_digest": event.args_digest,
                    "status": "refused",
                    "reason": event.reason,
                    "ended_at": t,
                    "updated_at": t,
                    "last_offset": self.offset,
                }
            ),
        )
        self.transcript(
            i, event.submission_id, event.attempt_id, "tool_refused", "tool", event.tool, event.call_id, event.reason
        )

    def on_tool_unknown(self, i: int, event: ToolCallUnknown) -> None:
        key = (self.cid, event.submission_id, event.call_id)
        row = self.update_call(key, status="unknown", reason=event.reason, unknown_since=self.t)
        self.set_call(key, row)
        self.add(TOOL_CALLS, row)
        self.transcript(
            i, event.submission_id, None, "tool_unknown", "system", str(row[_CALL_TOOL_I]), event.call_id, event.reason
        )

    def on_unknown_resolved(self, i: int, event: UnknownResolved) -> None:
        if self.first_application(event.command_id):
            key = (self.cid, event.submission_id, event.call_id)
            row = self.update_call(
                key,
                status="resolved",
                resolution_kind=event.kind.value,
                resolution_outcome=_value(event.outcome),
                result_digest=event.result_digest,
                ended_at=self.t,
            )
            self.set_call(key, None)
            self.add(TOOL_CALLS, row)
            content = event.result_json
            if content is None:
                content = canonical_json({"kind": event.kind.value, "outcome": _value(event.outcome)})
            self.transcript(
                i, event.submission_id, None, "resolution", "operator", str(row[_CALL_TOOL_I]), event.call_id, content
            )
        self.receipt(event.command_id, "command", "applied", event.kind.value, event.submission_id, None)

    def on_step(self, i: int, event: StepRecorded) -> None:
        self.transcript(
            i, event.submission_id, event.attempt_id, "step", "system", event.name, event.step_id, event.result_json
        )

    def on_settlement(self, i: int, event: Settlement) -> None:
        conv = self.conv
        sub = conv.submissions.get(event.submission_id) if conv is not None else None
        seq = -1 if sub is None else sub.submission_seq
        self.add(
            SETTLEMENTS,
            (
                event.submission_id,
                self.cid,
                self.p,
                seq,
                event.outcome.value,
                event.reply_json,
                event.reply_digest,
                event.reply_ref,
                event.error_type,
                event.error_reason,
                event.attempt_count,
                event.settled_at,
                self.offset,
            ),
        )
        if event.joined_to is not None:  # it settles with its host (issue 22 item 2): the host's line shows the reply
            detail = f"{event.outcome.value}: settled with its host {event.joined_to}"
            self.transcript(i, event.submission_id, None, "settlement", "system", None, None, detail)
        elif event.outcome is SettlementOutcome.COMPLETED:
            self.transcript(
                i,
                event.submission_id,
                None,
                "reply",
                "assistant",
                None,
                None,
                event.reply_json if event.reply_json is not None else event.reply_ref,
            )
        else:
            detail = ": ".join(x for x in (event.outcome.value, event.error_type, event.error_reason) if x)
            self.transcript(i, event.submission_id, None, "settlement", "system", None, None, detail)


_EVENT_ROWS: Mapping[type[Any], Callable[[_BatchProjector, int, Any], None]] = MappingProxyType(
    {
        SubmissionAdmitted: _BatchProjector.on_admitted,
        SubmissionDuplicate: _BatchProjector.on_duplicate,
        SubmissionRejected: _BatchProjector.on_rejected,
        AbortRecorded: _BatchProjector.on_abort,
        CommandRejected: _BatchProjector.on_command_rejected,
        ModelResponseCompleted: _BatchProjector.on_response,
        ModelResponseInterrupted: _BatchProjector.on_response_interrupted,
        ToolCallPrepared: _BatchProjector.on_prepared,
        ToolCallSettled: _BatchProjector.on_tool_settled,
        ToolCallRefused: _BatchProjector.on_tool_refused,
        ToolCallUnknown: _BatchProjector.on_tool_unknown,
        UnknownResolved: _BatchProjector.on_unknown_resolved,
        StepRecorded: _BatchProjector.on_step,
        Settlement: _BatchProjector.on_settlement,
        SignalReceived: _BatchProjector.on_signal_received,
        SteeringReceived: _BatchProjector.on_steering_received,
        SubmissionsJoined: _BatchProjector.on_joined,
        ApprovalDecided: _BatchProjector.on_approval_decided,
        AccessGranted: _BatchProjector.on_access_granted,
        LaneSet: _BatchProjector.on_lane_set,
        AccessRevoked: _BatchProjector.on_access_revoked,
        WaitRequested: _BatchProjector.on_wait_requested,
        WaitResolved: _BatchProjector.on_wait_resolved,
    }
)
"""The rows of each event type that has any (the others only move the fold)."""

_EVENT_INFO: Mapping[type[Any], tuple[Callable[[_BatchProjector, int, Any], None] | None, bool,
                                      Callable[[Any], tuple[str, str]] | None]] = MappingProxyType(
    {
        cls: (_EVENT_ROWS.get(cls), cls in _HAS_SUBMISSION_ID, _STEPS.get(cls))
        for cls in LOG_EVENT_TYPES
        if cls is not OwnershipClaimed and cls is not Genesis
    }
)  # fmt: skip
"""Per log event type but the partition-scoped ones: its rows handler, whether it names a submission, its step."""


def project_batch(state: ProjectionState, batch: LogBatch, offset: int, rows: RowSet) -> ProjectionState:
    """Fold one canonical batch and emit the rows it changes.

    Args:
        state: The partition's projection state before the batch; its ``overlay`` receives the batch's conversation
            (pass a `ProjectionState.working` copy when the batch may have to be dropped).
        batch: The batch, read at ``offset`` of the state's log partition.
        offset: Its log offset (stored in ``last_offset`` / ``log_offset`` columns).
        rows: Where the rows go (merged per key).

    Returns:
        The state after the batch.

    Raises:
        settled.protocol.ProtocolError: The fold refuses the batch (a stale epoch, an illegal transition, an
            inconsistent log): the log is not one a correct owner writes.
        settled.schemas.ChainBreakError: The batch does not continue its conversation's chain.
        DuplicateRowError: An append-only row was emitted twice into ``rows``.
    """
    return _BatchProjector(state, batch, offset, rows).run()


def project_chunk(state: ProjectionState, batches: Sequence[tuple[int, LogBatch]], rows: RowSet) -> ProjectionState:
    """`project_batch` over consecutive batches of one partition: every fold first, then every batch's rows.

    The rows of a batch depend on the folds up to it, never the fold on its rows (the tool calls in flight are the
    rows' own), so folding the whole chunk ahead gives exactly the rows and state of `project_batch` batch by batch,
    with each loop's code kept hot (a bulk replay's chunk of records). When a fold refuses a batch, the rows of the
    batches before it are emitted first, then its error is raised, as batch by batch.

    Args:
        state: The partition's projection state before the first batch (its overlay receives the conversations).
        batches: (offset, batch) in offset order.
        rows: Where the rows go.

    Returns:
        The state after the last batch.

    Raises:
        settled.protocol.ProtocolError: See `project_batch`.
        DuplicateRowError: See `project_batch`.
    """
    rows_clock = rows.clock
    started = 0.0 if rows_clock is None else rows_clock()
    folded: list[_BatchProjector] = []
    failure: Exception | None = None
    current = state
    try:
        append = folded.append
        for offset, batch in batches:
            projector = _BatchProjector(current, batch, offset, rows)
            projector.fold()
            current.overlay.update(projector.after_convs)  # `keep_fold`, inlined
            append(projector)
            if projector.head is not current.head:  # `state_after`, inlined: the same state unless the head moved
                current = projector.state_after()
    except Exception as exc:  # noqa: BLE001 - raised below, once the batches before it have their rows
        failure = exc
    if rows_clock is not None:
        rows.fold_s += rows_clock() - started
    for projector in folded:
        projector.emit()
    if failure is not None:
        raise failure
    return current


def fold_reference(state: PartitionState) -> dict[str, dict[tuple[Any, ...], dict[str, Any]]]:
    """Map a folded partition straight to the fold-derived columns (`FOLD_COLUMNS`) of its rows.

    Args:
        state: The partition folded by `settled.protocol.fold` from offset 0.

    Returns:
        Table → primary key → {column: value}, for ``partitions``, ``conversations`` and ``submissions``.
    """
    p = state.partition
    out: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {name: {} for name in FOLD_COLUMNS}
    out["partitions"][(p,)] = {
        "partition_count": state.partition_count,
        "claim_epoch": state.claim_epoch,
        "claimed_by": state.claimed_by,
    }
    for cid, conv in state.conversations.items():
        if is_partition_conversation(cid):
            continue
        unknown = [sid for sid in conv.queue if conv.submissions[sid].state is S.UNKNOWN]
        out["conversations"][(cid,)] = {
            "partition": p,
            "active_submission_id": conv.active_submission_id,
            "queue_depth": len(conv.queue),
            "unknown_count": len(unknown),
            "blocked_by_unknown": bool(unknown),
            "last_submission_seq": conv.last_submission_seq,
            "last_event_seq": conv.last_event_seq,
            "owner_epoch": conv.owner_epoch,
        }
        for sid, sub in conv.submissions.items():
            out["submissions"][(cid, sid)] = {
                "conversation_id": cid,
                "partition": p,
                "submission_seq": sub.submission_seq,
                "principal": sub.principal,
                "idempotency_key": sub.idempotency_key,
                "payload_digest": sub.payload_digest,
                "state": sub.state.value,
                "outcome": _value(sub.outcome),
                "attempt_count": sub.attempt_count,
                "current_attempt_id": sub.attempt_id,
                "input_applied": sub.input_applied,
                "abort_requested": sub.abort_requested,
                "abort_reason": sub.abort_reason,
                "reserved_outcome": _value(sub.reserved_outcome),
                "open_calls": len(sub.open_calls),
                "unknown_calls": len(sub.unknown_calls),
            }
    return out
