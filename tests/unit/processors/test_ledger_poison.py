"""`LedgerDecider.poison`: typed failures for a conversation's run that cannot be appended (docs/design.md §3).

The conductor stages an attempt start in the same turn as the admission (or the settlement) before it, so a run
that is too large for the log holds that start too; before the fix the worker died on it with "no typed failure
replaces ['AttemptStarted', 'InputApplied']". The replacements must decide the same inputs and fold onto the
committed state.
"""

from __future__ import annotations

import dataclasses

import pytest

from settled.processors import Decision, LedgerDecider
from settled.processors._ledger import to_loop_decision
from settled.protocol import PartitionState, SubmissionState, admit, start_attempt, terminalize
from settled.schemas import (
    RESULT_TOO_LARGE,
    ReceiptOutcome,
    Settlement,
    SettlementOutcome,
    SubmissionDuplicate,
    SubmissionRejected,
    SubmissionRejectReason,
    ToolCallSettled,
    canonical_json,
    json_digest,
)
from tests.unit.protocol._sim import T0, Log, proposal

CID = "c1"
REASON = "record of 2000000 bytes exceeds the limit of 1048588 bytes"


@pytest.fixture
def log() -> Log:
    log = Log()
    log.claim()
    return log


def test_an_oversized_admission_with_its_duplicate_and_attempt_start_becomes_rejections(log: Log) -> None:
    committed = dataclasses.replace(log)  # what the appender has committed; `log` goes on as the pending overlay
    ref_a, ref_b = log.ref(), log.ref()
    adm = admit(log.state.conversation(CID), proposal("s1", "k", conversation_id=CID), ref_a, T0)
    log.commit(CID, adm)
    dup = admit(log.state.conversation(CID), proposal("s2", "k", conversation_id=CID), ref_b, T0)
    assert isinstance(dup.events[0], SubmissionDuplicate)
    log.commit(CID, dup)
    start = start_attempt(log.state.conversation(CID), "s1", "a1", log.epoch)
    log.commit(CID, start)
    run = [
        to_loop_decision(CID, adm, frozenset({ref_a.offset})),
        to_loop_decision(CID, dup, frozenset({ref_b.offset})),
        to_loop_decision(CID, start),
    ]

    out = LedgerDecider(partition=0, partition_count=1).poison(committed.state, run, REASON, T0)

    assert [d.inputs for d in out] == [frozenset({ref_a.offset}), frozenset({ref_b.offset})]
    rejected = [d.events[0] for d in out]
    assert all(isinstance(e, SubmissionRejected) for e in rejected)
    assert [(e.submission_id, e.reason) for e in rejected if isinstance(e, SubmissionRejected)] == [
        ("s1", SubmissionRejectReason.OTHER),
        ("s2", SubmissionRejectReason.OTHER),
    ]
    receipts = [r for d in out for r in d.receipts]
    assert [(r.request_id, r.outcome) for r in receipts] == [
        ("s1", ReceiptOutcome.REJECTED),
        ("s2", ReceiptOutcome.REJECTED),
    ]
    assert all(REASON in (r.reason or "") for r in receipts)
    for d in out:  # the replacements fold onto what committed: the key stays free, nothing is admitted
        committed.append(CID, d.events)
    assert committed.state.conversation(CID).submission("s1") is None
    assert committed.state.conversation(CID).lookup_key("alice", "k") is None


def test_an_oversized_settlement_with_the_next_attempt_start_becomes_a_failed_settlement(log: Log) -> None:
    for sid, key in (("s1", "k1"), ("s2", "k2")):
        log.commit(CID, admit(log.state.conversation(CID), proposal(sid, key, conversation_id=CID), log.ref(), T0))
    log.commit(CID, start_attempt(log.state.conversation(CID), "s1", "a1", log.epoch))
    committed = dataclasses.replace(log)
    done = terminalize(log.state.conversation(CID), "s1", SettlementOutcome.COMPLETED, T0, reply_json='"big"')
    log.commit(CID, done)
    nxt = start_attempt(log.state.conversation(CID), "s2", "a2", log.epoch)
    log.commit(CID, nxt)

    out = LedgerDecider(partition=0, partition_count=1).poison(
        committed.state, [to_loop_decision(CID, done), to_loop_decision(CID, nxt)], REASON, T0
    )

    (replaced,) = out
    settlement = next(e for e in replaced.events if isinstance(e, Settlement))
    assert (settlement.submission_id, settlement.outcome) == ("s1", SettlementOutcome.FAILED)
    (record,) = replaced.settlements
    assert (record.error_type, record.error_reason) == ("result_too_large", REASON)
    committed.append(CID, replaced.events)
    # s2's start was dropped, not lost: it is ready and the scheduler starts it from the committed state.
    assert committed.state.conversation(CID).state_of("s2") is SubmissionState.READY


def _settled(call_id: str, result: str) -> ToolCallSettled:
    result_json = canonical_json(result)
    return ToolCallSettled(
        submission_id="s1",
        attempt_id="a1",
        call_id=call_id,
        result_json=result_json,
        result_digest=json_digest(result_json),
    )


def test_a_record_of_several_tool_settlements_is_split_one_event_per_decision_each_result_kept() -> None:
    """The shared settlement record of parallel calls (issue 25): each call's result that fits alone is kept."""
    events = tuple(_settled(f"call-{i}", "x" * 10) for i in range(5))
    shared = Decision(CID, events, submission_id="s1", call_tools=tuple((f"call-{i}", "blob") for i in range(5)))

    out = LedgerDecider(partition=0, partition_count=1).poison(PartitionState(partition=0), [shared], REASON, T0)

    assert [d.events for d in out] == [(e,) for e in events]
    assert all(d.submission_id == "s1" and not d.inputs for d in out)


def test_one_tool_settlement_too_large_alone_becomes_the_calls_error_naming_tool_size_and_limit() -> None:
    big = _settled("call-1", "x" * 3_000_000)
    alone = Decision(CID, (big,), submission_id="s1", call_tools=(("call-1", "blob"),))

    (out,) = LedgerDecider(partition=0, partition_count=1).poison(PartitionState(partition=0), [alone], REASON, T0)

    (replaced,) = out.events
    assert isinstance(replaced, ToolCallSettled) and replaced.call_id == "call-1"
    assert replaced.result_json is None and replaced.result_digest == big.result_digest
    assert replaced.error is not None and replaced.error.type == RESULT_TOO_LARGE and replaced.error.non_retryable
    assert "'blob'" in replaced.error.message and "3000002 bytes" in replaced.error.message, replaced.error.message
    assert REASON in replaced.error.message
