"""What a waiting run waits for, and the approvals table, as rows of the log (issue 16 item 7): no Kafka, no Postgres.

A scripted partition: ``s1`` asks for an approval and a signal in one batch (waiting on both, the earlier deadline
shown), the approval is decided, then the signal expires; ``s2`` waits on the approval of a tool call and is aborted
while it waits (the approval is cancelled); ``s3``'s approval expires at its deadline. The rows are checked after each
step, and do not depend on how the log is cut into chunks.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta
from typing import Any

import pytest

from settled.projections import TABLES, ProjectionState, RowSet, TableMode, fold_reference, merge_rows, project_batch
from settled.protocol import PartitionState, approval_details, approval_id_for, fold, wait_id_for
from settled.schemas import (
    AbortRecorded,
    ApprovalDecided,
    AttemptStarted,
    Genesis,
    LogBatch,
    SettlementOutcome,
    SubmissionReady,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
    canonical_json,
)
from tests.integration.projection_script import T0, Script, admitted, settlement

C1, C2 = "conv-wait", "conv-tool-approval"
REFUND_DETAILS = approval_details(
    "refund", "refund order o-7", canonical_json({"description": "refund order o-7", "title": "refund"})
)
TOOL_DETAILS = approval_details("refund", "refund 120 to o-7", canonical_json({"amount": 120}), tool="refund")


def _at(batches: list[LogBatch]) -> Any:
    return batches[-1].recorded_at


def waits_log() -> tuple[list[LogBatch], dict[str, int]]:
    """The scripted log, and the number of batches after each named step."""
    s = Script()
    steps: dict[str, int] = {}
    s.add("~partition/0", Genesis(namespace="scripted", partition_count=1, created_at=T0))
    s.claim(1, "worker-a")
    s.add(C1, admitted("s1", C1, 1, {"q": "refund"}), SubmissionReady(submission_id="s1", submission_seq=1))
    s.add(C1, AttemptStarted(submission_id="s1", attempt=1, attempt_id="a1", owner_epoch=1))
    s.add(
        C1,
        WaitRequested(submission_id="s1", attempt_id="a1", wait_id=approval_id_for("s1", ordinal=0),
                      kind=WaitKind.APPROVAL, name="refund", ordinal=0, deadline=T0 + timedelta(hours=1),
                      details_json=REFUND_DETAILS),
        WaitRequested(submission_id="s1", attempt_id="a1", wait_id=wait_id_for("s1", 1), kind=WaitKind.SIGNAL,
                      name="paid", ordinal=1, deadline=T0 + timedelta(minutes=30)),
    )  # fmt: skip
    steps["s1 waits"] = len(s.batches)
    s.add(
        C1,
        ApprovalDecided(command_id="ok-1", submission_id="s1", approval_id="s1#w0", approved=True,
                        args_digest=_digest(REFUND_DETAILS), principal="supervisor", key_id="ops-key",
                        reason="within policy"),
        WaitResolved(submission_id="s1", wait_id="s1#w0", outcome=WaitOutcome.DELIVERED, source_id="ok-1",
                     payload_json=canonical_json({"approved": True, "by": "ops-key", "principal": "supervisor",
                                                  "reason": "within policy"}), decided_at=T0 + timedelta(minutes=5)),
    )  # fmt: skip
    steps["s1 approved"] = len(s.batches)
    s.add(C1, WaitResolved(submission_id="s1", wait_id="s1#w1", outcome=WaitOutcome.EXPIRED,
                           decided_at=T0 + timedelta(minutes=30)))  # fmt: skip
    steps["s1 ready"] = len(s.batches)
    s.add(C2, admitted("s2", C2, 1, {"q": "tool"}), SubmissionReady(submission_id="s2", submission_seq=1))
    s.add(C2, AttemptStarted(submission_id="s2", attempt=1, attempt_id="a2", owner_epoch=1))
    s.add(C2, WaitRequested(submission_id="s2", attempt_id="a2", wait_id=approval_id_for("s2", call_id="call-7"),
                            kind=WaitKind.APPROVAL, name="refund", ordinal=3, details_json=TOOL_DETAILS))  # fmt: skip
    steps["s2 waits"] = len(s.batches)
    s.add(C2, AbortRecorded(command_id="abort-2", submission_id="s2", principal="tester", reason="customer left"))
    s.add(C2, settlement("s2", SettlementOutcome.ABORTED, 1))
    steps["s2 aborted"] = len(s.batches)
    s.add(C1, admitted("s3", C1, 2, {"q": "late"}), SubmissionReady(submission_id="s3", submission_seq=2))
    s.add(C1, AttemptStarted(submission_id="s1", attempt=2, attempt_id="a1b", owner_epoch=1))
    s.add(C1, settlement("s1", SettlementOutcome.COMPLETED, 2, {"done": True}))
    s.add(C1, AttemptStarted(submission_id="s3", attempt=1, attempt_id="a3", owner_epoch=1))
    s.add(C1, WaitRequested(submission_id="s3", attempt_id="a3", wait_id="s3#w0", kind=WaitKind.APPROVAL,
                            name="late", ordinal=0, deadline=T0 + timedelta(minutes=1),
                            details_json=REFUND_DETAILS))  # fmt: skip
    s.add(C1, WaitResolved(submission_id="s3", wait_id="s3#w0", outcome=WaitOutcome.EXPIRED,
                           decided_at=T0 + timedelta(minutes=1)))  # fmt: skip
    steps["s3 expired"] = len(s.batches)
    return s.batches, steps


def _digest(details_json: str) -> str:
    return str(json.loads(details_json)["args_digest"])


def _project(batches: list[LogBatch]) -> RowSet:
    rows = RowSet()
    state = ProjectionState.empty(0)
    for offset, batch in enumerate(batches):
        state = project_batch(state, batch, offset, rows)
    return rows


def _table(rows: RowSet, name: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    spec = TABLES[name]
    return {key: dict(zip(spec.columns, row, strict=True)) for key, row in rows.tables[name].items()}


def _waiting(rows: RowSet, conversation: str, attempt_id: str) -> tuple[Any, ...]:
    a = _table(rows, "attempts")[(conversation, attempt_id)]
    return a["status"], a["waiting_kind"], a["waiting_name"], a["waiting_since"], a["waiting_deadline"]


def test_a_run_waiting_on_an_approval_and_a_signal_shows_both_and_the_earlier_deadline() -> None:
    batches, steps = waits_log()
    asked = batches[: steps["s1 waits"]]
    rows = _project(asked)
    assert _waiting(rows, C1, "a1") == (
        "waiting", "approval,signal", "refund,paid", _at(asked), T0 + timedelta(minutes=30))  # fmt: skip
    approval = _table(rows, "approvals")[(C1, "s1#w0")]
    assert {k: approval[k] for k in ("submission_id", "attempt_id", "ordinal", "call_id", "tool", "title",
                                     "description", "args_json", "status", "requested_at", "deadline")} == {
        "submission_id": "s1", "attempt_id": "a1", "ordinal": 0, "call_id": None, "tool": None, "title": "refund",
        "description": "refund order o-7", "args_json": '{"description":"refund order o-7","title":"refund"}',
        "status": "pending", "requested_at": _at(asked), "deadline": T0 + timedelta(hours=1)}  # fmt: skip
    assert approval["args_digest"] == _digest(REFUND_DETAILS)
    assert list(_table(rows, "approvals")) == [(C1, "s1#w0")]  # a signal wait is no approval


def test_a_decided_approval_shows_who_and_why_and_the_run_waits_on_what_is_left() -> None:
    batches, steps = waits_log()
    rows = _project(batches[: steps["s1 approved"]])
    asked_at = _at(batches[: steps["s1 waits"]])
    assert _waiting(rows, C1, "a1") == ("waiting", "signal", "paid", asked_at, T0 + timedelta(minutes=30))
    approval = _table(rows, "approvals")[(C1, "s1#w0")]
    assert {k: approval[k] for k in ("status", "decided_by", "principal", "reason", "command_id", "decided_at",
                                     "requested_at")} == {
        "status": "approved", "decided_by": "ops-key", "principal": "supervisor", "reason": "within policy",
        "command_id": "ok-1", "decided_at": T0 + timedelta(minutes=5), "requested_at": asked_at}  # fmt: skip
    transcript = [r for r in sorted(rows.tables["transcript"].values()) if r[0] == C1]
    assert [(r[4], r[6]) for r in transcript] == [
        ("input", None), ("wait", "refund"), ("wait", "paid"), ("approval", "supervisor"),
        ("wait_resolved", None)]  # fmt: skip
    assert '"approved":true' in transcript[3][8] and '"by":"ops-key"' in transcript[3][8]
    assert '"reason":"within policy"' in transcript[3][8]


def test_a_run_no_longer_waiting_shows_no_wait() -> None:
    batches, steps = waits_log()
    rows = _project(batches[: steps["s1 ready"]])
    status, kind, name, since, deadline = _waiting(rows, C1, "a1")
    assert (status, kind, name, deadline) == ("interrupted", None, None, None)
    assert since == _at(batches[: steps["s1 waits"]])  # when it began to wait is kept


def test_a_tool_calls_approval_shows_the_call_and_its_arguments_and_an_abort_cancels_it() -> None:
    batches, steps = waits_log()
    rows = _project(batches[: steps["s2 waits"]])
    approval = _table(rows, "approvals")[(C2, "s2#acall-7")]
    assert (approval["call_id"], approval["tool"], approval["args_json"], approval["status"], approval["deadline"]) == (
        "call-7", "refund", '{"amount":120}', "pending", None)  # fmt: skip
    assert _waiting(rows, C2, "a2")[:3] == ("waiting", "approval", "refund")
    rows = _project(batches[: steps["s2 aborted"]])
    approval = _table(rows, "approvals")[(C2, "s2#acall-7")]
    assert (approval["status"], approval["decided_at"]) == ("cancelled", None)
    assert _waiting(rows, C2, "a2")[:3] == ("aborted", None, None)


def test_an_expired_approval_reads_as_deadline_expired() -> None:
    batches, steps = waits_log()
    rows = _project(batches[: steps["s3 expired"]])
    approval = _table(rows, "approvals")[(C1, "s3#w0")]
    assert (approval["status"], approval["reason"], approval["decided_by"], approval["decided_at"]) == (
        "expired", "deadline_expired", None, T0 + timedelta(minutes=1))  # fmt: skip


def test_wait_rows_do_not_depend_on_how_the_log_is_cut_into_chunks() -> None:
    batches, _ = waits_log()
    whole = _project(batches)
    for seed in range(20):
        rng = random.Random(seed)
        db: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]] = {name: {} for name in TABLES}
        state = ProjectionState.empty(0)
        offset = 0
        while offset < len(batches):
            size = rng.randint(1, 5)
            chunk = RowSet()
            working = state.working()
            for i in range(offset, min(offset + size, len(batches))):
                working = project_batch(working, batches[i], i, chunk)
            state = working.commit()
            offset += size
            for name, spec in TABLES.items():
                for key, row in chunk.tables[name].items():
                    old = db[name].get(key)
                    if old is None:
                        db[name][key] = row
                    elif spec.mode is TableMode.UPSERT:
                        db[name][key] = merge_rows(spec, old, row)
                    else:
                        assert spec.mode is TableMode.FIRST, f"{name} {key} written twice"
        assert db == whole.tables, f"seed {seed}"


def test_the_fold_accepts_the_scripted_log() -> None:
    batches, _ = waits_log()
    reference = fold_reference(fold(PartitionState(partition=0), batches))
    assert reference["submissions"][(C1, "s3")]["state"] == "ready"
    assert reference["submissions"][(C2, "s2")]["state"] == "aborted"


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_dropped_working_copy_reopens_the_waits_it_closed(cut: int) -> None:
    """A chunk rolled back after it closed a wait: replaying it from the committed state gives the same rows."""
    batches, steps = waits_log()
    committed = ProjectionState.empty(0)
    upto = steps["s1 waits"]
    for offset, batch in enumerate(batches[:upto]):
        committed = project_batch(committed.working(), batch, offset, RowSet()).commit()
    dropped = committed.working()
    for offset in range(upto, upto + cut):
        dropped = project_batch(dropped, batches[offset], offset, RowSet())
    rows = RowSet()
    again = committed.working()
    for offset in range(upto, len(batches)):
        again = project_batch(again, batches[offset], offset, rows)
    assert _table(rows, "approvals")[(C1, "s1#w0")]["status"] == "approved"
