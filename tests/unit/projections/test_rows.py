"""The projection's rows as a pure function of the log (issue 7 item 2): no Kafka, no Postgres."""

from __future__ import annotations

import enum
import random
import re
from datetime import timedelta
from typing import Any

import pytest

from settled.projections import (
    TABLES,
    DuplicateRowError,
    MergeRule,
    ProjectionState,
    RowSet,
    TableMode,
    fold_reference,
    merge_rows,
    migrations,
    project_batch,
)
from settled.protocol import PartitionState, admit, fold, join, start_attempt, terminalize
from settled.schemas import (
    LOG_EVENT_TYPES,
    AccessGranted,
    AccessLevel,
    AccessRevoked,
    ApprovalDecided,
    AttemptInterrupted,
    Codec,
    CommandKind,
    CommandRejected,
    CommandRejectReason,
    DeltaKind,
    EffectKind,
    EffectRecorded,
    FastBatchDecoder,
    InputQuarantined,
    InputRef,
    LanePolicy,
    LaneSet,
    LogBatch,
    ModelResponseDelta,
    ModelResponseInterrupted,
    QuarantineReason,
    SettlementOutcome,
    SignalReceived,
    SteeringDelivered,
    SteeringReceived,
    StepRetryScheduled,
    SubmissionRetryScheduled,
    SubmissionsJoined,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
)
from tests.integration.projection_script import CHECKPOINT, T0, script_log
from tests.unit.protocol._sim import Log, proposal


def _project(batches: list[LogBatch], rows: RowSet | None = None) -> tuple[ProjectionState, RowSet]:
    rows = RowSet() if rows is None else rows
    state = ProjectionState.empty(0)
    for offset, batch in enumerate(batches):
        state = project_batch(state, batch, offset, rows)
    return state, rows


