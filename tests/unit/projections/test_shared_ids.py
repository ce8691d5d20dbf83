"""One submission, attempt and call id used by two conversations of one partition (issue 25 item 4).

Ids are unique per conversation: the projection keys submissions, attempts, tool calls, settlements and receipts by
(conversation, id), in its tables and in its in-memory state (calls in flight, the bulk replay's deferred rows).
"""

from __future__ import annotations

from typing import Any

from settled.projections import TABLES, ProjectionState, RowSet, fold_reference, project_batch
from settled.protocol import PartitionState, fold
from settled.schemas import AttemptStarted, Genesis, LogBatch, SettlementOutcome, SubmissionReady
from tests.integration.projection_script import T0, Script, admitted, prepared, settled, settlement

CONVERSATIONS = ("conv-a", "conv-b")


def _log() -> list[LogBatch]:
    s = Script(partition=0)
    s.add("~partition/0", Genesis(namespace="shared-ids", partition_count=1, created_at=T0))
    s.claim(1, "worker-a")
    for cid in CONVERSATIONS:  # interleaved: a's call is in flight while b's is prepared under the same ids
        s.add(
            cid, admitted("s1", cid, 1, {"in": cid}, ("search",)), SubmissionReady(submission_id="s1", submission_seq=1)
        )
    for cid in CONVERSATIONS:
        s.add(cid, AttemptStarted(submission_id="s1", attempt=1, attempt_id="a1", owner_epoch=1))
    for cid in CONVERSATIONS:
        s.add(cid, prepared("s1", "a1", "A", "search", 0, 1))
    for cid in reversed(CONVERSATIONS):
        s.add(cid, settled("s1", "a1", "A", {"from": cid}))
    for cid in CONVERSATIONS:
        s.add(cid, settlement("s1", SettlementOutcome.COMPLETED, 1, {"reply": cid}))
    return s.batches


def _rows(batches: list[LogBatch], *, deferred: bool) -> RowSet:
    rows = RowSet(deferred=deferred)
    state = ProjectionState.empty(0)
    for offset, batch in enumerate(batches):
        state = project_batch(state, batch, offset, rows)
    rows.finish()
    assert state.in_flight() == {}
    return rows


def _column(rows: RowSet, table: str, column: str) -> dict[tuple[Any, ...], Any]:
    i = TABLES[table].columns.index(column)
    return {key: row[i] for key, row in rows.tables[table].items()}


def test_each_conversation_keeps_its_own_rows_under_a_shared_submission_id() -> None:
    batches = _log()
    rows = _rows(batches, deferred=False)
    assert _column(rows, "submissions", "state") == {(c, "s1"): "completed" for c in CONVERSATIONS}
    assert _column(rows, "attempts", "status") == {(c, "a1"): "completed" for c in CONVERSATIONS}
    assert _column(rows, "tool_calls", "result_digest").keys() == {(c, "s1", "A") for c in CONVERSATIONS}
    assert set(_column(rows, "tool_calls", "status").values()) == {"settled"}
    assert _column(rows, "settlements", "reply_json") == {(c, "s1"): f'{{"reply":"{c}"}}' for c in CONVERSATIONS}
    assert _column(rows, "receipts", "outcome") == {(c, "s1"): "admitted" for c in CONVERSATIONS}
    # The bulk replay's deferred rows are the same rows.
    assert _rows(batches, deferred=True).tables == rows.tables
    # The fold reference keys them alike.
    reference = fold_reference(fold(PartitionState(partition=0), batches))
    assert set(reference["submissions"]) == {(c, "s1") for c in CONVERSATIONS}
