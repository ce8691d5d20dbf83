"""Where a flow run is, read from a conversation's transcript (issue 18 item 2; `settled.protocol.flow_run_view`)."""

from __future__ import annotations

from settled.protocol import (
    TranscriptEntry,
    flow_input,
    flow_operator_input,
    flow_resume_input,
    flow_run_id_for,
    flow_run_view,
)
from settled.schemas import canonical_json

RUN = flow_run_id_for("c1", "s1")


def entry(sid: str, kind: str, content: object, name: str | None = None, call_id: str | None = None) -> TranscriptEntry:
    return TranscriptEntry(sid, kind, name, call_id, content if isinstance(content, str) else canonical_json(content))


def node(sid: str, node_id: str) -> TranscriptEntry:
    return entry(sid, "step", {"flow": "refund", "node": node_id, "run_id": RUN}, name=f"flow:{node_id}")


OPENED = [
    entry("s1", "input", flow_input("refund", "hi")),
    node("s1", "ask"),
    entry("s1", "reply", {"status": "waiting", "node": "ask", "ask": "How much?", "missing": ["amount"]}),
    entry("x1", "input", "an ordinary turn of the same conversation"),
]


def test_a_parked_run_waits_for_input_and_a_later_turn_waiting_for_an_approval_is_shown() -> None:
    view = flow_run_view("c1", RUN, OPENED)
    assert view is not None
    assert (view.flow, view.status, view.node, view.submission_ids) == ("refund", "waiting", "ask", ("s1",))
    assert view.waiting_for == {"kind": "input", "node": "ask", "ask": "How much?", "missing": ["amount"]}
    later = [
        *OPENED,
        entry("s2", "input", flow_resume_input(RUN, {"amount": 3})),
        node("s2", "ask"),
        node("s2", "pay"),
        entry("s2", "wait", {"kind": "approval", "name": "Pay 3?"}, name="Pay 3?", call_id="s2#w4"),
    ]
    view = flow_run_view("c1", RUN, later)
    assert view is not None and (view.status, view.node) == ("waiting", "pay")
    assert view.waiting_for == {"kind": "approval", "name": "Pay 3?", "wait_id": "s2#w4"}
    decided = [*later, entry("s2", "wait_resolved", {"outcome": "approved"}, call_id="s2#w4")]
    view = flow_run_view("c1", RUN, decided)
    assert view is not None and (view.status, view.waiting_for) == ("running", None)


def test_a_handoff_completes_the_run_a_failed_turn_fails_it_and_an_unknown_run_is_none() -> None:
    handed = [*OPENED, entry("s2", "input", flow_resume_input(RUN, {})), entry("s2", "reply", {"handoff": "human"})]
    view = flow_run_view("c1", RUN, handed)
    assert view is not None and (view.status, view.outcome) == ("completed", "handoff:human")
    failed = [*OPENED, entry("s2", "input", flow_resume_input(RUN, {})), entry("s2", "settlement", "failed: X: y")]
    view = flow_run_view("c1", RUN, failed)
    assert view is not None and view.status == "failed"
    assert flow_run_view("c1", "fr-invented", OPENED) is None
    assert flow_run_view("c2", RUN, OPENED) is None, "a run id names a run of one conversation"


def test_an_abandoned_run_and_a_restarted_one_with_its_new_run() -> None:
    abandoned = [*OPENED, entry("s2", "input", flow_operator_input(RUN, "abandon"))]
    view = flow_run_view("c1", RUN, abandoned)
    assert view is not None and (view.status, view.submission_ids) == ("abandoned", ("s1",))
    restarted = [
        *OPENED,
        entry("s2", "input", flow_operator_input(RUN, "restart")),
        node("s2", "ask"),
        entry("s2", "reply", {"status": "waiting", "node": "ask", "ask": "How much?", "missing": ["amount"]}),
    ]
    view = flow_run_view("c1", RUN, restarted)
    assert view is not None and view.status == "restarted"
    new = flow_run_view("c1", flow_run_id_for("c1", "s2"), restarted)
    assert new is not None
    assert (new.flow, new.status, new.node, new.submission_ids) == ("refund", "waiting", "ask", ("s2",))
