"""The ledger projection's tables as data: columns, keys and how a new row merges into a stored one (docs/design.md §6).

One description serves three readers, so that they agree by construction:

* the projector's SQL (`upsert_sql`, `insert_sql`): ``INSERT ... ON CONFLICT (key) DO UPDATE`` with one rule per
  column, ``COPY`` for the append-only tables;
* the in-memory row set (`settled.projections.RowSet`) that merges a chunk's rows before they are written, and that
  is the reference projection of a whole log (`settled projections check`);
* the schema check against the migrations (`settled.projections.check_layout`).

Merge rules per column (each associative, so merging a chunk first and the database second gives the same row as
merging every batch in turn into the database; the result never depends on how the log was cut into chunks):

* ``OVERWRITE``: the newer value wins (``col = EXCLUDED.col``);
* ``STICKY``: the first non-null value stays (``col = COALESCE(t.col, EXCLUDED.col)``): admission time, first start;
* ``LATEST``: the newest non-null value wins (``col = COALESCE(EXCLUDED.col, t.col)``): the current step.

Table modes: ``UPSERT`` (per-column rules), ``FIRST`` (``ON CONFLICT DO NOTHING``: a receipt is the first decision of
its request) and ``APPEND`` (plain insert or ``COPY``; a second row with the same key is an error — the transcript and
the settlements are where a batch applied twice shows up instead of being merged away).
"""

from __future__ import annotations

import enum
import functools
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["QUARANTINE", "TABLES", "MergeRule", "TableMode", "TableSpec", "merge_rows"]


class MergeRule(enum.Enum):
    """How a column of an upserted row merges into the stored row."""

    OVERWRITE = "overwrite"
    STICKY = "sticky"
    LATEST = "latest"


class TableMode(enum.Enum):
    """How a table's rows are written."""

    UPSERT = "upsert"
    FIRST = "first"
    APPEND = "append"


