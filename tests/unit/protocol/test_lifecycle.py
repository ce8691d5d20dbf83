"""Lifecycle events as a pure function of a canonical batch (issue 17 item 5; settled/protocol/_lifecycle.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from settled.protocol import LIFECYCLE_TYPES, lifecycle_event_id, lifecycle_events, lifecycle_matches
from settled.schemas import (
    ApprovalDecided,
    AttemptStarted,
    Codec,
    InputApplied,
    LifecycleEvent,
    LogBatch,
    LogEvent,
    Settlement,
    SettlementOutcome,
    SignalReceived,
    StepRecorded,
    StepRetryScheduled,
    SubmissionRetryScheduled,
    WaitKind,
    WaitRequested,
    canonical_json,
    json_digest,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
DIGEST = json_digest(canonical_json({}))


def _batch(*events: LogEvent) -> LogBatch:
    return LogBatch.seal(
        conversation_id="wf:inv:1",
        batch_id="wf:inv:1:7",
        first_event_seq=7,
        owner_epoch=1,
        prev_batch_digest=DIGEST,
        recorded_at=T0,
        submission_id="s",
        events=list(events),
    )


def _step(name: str, value: object) -> StepRecorded:
    result = canonical_json(value)
    return StepRecorded(
        submission_id="s",
        attempt_id="a2",
        name=name,
        version=1,
        step_id="id-" + name,
        ordinal=3,
        result_json=result,
        result_digest=json_digest(result),
    )


def _wait(kind: WaitKind) -> WaitRequested:
    return WaitRequested(submission_id="s", attempt_id="a2", wait_id="s#w4", kind=kind, name="save?", ordinal=4)


def _decided(approved: bool) -> ApprovalDecided:
    return ApprovalDecided(
        command_id="c", submission_id="s", approval_id="s#w4", approved=approved, args_digest=DIGEST,
        principal="ops", key_id="k",
    )  # fmt: skip


def _settlement(outcome: SettlementOutcome) -> Settlement:
    failed = outcome is SettlementOutcome.FAILED
    reply = None if failed else canonical_json({"ok": 1})
    return Settlement(
        submission_id="s", outcome=outcome, reply_json=reply,
        reply_digest=None if reply is None else json_digest(reply),
        error_type="ValueError" if failed else None, error_reason="no" if failed else None, attempt_count=2,
        settled_at=T0,
    )  # fmt: skip


RETRY = StepRetryScheduled(
    submission_id="s", attempt_id="a2", step="save", retry=1, ordinal=5, error_type="ValueError",
    error_message="no", wake_at=T0, wait_id="s#w5",
)  # fmt: skip
SUBMISSION_RETRY = SubmissionRetryScheduled(
    submission_id="s", attempt_id="a2", retry=2, cause="WorkerDied: attempt 2", backoff_ms=1_250, wake_at=T0,
    wait_id="s#retry2",
)  # fmt: skip


@pytest.mark.parametrize(
    ("event", "kind", "data"),
    [
        (AttemptStarted(submission_id="s", attempt=2, attempt_id="a2", owner_epoch=1), "durable.started",
         {"attempt": 2, "attempt_id": "a2"}),
        (_step("step:extract", {"n": 1}), "durable.step_completed", {"step": "extract", "attempt_id": "a2"}),
        (_step("log:extract", "reading page 2"), "durable.log",
         {"step": "extract", "message": "reading page 2", "attempt_id": "a2"}),
        (_wait(WaitKind.APPROVAL), "durable.approval_needed", {"approval_id": "s#w4", "name": "save?"}),
        (_decided(True), "durable.approval_granted", {"approval_id": "s#w4", "principal": "ops"}),
        (RETRY, "durable.retry", {"step": "save", "retry": 1, "error_type": "ValueError", "error_message": "no",
                                  "wake_at": T0.isoformat()}),
        (SUBMISSION_RETRY, "durable.retry", {"step": None, "retry": 2, "attempt_id": "a2",
                                             "cause": "WorkerDied: attempt 2", "backoff_ms": 1_250,
                                             "wake_at": T0.isoformat()}),
        (_settlement(SettlementOutcome.FAILED), "durable.failed",
         {"error_type": "ValueError", "error_reason": "no", "attempt_count": 2}),
        (_settlement(SettlementOutcome.COMPLETED), "durable.completed", {"attempt_count": 2}),
    ],
)  # fmt: skip
def test_each_mapped_record_gives_one_event_with_its_batch_and_index(event: LogEvent, kind: str, data: object) -> None:
    filler = InputApplied(submission_id="s", attempt_id="a2", input_digest=DIGEST)
    batch = _batch(filler, event)
    (got,) = lifecycle_events(batch)
    assert got == LifecycleEvent(
        event_id="wf:inv:1:7#1", type=kind, conversation_id="wf:inv:1", submission_id="s", batch_id="wf:inv:1:7",
        index=1, data_json=canonical_json(data), occurred_at=T0,
    )  # fmt: skip
    assert json.loads(got.data_json) == data
    assert got.type in LIFECYCLE_TYPES


@pytest.mark.parametrize(
    "event",
    [
        InputApplied(submission_id="s", attempt_id="a2", input_digest=DIGEST),
        _step("checkpoint:extract", {"at": 1}),
        _step("lookup", {"agent": "step"}),  # an agent's ctx.step: no step_completed (the agent list)
        _wait(WaitKind.SIGNAL),  # a signal wait, and a retry's timed wait
        _decided(False),  # a denial: durable.paused will come from the pause record, not from here
        _settlement(SettlementOutcome.ABORTED),
        SignalReceived(command_id="g", submission_id="s", name="n", payload_json="1", principal="ops"),
    ],
)
def test_records_without_a_lifecycle_event_give_none(event: LogEvent) -> None:
    assert lifecycle_events(_batch(event)) == ()


def test_a_batch_with_several_causes_gives_them_in_order_with_distinct_ids() -> None:
    batch = _batch(
        _step("step:save", 1),
        RETRY,
        _wait(WaitKind.SIGNAL),
        _settlement(SettlementOutcome.COMPLETED),
    )
    got = lifecycle_events(batch)
    assert [(e.type, e.event_id) for e in got] == [
        ("durable.step_completed", "wf:inv:1:7#0"),
        ("durable.retry", "wf:inv:1:7#1"),
        ("durable.completed", "wf:inv:1:7#3"),
    ]
    assert lifecycle_event_id("wf:inv:1:7", 3) == "wf:inv:1:7#3"


def test_the_same_batch_gives_the_same_events_and_they_survive_the_codec() -> None:
    batch = _batch(AttemptStarted(submission_id="s", attempt=1, attempt_id="a1", owner_epoch=1), RETRY)
    first, again = lifecycle_events(batch), lifecycle_events(batch)
    assert first == again
    codec = Codec()
    assert [codec.decode(codec.encode(e), expected=(LifecycleEvent,)) for e in first] == list(first)


def test_paused_has_no_causing_record_yet() -> None:
    assert "durable.paused" in LIFECYCLE_TYPES


@pytest.mark.parametrize(
    ("pattern", "kind", "matches"),
    [
        ("durable.*", "durable.started", True),
        ("durable.approval_*", "durable.approval_granted", True),
        ("durable.approval_*", "durable.started", False),
        ("durable.retry", "durable.retry", True),
        ("DURABLE.*", "durable.retry", False),
    ],
)
def test_patterns_match_types_by_fnmatch(pattern: str, kind: str, matches: bool) -> None:
    assert lifecycle_matches(pattern, kind) is matches


# -- a workflow step's approvals and pauses (issue 17 item 2) ------------------------------------------------------

ASK = "s#approve:send#1"
PAUSE = WaitRequested(
    submission_id="s", attempt_id="a2", wait_id="s#p6", kind=WaitKind.SIGNAL, name="settled.resume", ordinal=6,
    details_json=canonical_json({"approval_id": ASK, "reason": "denied: no", "source": None, "step": "send"}),
)  # fmt: skip


@pytest.mark.parametrize(
    ("event", "kind", "data"),
    [
        (_step("approval-request:send#1", {"approval_id": ASK, "ask": 1, "description": "pay", "step": "send"}),
         "durable.approval_needed", {"approval_id": ASK, "name": "send"}),
        (_step("approval:send#1", {"approved": True}), "durable.approval_granted",
         {"approval_id": ASK, "principal": None}),
        (PAUSE, "durable.paused",
         {"wait_id": "s#p6", "approval_id": ASK, "reason": "denied: no", "source": None, "step": "send"}),
    ],
)  # fmt: skip
def test_a_workflow_steps_ask_its_callback_approval_and_a_pause_give_their_events(
    event: LogEvent, kind: str, data: object
) -> None:
    (got,) = lifecycle_events(_batch(event))
    assert (got.type, json.loads(got.data_json)) == (kind, data)


@pytest.mark.parametrize(
    "event",
    [
        _step("approval:send#1", {"approved": False}),  # denied: the pause that follows is the event
        _step("approval:send#1", {"approved": None}),  # left to a person: their ApprovalDecided is the event
        WaitRequested(submission_id="s", attempt_id="a2", wait_id=ASK, kind=WaitKind.APPROVAL, name="send", ordinal=5),
        _step("workflow", {"steps": ["send"], "workflow": "pay"}),  # the run's plan
    ],
)
def test_a_workflow_steps_ask_is_announced_once(event: LogEvent) -> None:
    assert lifecycle_events(_batch(event)) == ()
