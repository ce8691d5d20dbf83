"""The submission state table (docs/semantics.md §3, §13; docs/design.md §5): the table itself, cited edge by edge."""

from __future__ import annotations

from collections import deque

from settled.protocol import EDGES, TERMINAL_STATES, SubmissionState, edges_from, find_edge
from settled.schemas import (
    RecoveryDecision,
    RecoveryDecisionKind,
    ResolutionKind,
    Settlement,
    SettlementOutcome,
    SubmissionsJoined,
    UnknownResolved,
)

from ._sim import T0

S = SubmissionState

# (source, target, cause type names, qualifiers, origin): the table, written out. A change to the machine must
# change this list: the tests below and the property test cite it.
EXPECTED = {
    (S.PROPOSED, S.ADMITTED, ("SubmissionAdmitted",), (), "docs/semantics.md §3"),
    (S.ADMITTED, S.READY, ("SubmissionReady",), (), "docs/semantics.md §3"),
    (S.READY, S.RUNNING, ("AttemptStarted",), (), "docs/semantics.md §3"),
    (S.READY, S.JOINING, ("SubmissionsJoined",), (), "docs/semantics.md §3, §5"),
    (S.JOINING, S.JOINED, ("SubmissionsJoined",), (), "docs/semantics.md §3, §5"),
    (S.JOINED, S.COMPLETED, ("Settlement",), ("completed",), "docs/semantics.md §3, §5"),
    (S.JOINED, S.FAILED, ("Settlement",), ("failed",), "docs/semantics.md §3, §5"),
    (S.JOINED, S.ABORTED, ("Settlement",), ("aborted",), "docs/semantics.md §3, §5"),
    (S.RUNNING, S.TERMINALIZING, ("Settlement",), (), "docs/semantics.md §3, §12"),
    (S.TERMINALIZING, S.COMPLETED, ("Settlement",), ("completed",), "docs/semantics.md §3, §12"),
    (S.TERMINALIZING, S.FAILED, ("Settlement",), ("failed",), "docs/semantics.md §3, §12"),
    (S.TERMINALIZING, S.ABORTED, ("Settlement",), ("aborted",), "docs/semantics.md §3, §12"),
    (S.RUNNING, S.READY, ("AttemptInterrupted",), (), "docs/semantics.md §3"),
    (
        S.RUNNING,
        S.RECOVERY,
        ("OwnershipClaimed", "AttemptInterrupted", "ToolCallUnknown"),
        (),
        "docs/semantics.md §3; docs/design.md §5",
    ),
    (S.RECOVERY, S.READY, ("RecoveryDecision",), ("reconcile", "resume", "safe_retry"), "docs/semantics.md §3, §14"),
    (S.RECOVERY, S.TERMINALIZING, ("RecoveryDecision",), ("terminalize",), "docs/semantics.md §3"),
    (S.RECOVERY, S.UNKNOWN, ("RecoveryDecision",), ("unknown",), "docs/semantics.md §3"),
    (S.UNKNOWN, S.TERMINALIZING, ("UnknownResolved",), ("outcome_for_submission",), "docs/semantics.md §3"),
    (S.UNKNOWN, S.READY, ("UnknownResolved",), ("call_outcome",), "docs/design.md §5"),
    (S.UNKNOWN, S.READY, ("UnknownResolved",), ("safe_to_retry",), "docs/design.md §5"),
    (S.READY, S.TERMINALIZING, ("Settlement",), ("aborted",), "docs/semantics.md §13"),
    (S.ADMITTED, S.TERMINALIZING, ("Settlement",), ("aborted",), "docs/semantics.md §13"),
    (S.RUNNING, S.WAITING, ("WaitRequested",), (), "issue 16"),
    (S.WAITING, S.READY, ("WaitResolved",), (), "issue 16"),
    (S.WAITING, S.TERMINALIZING, ("Settlement",), ("aborted",), "issue 16; docs/semantics.md §13"),
    (S.READY, S.WAITING, ("WaitRequested",), (), "issue 22"),
}


def _row(edge: object) -> tuple[object, ...]:
    from settled.protocol import Edge

    assert isinstance(edge, Edge)
    return (
        edge.source,
        edge.target,
        tuple(cause.__name__ for cause in edge.causes),
        tuple(sorted(edge.qualifiers)),
        edge.origin,
    )


def test_the_table_is_exactly_the_specs_edges_plus_the_documented_additions() -> None:
    rows = [_row(edge) for edge in EDGES]
    assert len(rows) == len(set(rows)), "an edge is listed twice"
    assert set(rows) == EXPECTED