@dataclass(frozen=True)
class TableSpec:
    """One projection table.

    Attributes:
        name: Table name (unqualified; the schema is the projection version's).
        columns: Column names, in row-tuple order.
        key: The primary-key columns.
        mode: How rows are written.
        rules: Merge rule per column that is not `MergeRule.OVERWRITE` (``UPSERT`` tables only).
    """

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    mode: TableMode
    rules: Mapping[str, MergeRule] = field(default_factory=lambda: MappingProxyType({}))
    _key: Callable[[Sequence[Any]], tuple[Any, ...]] = field(init=False, repr=False, compare=False)
    _merge: Callable[[Sequence[Any], Sequence[Any]], tuple[Any, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Check that the key and the rules name columns of the table.

        Raises:
            ValueError: A key column or a ruled column is not a column.
        """
        for name in (*self.key, *self.rules):
            if name not in self.columns:
                raise ValueError(f"table {self.name}: {name!r} is not one of its columns {self.columns}")
        object.__setattr__(self, "_key", _key_getter(tuple(self.columns.index(k) for k in self.key)))
        sticky = tuple(i for i, c in enumerate(self.columns) if self.rule(c) is MergeRule.STICKY)
        latest = tuple(i for i, c in enumerate(self.columns) if self.rule(c) is MergeRule.LATEST)
        object.__setattr__(self, "_merge", _merger(len(self.columns), sticky, latest))

    @functools.cached_property
    def rule_indexes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The positions of the `MergeRule.STICKY` columns and of the `MergeRule.LATEST` columns."""
        sticky = tuple(i for i, c in enumerate(self.columns) if self.rule(c) is MergeRule.STICKY)
        latest = tuple(i for i, c in enumerate(self.columns) if self.rule(c) is MergeRule.LATEST)
        return sticky, latest

    @functools.cached_property
    def key_indexes(self) -> tuple[int, ...]:
        """The positions of the key columns."""
        return tuple(self.columns.index(k) for k in self.key)

    def key_of(self, row: Sequence[Any]) -> tuple[Any, ...]:
        """Return a row's primary key.

        Args:
            row: A row tuple in `columns` order.

        Returns:
            The key values.
        """
        return self._key(row)

    def rule(self, column: str) -> MergeRule:
        """Return a column's merge rule.

        Args:
            column: A column name.

        Returns:
            Its rule (`MergeRule.OVERWRITE` unless listed in `rules`).
        """
        return self.rules.get(column, MergeRule.OVERWRITE)


def _key_getter(indexes: tuple[int, ...]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """A row's key as a tuple, without a generator per row (the projector calls it for every row)."""
    if len(indexes) == 1:
        (i,) = indexes
        return lambda row: (row[i],)
    getter = operator.itemgetter(*indexes)
    return lambda row: tuple(getter(row))


def merge_rows(spec: TableSpec, old: Sequence[Any], new: Sequence[Any]) -> tuple[Any, ...]:
    """Merge ``new`` into ``old`` exactly as the table's SQL does (module doc).

    Args:
        spec: The table (an ``UPSERT`` table).
        old: The stored row.
        new: The incoming row with the same key.

    Returns:
        The merged row.
    """
    return spec._merge(old, new)


def _merger(columns: int, sticky: tuple[int, ...], latest: tuple[int, ...]) -> Callable[[Any, Any], tuple[Any, ...]]:
    """Generate a table's merge: one tuple display, each column the new value or, by its rule, the stored one.

    ``STICKY``: the stored value unless it is null; ``LATEST``: the new value unless it is null; else the new value.
    """
    if not sticky and not latest:
        return lambda old, new: tuple(new)
    items = []
    for i in range(columns):
        if i in sticky:
            items.append(f"n[{i}] if o[{i}] is None else o[{i}]")
        elif i in latest:
            items.append(f"o[{i}] if n[{i}] is None else n[{i}]")
        else:
            items.append(f"n[{i}]")
    scope: dict[str, Any] = {}
    exec(f"def merge(o, n):\n    return ({', '.join(items)},)", scope)  # generated from the column positions alone
    merge: Callable[[Any, Any], tuple[Any, ...]] = scope["merge"]
    return merge


def _spec(name: str, columns: str, key: str, mode: TableMode = TableMode.UPSERT, **rules: MergeRule) -> TableSpec:
    return TableSpec(name, tuple(columns.split()), tuple(key.split()), mode, MappingProxyType(dict(rules)))


_S, _L = MergeRule.STICKY, MergeRule.LATEST

PARTITIONS = _spec(
    "partitions",
    "partition partition_count claim_epoch claimed_by claimed_at updated_at last_offset",
    "partition",
    partition_count=_L,
    claimed_at=_L,
)
CONVERSATIONS = _spec(
    "conversations",
    "conversation_id partition active_submission_id queue_depth unknown_count blocked_by_unknown "
    "last_submission_seq last_event_seq owner_epoch created_at updated_at last_offset",
    "conversation_id",
    created_at=_S,
)
SUBMISSIONS = _spec(
    "submissions",
    "submission_id conversation_id partition submission_seq principal idempotency_key payload_digest tools_offered "
    "state outcome receipt_outcome attempt_count current_attempt_id input_applied abort_requested abort_reason "
    "reserved_outcome open_calls unknown_calls admitted_at admitted_offset first_started_at settled_at updated_at "
    "last_offset retry_of",
    "conversation_id submission_id",
    tools_offered=_S,
    admitted_at=_S,
    admitted_offset=_S,
    first_started_at=_S,
    settled_at=_S,
)
ATTEMPTS = _spec(
    "attempts",
    "attempt_id submission_id conversation_id attempt owner_epoch status waiting_kind waiting_name waiting_since "
    "waiting_deadline current_step end_reason started_at ended_at updated_at last_offset",
    "conversation_id attempt_id",
    owner_epoch=_S,
    waiting_since=_S,
    current_step=_L,
    end_reason=_S,
    started_at=_S,
    ended_at=_S,
)
TOOL_CALLS = _spec(
    "tool_calls",
    "submission_id call_id conversation_id attempt_id run_id ordinal tool args_digest idempotency_key owner_epoch "
    "status result_digest error_type error_message reason resolution_kind resolution_outcome prepared_at ended_at "
    "unknown_since duration_ms updated_at last_offset",
    "conversation_id submission_id call_id",
)
SETTLEMENTS = _spec(
    "settlements",
    "submission_id conversation_id partition submission_seq outcome reply_json reply_digest reply_ref error_type "
    "error_reason attempt_count settled_at log_offset",
    "conversation_id submission_id",
    TableMode.APPEND,
)
RECEIPTS = _spec(
    "receipts",
    "request_id request_kind conversation_id outcome reason submission_id submission_seq decided_at log_offset",
    "conversation_id request_id",
    TableMode.FIRST,
)
TRANSCRIPT = _spec(
    "transcript",
    "conversation_id event_seq submission_id attempt_id kind role name call_id content recorded_at log_offset",
    "conversation_id event_seq",
    TableMode.APPEND,
)
MODEL_USAGE = _spec(
    "model_usage",
    "conversation_id event_seq submission_id attempt_id response_ordinal provider model request_id input_tokens "
    "output_tokens cached_input_tokens reasoning_tokens recorded_at log_offset",
    "conversation_id event_seq",
    TableMode.APPEND,
)

APPROVALS = _spec(
    "approvals",
    "conversation_id approval_id submission_id attempt_id ordinal call_id tool title description args_json "
    "args_digest status requested_at deadline decided_at decided_by principal reason command_id updated_at last_offset",
    "conversation_id approval_id",
    requested_at=_S,
)

CONVERSATION_ACCESS = _spec(
    "conversation_access",
    "conversation_id principal access granted_by command_id since updated_at last_offset",
    "conversation_id principal",
)

TABLES: Mapping[str, TableSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            PARTITIONS,
            CONVERSATIONS,
            SUBMISSIONS,
            ATTEMPTS,
            TOOL_CALLS,
            SETTLEMENTS,
            RECEIPTS,
            TRANSCRIPT,
            MODEL_USAGE,
            APPROVALS,
            CONVERSATION_ACCESS,
        )
    }
)
"""Every projection table, in write order.

Submissions, attempts, tool calls, settlements and receipts are keyed within their conversation: a partition's owner
sees only its own conversations, so an id reused by a conversation of another partition cannot be refused (layout 2,
``settled/projections/sql/0002_conversation_keys.sql``). ``approvals`` (layout 5,
``settled/projections/sql/0005_waits.sql``): one row per approval a run requested, pending until decided, expired or
cancelled. ``conversation_access`` (layout 7, ``settled/projections/sql/0007_access.sql``): each conversation's opener
and the principals granted access (issue 20), a revoked grant kept as ``revoked``."""

QUARANTINE = _spec(
    "projection_quarantine",
    "partition log_offset event_types refused_groups sqlstate error",
    "partition log_offset",
    TableMode.FIRST,
)
"""The log records the projector could not write (`settled.projections.Projector`): not a row of the fold, so not in
`TABLES`; `settled projections check` compares it on its own."""
