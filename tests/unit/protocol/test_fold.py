"""The fold (docs/design.md §1b, §3): totality, epochs, the chain, illegal transitions, copy-on-write, restore."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

import pytest

from settled.protocol import (
    EDGES,
    ConversationState,
    IllegalTransitionError,
    LogInconsistencyError,
    PartitionState,
    StaleEpochError,
    SubmissionState,
    abort,
    admit,
    apply,
    fold,
    start_attempt,
    terminalize,
)
from settled.protocol._fold import _RULES, PARTITION_EVENT_TYPES
from settled.schemas import (
    LOG_EVENT_TYPES,
    AttemptStarted,
    ChainBreakError,
    Genesis,
    InputApplied,
    OwnershipClaimed,
    RecoveryDecision,
    RecoveryDecisionKind,
    Settlement,
    SettlementOutcome,
    StepRecorded,
    SubmissionAdmitted,
    json_digest,
)

from ._sim import PARTITION_CID, T0, Log, abort_cmd, proposal

S = SubmissionState


@pytest.fixture
def log() -> Log:
    log = Log()
    log.claim()
    return log


def admitted(log: Log, sid: str, key: str, cid: str = "c1") -> None:
    log.commit(cid, admit(log.state.conversation(cid), proposal(sid, key, conversation_id=cid), log.ref(), T0))


def started(log: Log, sid: str, cid: str = "c1", attempt_id: str = "a1") -> None:
    log.commit(cid, start_attempt(log.state.conversation(cid), sid, attempt_id, log.epoch))


def test_the_fold_has_a_rule_for_every_log_event_type() -> None:
    assert set(_RULES) | set(PARTITION_EVENT_TYPES) == set(LOG_EVENT_TYPES)


def test_admission_takes_the_first_two_edges(log: Log) -> None:
    decision = admit(log.state.conversation("c1"), proposal("s1", "k1"), log.ref(), T0)
    trace = log.commit("c1", decision)
    assert [(t.submission_id, t.edge.source, t.edge.target) for t in trace] == [
        ("s1", S.PROPOSED, S.ADMITTED),
        ("s1", S.ADMITTED, S.READY),
    ]
    assert all(t.edge in EDGES for t in trace)
    conv = log.state.conversation("c1")
    assert conv.queue == ("s1",) and conv.lookup_key("alice", "k1") is not None
    assert (conv.last_event_seq, conv.last_batch_digest) == (2, log.batches[-1].batch_digest)


# -------------------------------------------------------------------------------------------------- epochs


def test_a_batch_below_the_latest_claim_is_refused_as_stale(log: Log) -> None:
    admitted(log, "s1", "k1")
    log.claim("w2")
    late = admit(log.state.conversation("c1"), proposal("s2", "k2"), log.ref(), T0)
    with pytest.raises(StaleEpochError) as info:
        log.append("c1", late.events, epoch=1)
    assert (info.value.batch_epoch, info.value.claim_epoch, info.value.conversation_id) == (1, 2, "c1")


def test_a_claim_must_raise_the_epoch(log: Log) -> None:
    same = OwnershipClaimed(partition=0, owner_epoch=1, worker_id="w2", claimed_at=T0)
    with pytest.raises(StaleEpochError):
        log.append(PARTITION_CID, [same], epoch=1)


def test_a_batch_at_an_epoch_that_was_never_claimed_is_refused(log: Log) -> None:
    decision = admit(log.state.conversation("c1"), proposal("s1", "k1"), log.ref(), T0)
    with pytest.raises(StaleEpochError):
        log.append("c1", decision.events, epoch=5)


def test_a_claim_of_another_partition_is_refused(log: Log) -> None:
    other = OwnershipClaimed(partition=7, owner_epoch=2, worker_id="w2", claimed_at=T0)
    with pytest.raises(LogInconsistencyError):
        log.append(PARTITION_CID, [other], epoch=2)


def test_a_claim_moves_every_running_attempt_of_the_partition_to_recovery(log: Log) -> None:
    admitted(log, "s1", "k1", "c1")
    admitted(log, "t1", "k1", "c2")
    admitted(log, "t2", "k2", "c2")
    started(log, "s1", "c1")
    started(log, "t1", "c2")
    trace = log.claim("w2")
    assert sorted((t.conversation_id, t.submission_id, t.edge.target) for t in trace) == [
        ("c1", "s1", S.RECOVERY),
        ("c2", "t1", S.RECOVERY),
    ]
    assert all(t.edge.label.startswith("worker disappears") for t in trace)
    assert log.state.conversation("c2").state_of("t2") is S.READY
    assert log.state.conversation("c1").owner_epoch == 2 and log.state.claimed_by == "w2"


def test_genesis_fixes_the_partition_count_once() -> None:
    log = Log()
    log.append(PARTITION_CID, [Genesis(namespace="ns", partition_count=12, created_at=T0)])
    assert log.state.partition_count == 12
    with pytest.raises(LogInconsistencyError):
        log.append(PARTITION_CID, [Genesis(namespace="ns", partition_count=24, created_at=T0)])


# --------------------------------------------------------------------------------------------------- chain


def test_a_batch_that_skips_event_sequences_or_links_elsewhere_breaks_the_chain(log: Log) -> None:
    admitted(log, "s1", "k1")
    decision = admit(log.state.conversation("c1"), proposal("s2", "k2"), log.ref(), T0)
    good = log.seal("c1", decision.events)
    gap = good.model_copy(update={"first_event_seq": good.first_event_seq + 1})
    with pytest.raises(ChainBreakError) as info:
        apply(log.state, gap)
    assert info.value.field == "first_event_seq"
    relinked = good.model_copy(update={"prev_batch_digest": "f" * 64})
    with pytest.raises(ChainBreakError) as info:
        apply(log.state, relinked)
    assert info.value.field == "prev_batch_digest"


# ------------------------------------------------------------------------------------------ illegal events


def test_a_second_settlement_is_an_illegal_transition(log: Log) -> None:
    admitted(log, "s1", "k1")
    started(log, "s1")
    decision = terminalize(log.state.conversation("c1"), "s1", SettlementOutcome.COMPLETED, T0)
    log.commit("c1", decision)
    with pytest.raises(IllegalTransitionError) as info:
        log.append("c1", [decision.events[0].model_copy(update={"outcome": SettlementOutcome.ABORTED})])
    err = info.value
    assert (err.submission_id, err.from_state, err.to_state, err.event) == ("s1", S.COMPLETED, S.ABORTED, "Settlement")
    assert "DUR-002" in str(err)


def test_starting_a_second_attempt_in_the_lane_is_illegal(log: Log) -> None:
    admitted(log, "s1", "k1")
    admitted(log, "s2", "k2")
    started(log, "s1")
    with pytest.raises(IllegalTransitionError, match="DUR-005"):
        log.append("c1", [AttemptStarted(submission_id="s2", attempt=1, attempt_id="b1", owner_epoch=log.epoch)])


def test_starting_out_of_fifo_order_is_illegal(log: Log) -> None:
    admitted(log, "s1", "k1")
    admitted(log, "s2", "k2")
    with pytest.raises(IllegalTransitionError, match="DUR-004"):
        log.append("c1", [AttemptStarted(submission_id="s2", attempt=1, attempt_id="b1", owner_epoch=log.epoch)])


def test_events_for_a_submission_that_was_never_admitted_are_illegal(log: Log) -> None:
    with pytest.raises(IllegalTransitionError) as info:
        log.append("c1", [AttemptStarted(submission_id="ghost", attempt=1, attempt_id="a", owner_epoch=log.epoch)])
    assert info.value.from_state is S.PROPOSED


def test_history_from_a_submission_that_is_not_running_is_illegal(log: Log) -> None:
    admitted(log, "s1", "k1")
    step = StepRecorded(
        submission_id="s1",
        attempt_id="a1",
        name="n",
        version=1,
        step_id="st",
        ordinal=0,
        result_json="1",
        result_digest=json_digest("1"),
    )
    with pytest.raises(IllegalTransitionError) as info:
        log.append("c1", [step])
    assert (info.value.from_state, info.value.to_state) == (S.READY, None)


def test_a_stale_attempt_cannot_append_history(log: Log) -> None:
    admitted(log, "s1", "k1")
    started(log, "s1", attempt_id="a1")
    with pytest.raises(LogInconsistencyError, match="attempt_id"):
        log.append("c1", [InputApplied(submission_id="s1", attempt_id="old", input_digest=json_digest('"hello"'))])


def test_after_an_abort_only_an_aborted_settlement_is_legal(log: Log) -> None:
    admitted(log, "s1", "k1")
    started(log, "s1")
    log.commit("c1", abort(log.state.conversation("c1"), abort_cmd("x", "s1"), log.ref(), T0))
    completed = Settlement(submission_id="s1", outcome=SettlementOutcome.COMPLETED, attempt_count=1, settled_at=T0)
    with pytest.raises(IllegalTransitionError, match="DUR-012"):
        log.append("c1", [completed])


def test_resuming_past_an_unknown_call_is_illegal(log: Log) -> None:
    admitted(log, "s1", "k1")
    started(log, "s1")
    log.claim("w2")
    decide = RecoveryDecision(submission_id="s1", decision=RecoveryDecisionKind.UNKNOWN, reason="r", call_ids=())
    with pytest.raises(LogInconsistencyError):
        log.append("c1", [decide])  # Unknown needs an Unknown call to resolve
    resume = decide.model_copy(update={"decision": RecoveryDecisionKind.RESUME})
    trace = log.append("c1", [resume])
    assert [(t.edge.source, t.edge.target) for t in trace] == [(S.RECOVERY, S.READY)]


# ------------------------------------------------------------------------------------------ inconsistencies


def test_an_input_decided_twice_is_an_inconsistent_log(log: Log) -> None:
    ref = log.ref()
    log.commit("c1", admit(log.state.conversation("c1"), proposal("s1", "k1"), ref, T0))
    again = admit(log.state.conversation("c2"), proposal("t1", "k1", conversation_id="c2"), ref, T0)
    log.commit("c2", again)  # another conversation: its own set (the worker skips by record key)
    dup = admit(log.state.conversation("c1"), proposal("s2", "k2"), log.ref(), T0)
    events = list(dup.events)
    assert isinstance(events[0], SubmissionAdmitted)
    events[0] = events[0].model_copy(update={"input_ref": ref})
    with pytest.raises(LogInconsistencyError, match="already decided"):
        log.append("c1", events)


def test_a_key_admitted_twice_is_an_inconsistent_log(log: Log) -> None:
    """The fault switch ``admission_without_key_index`` produces exactly this; the fold refuses it (DUR-001)."""
    admitted(log, "s1", "k1")
    forged = SubmissionAdmitted(
        submission_id="s2",
        conversation_id="c1",
        principal="alice",
        idempotency_key="k1",
        payload_digest="0" * 64,
        submission_seq=2,
        tools_offered=(),
        input_json='"x"',
        input_ref=log.ref(),
    )
    with pytest.raises(LogInconsistencyError, match="DUR-001"):
        log.append("c1", [forged])
    with pytest.raises(LogInconsistencyError, match="no gaps"):
        log.append("c1", [forged.model_copy(update={"idempotency_key": "k9", "submission_seq": 3})])


def test_an_attempt_number_that_skips_is_an_inconsistent_log(log: Log) -> None:
    admitted(log, "s1", "k1")
    with pytest.raises(LogInconsistencyError, match="attempt"):
        log.append("c1", [AttemptStarted(submission_id="s1", attempt=2, attempt_id="a", owner_epoch=log.epoch)])


# -------------------------------------------------------------------------------------- copy-on-write, restore


def test_apply_leaves_the_state_it_was_given_unchanged(log: Log) -> None:
    admitted(log, "s1", "k1")
    before = log.state
    snapshot = (dict(before.conversation("c1").submissions), dict(before.conversation("c1").key_index))
    admitted(log, "s2", "k2")
    started(log, "s1")
    assert (dict(before.conversation("c1").submissions), dict(before.conversation("c1").key_index)) == snapshot
    assert before.conversation("c1").state_of("s1") is S.READY and before.conversation("c1").submission("s2") is None


def test_a_failed_batch_changes_nothing(log: Log) -> None:
    admitted(log, "s1", "k1")
    before = log.state
    events = [
        *admit(log.state.conversation("c1"), proposal("s2", "k2"), log.ref(), T0).events,
        AttemptStarted(submission_id="s2", attempt=1, attempt_id="b", owner_epoch=log.epoch),  # not the head
    ]
    with pytest.raises(IllegalTransitionError):
        log.append("c1", events)
    assert log.state is before and before.conversation("c1").submission("s2") is None


def test_restore_by_fold_equals_the_state_built_batch_by_batch(log: Log) -> None:
    admitted(log, "s1", "k1")
    admitted(log, "s2", "k2")
    admitted(log, "t1", "k1", "c2")
    started(log, "s1")
    log.commit("c1", abort(log.state.conversation("c1"), abort_cmd("x", "s2"), log.ref(), T0))
    log.claim("w2")
    log.append(
        "c1", [RecoveryDecision(submission_id="s1", decision=RecoveryDecisionKind.RESUME, reason="r", call_ids=())]
    )
    started(log, "s1", attempt_id="a2")
    log.commit("c1", terminalize(log.state.conversation("c1"), "s1", SettlementOutcome.COMPLETED, T0))
    restored = fold(PartitionState(partition=0), log.batches)
    assert restored == log.state
    assert restored.conversation("c1").submission("s1") is not None
    assert restored.conversation("c1").state_of("s1") is S.COMPLETED
    assert restored.conversation("c1").submissions["s1"].attempt_count == 2


# -------------------------------------------------------------------------------------------- the conversation map


class _CountingMap(Mapping[str, ConversationState]):
    """A partition's conversation map that counts how often it is iterated (a copy iterates it)."""

    def __init__(self, items: dict[str, ConversationState]) -> None:
        self._items = items
        self.iterations = 0

    def __getitem__(self, key: str) -> ConversationState:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        self.iterations += 1
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def test_folding_a_batch_does_not_copy_the_partitions_other_conversations(log: Log) -> None:
    # Each batch used to copy the whole conversation map (O(conversations) of CPU per batch, for ever more
    # conversations over a worker's life): the others must be neither iterated nor copied.
    for i in range(3):
        admitted(log, f"s{i}", f"k{i}", f"c{i}")
    for i in range(3, 10):
        others = _CountingMap(dict(log.state.conversations))
        log.state = dataclasses.replace(log.state, conversations=others)
        admitted(log, f"s{i}", f"k{i}", f"c{i}")
        assert others.iterations == 0, f"fold {i}: the map was iterated {others.iterations} times"
        assert log.state.conversation(f"c{i}").state_of(f"s{i}") is S.READY
        assert [log.state.conversation(f"c{j}").state_of(f"s{j}") for j in range(i)] == [S.READY] * i


def test_the_conversation_map_after_many_folds_is_the_map_built_batch_by_batch(log: Log) -> None:
    for i in range(200):  # new conversations, and repeats of earlier ones, across several merges
        cid = f"c{i % 150}"
        admitted(log, f"s{i}", f"k{i}", cid)
        expected = fold(PartitionState(partition=0), log.batches).conversations
        got = log.state.conversations
        assert len(got) == len(expected) and list(got) == list(expected) and dict(got.items()) == dict(expected)
        assert cid in got and "nope" not in got and got.get("nope") is None and got[cid] == expected[cid]
    assert log.state == fold(PartitionState(partition=0), log.batches)