def _table(rows: RowSet, name: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    spec = TABLES[name]
    return {key: dict(zip(spec.columns, row, strict=True)) for key, row in rows.tables[name].items()}


def test_the_unknown_obligation_is_visible_at_the_checkpoint() -> None:
    _, rows = _project(script_log()[:CHECKPOINT])
    calls = _table(rows, "tool_calls")
    assert calls[("conv-tools", "s1", "D")]["status"] == "unknown"
    assert calls[("conv-tools", "s1", "D")]["unknown_since"] == T0 + timedelta(seconds=11)
    assert calls[("conv-tools", "s1", "A")]["status"] == "settled"
    assert calls[("conv-tools", "s1", "A")]["duration_ms"] == 1000
    assert calls[("conv-tools", "s1", "B")]["status"] == "error"
    assert calls[("conv-tools", "s1", "B")]["error_type"] == "Declined"
    assert calls[("conv-tools", "s1", "C")]["status"] == "refused"
    subs = _table(rows, "submissions")
    assert subs[("conv-tools", "s1")]["state"] == "unknown"
    assert subs[("conv-tools", "s1")]["unknown_calls"] == 1
    assert subs[("conv-tools", "s2")]["state"] == "ready"
    conv = _table(rows, "conversations")[("conv-tools",)]
    assert (conv["blocked_by_unknown"], conv["queue_depth"], conv["active_submission_id"]) == (True, 2, "s1")
    attempt = _table(rows, "attempts")[("conv-tools", "a1")]
    assert (attempt["status"], attempt["waiting_kind"], attempt["waiting_name"]) == ("waiting", "unknown",
                                                                                      "pay")  # fmt: skip
    assert attempt["ended_at"] == T0 + timedelta(seconds=11)  # left running when D went into doubt
    receipts = _table(rows, "receipts")
    assert receipts[("conv-tools", "dup-s1")]["outcome"] == "duplicate"
    assert receipts[("conv-tools", "dup-s1")]["submission_id"] == "s1"
    assert receipts[("conv-tools", "dup-s1")]["submission_seq"] == 1
    assert receipts[("conv-tools", "rej-s1")]["outcome"] == "rejected"
    assert "idempotency_conflict" in receipts[("conv-tools", "rej-s1")]["reason"]


def test_the_whole_script_settles_everything_and_keeps_the_history() -> None:
    _, rows = _project(script_log())
    subs = _table(rows, "submissions")
    assert {k[1]: v["state"] for k, v in subs.items()} == {"s1": "completed", "s2": "aborted", "s3": "completed"}
    assert subs[("conv-tools", "s1")]["attempt_count"] == 2
    # kept though the fold drops it when settled
    assert subs[("conv-tools", "s1")]["tools_offered"] == ["search", "pay", "fly"]
    assert subs[("conv-tools", "s1")]["admitted_at"] == T0 + timedelta(seconds=2)
    assert subs[("conv-tools", "s1")]["first_started_at"] == T0 + timedelta(seconds=4)
    attempts = {k[1]: v["status"] for k, v in _table(rows, "attempts").items()}
    assert attempts == {"a1": "interrupted", "a2": "completed", "a3": "interrupted", "a4": "completed"}
    a3 = _table(rows, "attempts")[("conv-claimed", "a3")]
    assert "owner epoch 2 claimed by worker-b" in a3["end_reason"]
    calls = _table(rows, "tool_calls")
    assert calls[("conv-tools", "s1", "D")]["status"] == "settled"
    assert calls[("conv-tools", "s1", "D")]["attempt_id"] == "a2"
    assert not [c for c in calls.values() if c["status"] == "unknown"]
    kinds = [r[4] for r in sorted(rows.tables["transcript"].values()) if r[0] == "conv-tools"]
    assert kinds == ["input", "input", "model_response", "tool_call", "tool_result", "tool_call", "tool_result",
                     "tool_refused", "tool_call", "tool_unknown", "abort", "settlement", "resolution", "tool_call",
                     "tool_result", "step", "reply"]  # fmt: skip
    assert {k[1]: v["outcome"] for k, v in _table(rows, "settlements").items()} == {
        "s1": "completed", "s2": "aborted", "s3": "completed"}  # fmt: skip
    partitions = _table(rows, "partitions")[(0,)]
    assert (partitions["claim_epoch"], partitions["claimed_by"], partitions["partition_count"]) == (2, "worker-b", 1)
    conv = _table(rows, "conversations")
    assert all(c["queue_depth"] == 0 and not c["blocked_by_unknown"] for c in conv.values())
    assert all(c["owner_epoch"] == 2 for c in conv.values())


def test_rows_do_not_depend_on_how_the_log_is_cut_into_chunks() -> None:
    """Merging chunk by chunk (as the database does, one upsert per chunk) gives the rows of one pass."""
    batches = script_log()
    _, whole = _project(batches)
    for seed in range(20):
        rng = random.Random(seed)
        db: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]] = {name: {} for name in TABLES}
        state = ProjectionState.empty(0)
        offset = 0
        while offset < len(batches):
            size = rng.randint(1, 6)
            chunk = RowSet()
            for i in range(offset, min(offset + size, len(batches))):
                state = project_batch(state, batches[i], i, chunk)
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


def test_fold_columns_equal_the_protocol_fold() -> None:
    batches = script_log()
    _, rows = _project(batches)
    reference = fold_reference(fold(PartitionState(partition=0), batches))
    for name, by_key in reference.items():
        table = _table(rows, name)
        assert set(by_key) == set(table), name
        for key, values in by_key.items():
            assert {c: table[key][c] for c in values} == values, (name, key)


def test_a_batch_applied_twice_is_refused() -> None:
    batches = script_log()
    state, rows = _project(batches[:4])
    with pytest.raises(DuplicateRowError, match="transcript"):
        project_batch(ProjectionState.from_fold(fold(PartitionState(partition=0), batches[:2])), batches[2], 2, rows)
    assert state.fold.claim_epoch == 1