def test_design_adds_two_unknown_to_ready_edges_told_apart_by_the_resolution_kind() -> None:
    def resolved(kind: ResolutionKind) -> UnknownResolved:
        return UnknownResolved(
            command_id="r",
            submission_id="s",
            call_id="k",
            kind=kind,
            result_json="1" if kind is ResolutionKind.CALL_OUTCOME else None,
            result_digest=None
            if kind is not ResolutionKind.CALL_OUTCOME
            else "6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b",
            principal="op",
            key_id="key",
        )

    by_call = find_edge(S.UNKNOWN, S.READY, resolved(ResolutionKind.CALL_OUTCOME))
    by_retry = find_edge(S.UNKNOWN, S.READY, resolved(ResolutionKind.SAFE_TO_RETRY))
    assert by_call is not None and by_call.label == "resolved with the call's outcome"
    assert by_retry is not None and by_retry.label == "resolved as safe to retry"
    assert find_edge(S.UNKNOWN, S.READY, resolved(ResolutionKind.OUTCOME_FOR_SUBMISSION)) is None
    outcome = resolved(ResolutionKind.OUTCOME_FOR_SUBMISSION).model_copy(update={"outcome": SettlementOutcome.FAILED})
    assert find_edge(S.UNKNOWN, S.TERMINALIZING, outcome) is not None


def test_terminal_states_have_no_way_out() -> None:
    for state in TERMINAL_STATES:
        assert edges_from(state) == ()


def test_an_event_takes_at_most_one_edge_between_two_states() -> None:
    for edge in EDGES:
        siblings = [other for other in EDGES if other.source is edge.source and other.target is edge.target]
        for other in siblings:
            if other is edge:
                continue
            overlap = set(edge.causes) & set(other.causes)
            assert not overlap or (edge.qualifiers and other.qualifiers and not edge.qualifiers & other.qualifiers), (
                f"ambiguous edges: {edge} / {other}"
            )


def test_every_state_is_reachable_from_proposed_and_every_nonterminal_state_can_end() -> None:
    seen = {S.PROPOSED}
    todo = deque([S.PROPOSED])
    while todo:
        for edge in edges_from(todo.popleft()):
            if edge.target not in seen:
                seen.add(edge.target)
                todo.append(edge.target)
    assert seen == set(S)
    for state in set(S) - TERMINAL_STATES:
        frontier, reached = deque([state]), {state}
        while frontier:
            for edge in edges_from(frontier.popleft()):
                if edge.target not in reached:
                    reached.add(edge.target)
                    frontier.append(edge.target)
        assert reached & TERMINAL_STATES, f"{state} can never settle"


def test_every_edge_has_a_cause_the_join_edges_included() -> None:
    assert [edge for edge in EDGES if not edge.causes] == []
    joined = SubmissionsJoined(submission_id="h", attempt_id="a", response_ordinal=0, joined_ids=("s",))
    assert find_edge(S.READY, S.JOINING, joined) is not None
    assert find_edge(S.JOINING, S.JOINED, joined) is not None
    assert find_edge(S.READY, S.RUNNING, joined) is None


def test_inactive_abort_edges_accept_only_an_aborted_settlement() -> None:
    def settlement(outcome: SettlementOutcome) -> Settlement:
        return Settlement(submission_id="s", outcome=outcome, attempt_count=0, settled_at=T0)

    for source in (S.ADMITTED, S.READY):
        assert find_edge(source, S.TERMINALIZING, settlement(SettlementOutcome.ABORTED)) is not None
        assert find_edge(source, S.TERMINALIZING, settlement(SettlementOutcome.COMPLETED)) is None
        assert find_edge(source, S.TERMINALIZING, settlement(SettlementOutcome.FAILED)) is None


def test_recovery_decisions_map_to_the_specs_three_exits() -> None:
    def decision(kind: RecoveryDecisionKind) -> RecoveryDecision:
        return RecoveryDecision(submission_id="s", decision=kind, reason="r", call_ids=())

    exits = {
        kind: [edge.target for edge in edges_from(S.RECOVERY) if edge.admits(decision(kind))]
        for kind in RecoveryDecisionKind
    }
    assert exits == {
        RecoveryDecisionKind.RESUME: [S.READY],
        RecoveryDecisionKind.SAFE_RETRY: [S.READY],
        RecoveryDecisionKind.RECONCILE: [S.READY],
        RecoveryDecisionKind.TERMINALIZE: [S.TERMINALIZING],
        RecoveryDecisionKind.UNKNOWN: [S.UNKNOWN],
    }