def test_merge_rules() -> None:
    spec = TABLES["submissions"]
    assert spec.rule("admitted_at") is MergeRule.STICKY
    assert spec.rule("state") is MergeRule.OVERWRITE
    attempts = TABLES["attempts"]
    assert attempts.rule("current_step") is MergeRule.LATEST
    old = tuple("old" if c in ("status", "started_at", "current_step") else None for c in attempts.columns)
    new = tuple("new" if c in ("status", "started_at") else None for c in attempts.columns)
    merged = dict(zip(attempts.columns, merge_rows(attempts, old, new), strict=True))
    assert (merged["status"], merged["started_at"], merged["current_step"]) == ("new", "old", "old")


def test_the_migrations_create_exactly_the_tables_columns() -> None:
    text = "\n".join(m.text for m in migrations())
    for spec in TABLES.values():
        assert f"CREATE TABLE {spec.name} (" in text
        block = text.split(f"CREATE TABLE {spec.name} (")[1].split(");")[0]
        columns = [line.split()[0] for line in block.splitlines() if line.strip() and not line.strip().startswith(
            ("PRIMARY", "UNIQUE", "--"))]  # fmt: skip
        # A later layout's added columns come last, in migration order (layout 9: submissions.retry_of).
        columns += re.findall(rf"^ALTER TABLE {spec.name} ADD COLUMN (\w+)", text, flags=re.MULTILINE)
        assert columns == list(spec.columns), spec.name


def test_a_dropped_working_copy_leaves_the_committed_state_as_it_was() -> None:
    """A chunk whose transaction rolls back is dropped; replaying it from the committed state gives the same rows."""
    batches = script_log()
    committed = ProjectionState.empty(0)
    for offset, batch in enumerate(batches[:10]):
        committed = project_batch(committed.working(), batch, offset, RowSet()).commit()
    dropped = committed.working()
    for offset in range(10, 16):
        dropped = project_batch(dropped, batches[offset], offset, RowSet())
    assert committed.fold == fold(PartitionState(partition=0), batches[:10])
    again = committed.working()
    for offset in range(10, len(batches)):
        again = project_batch(again, batches[offset], offset, RowSet())
    assert again.commit().fold == fold(PartitionState(partition=0), batches)


def test_the_fast_decoder_builds_the_validated_models_of_every_log_event_type() -> None:
    codec = Codec()
    fast = FastBatchDecoder(codec)
    batches = [*script_log(), _other_event_types()]
    seen = {type(e) for b in batches for e in b.events}
    assert seen == set(LOG_EVENT_TYPES), f"not covered: {set(LOG_EVENT_TYPES) - seen}"
    for offset, batch in enumerate(batches):
        value = codec.encode(batch)
        validated = codec.decode_batch(value, offset=offset).batch
        built = fast.decode(value, topic="t", partition=0, offset=offset)
        assert built == validated
        assert [type(e) for e in built.events] == [type(e) for e in validated.events]
        assert [
            getattr(e, f) is getattr(v, f)
            for e, v in zip(built.events, validated.events, strict=True)
            for f in type(e).model_fields
            if isinstance(getattr(v, f), enum.Enum)
        ] == [True] * sum(isinstance(getattr(v, f), enum.Enum) for v in validated.events for f in type(v).model_fields)


def _other_event_types() -> LogBatch:
    """The log event types the script does not use, in one (unfolded) batch."""
    ref = InputRef(topic="t.inbox", partition=0, offset=7)
    return LogBatch.seal(
        conversation_id="conv-other", batch_id="conv-other:1", first_event_seq=1, owner_epoch=1,
        prev_batch_digest=None, recorded_at=T0,
        events=[
            ModelResponseDelta(submission_id="s", attempt_id="a", response_ordinal=0, delta_index=0,
                               kind=DeltaKind.TEXT, text="he"),
            EffectRecorded(submission_id="s", attempt_id="a", kind=EffectKind.NOW, ordinal=0, value="2026"),
            InputQuarantined(reason=QuarantineReason.TRUNCATED, detail="short", raw_size_bytes=3, input_ref=ref),
            CommandRejected(command_id="c", command_kind=CommandKind.ABORT, submission_id="s",
                            reason=CommandRejectReason.ALREADY_TERMINAL, detail="settled",
                            winning_outcome=SettlementOutcome.COMPLETED, input_ref=ref),
            AttemptInterrupted(submission_id="s", attempt_id="a", reason="revoked"),
            WaitRequested(submission_id="s", attempt_id="a", wait_id="s#w3", kind=WaitKind.SIGNAL, name="paid",
                          ordinal=3, deadline=T0, details_json='{"note":"x"}'),
            WaitResolved(submission_id="s", wait_id="s#w3", outcome=WaitOutcome.DELIVERED, source_id="sig-1",
                         payload_json='{"ok":true}', decided_at=T0),
            SignalReceived(command_id="sig-1", submission_id="s", name="paid", payload_json="1", principal="p",
                           input_ref=ref),
            ApprovalDecided(command_id="ap-1", submission_id="s", approval_id="s#w4", approved=False,
                            args_digest="a" * 64, principal="p", key_id="ops-1", reason="no", input_ref=ref),
            ModelResponseInterrupted(submission_id="s", attempt_id="a", response_ordinal=0, provider="openai",
                                     model="m", operation_id="op", first_delta_index=0, delta_count=1,
                                     output_chars=2, usage=None, error="cut"),
            StepRetryScheduled(submission_id="s", attempt_id="a", step="save", retry=1, ordinal=5,
                               error_type="ValueError", error_message="no", wake_at=T0, wait_id="s#w5"),
            AccessGranted(command_id="g-1", grantee="bob", access=AccessLevel.READ, principal="p", input_ref=ref),
            AccessRevoked(command_id="r-1", grantee="bob", principal="p", input_ref=ref),
            SubmissionRetryScheduled(submission_id="s", attempt_id="a", retry=1, cause="WorkerDied: gone",
                                     backoff_ms=1_000, wake_at=T0, wait_id="s#retry1"),
            SteeringReceived(command_id="st-1", submission_id="s", text="shorter, please", principal="p",
                             input_ref=ref),
            SteeringDelivered(submission_id="s", attempt_id="a", response_ordinal=0, command_ids=("st-1",)),
            LaneSet(command_id="l-1", principal="p", lane=LanePolicy.REJECT, input_ref=ref),
            SubmissionsJoined(submission_id="s", attempt_id="a", response_ordinal=1, joined_ids=("s2", "s3")),
        ],
    )  # fmt: skip


def test_a_joined_submission_shows_its_host_in_the_transcript() -> None:
    log = Log()
    log.claim()
    for n, sid in enumerate(("A", "B"), 1):
        conv = log.state.conversation("c1")
        log.commit("c1", admit(conv, proposal(sid, f"k{n}"), log.ref(), T0, default_lane=LanePolicy.JOIN))
    log.commit("c1", start_attempt(log.state.conversation("c1"), "A", "a1", log.epoch))
    joined = join(log.state.conversation("c1"), "A", "a1", 0)
    assert joined is not None
    log.commit("c1", joined)
    log.commit("c1", terminalize(log.state.conversation("c1"), "A", SettlementOutcome.COMPLETED, T0, reply_json="1"))
    _, rows = _project(log.batches)
    assert {k[1]: v["state"] for k, v in _table(rows, "submissions").items()} == {"A": "completed", "B": "completed"}
    lines = [(r[2], r[4], r[8]) for r in sorted(rows.tables["transcript"].values()) if r[0] == "c1"]
    assert ("A", "joined", '{"joined":["B"],"response_ordinal":0}') in lines
    assert lines[-2:] == [("A", "reply", "1"), ("B", "settlement", "completed: settled with its host A")]
