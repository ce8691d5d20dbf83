"""Flow run addressing at admission (issue 18 item 2): the owner mints a run id for a turn that opens a run and the
receipt carries it; a turn naming a run id resumes it, outranking a flow name; an invented run id and another
conversation's get the same ``unknown_target`` rejection, its only records the rejection and its receipt."""

from __future__ import annotations

import pytest

from settled.protocol import admit, flow_input, flow_operator_input, flow_resume_input, flow_run_id_for
from settled.schemas import (
    ReceiptOutcome,
    SubmissionAdmitted,
    SubmissionDuplicate,
    SubmissionRejected,
    SubmissionRejectReason,
)

from ._sim import T0, Log, proposal


@pytest.fixture
def log() -> Log:
    log = Log()
    log.claim()
    return log


def opened(log: Log, sid: str = "s1", cid: str = "c1") -> str:
    """Admit a turn that opens a run of flow "refund"; return the run id its receipt carries."""
    decision = admit(log.state.conversation(cid), proposal(sid, f"k-{sid}", conversation_id=cid,
                     value=flow_input("refund", "hi")), log.ref(), T0)  # fmt: skip
    admitted = decision.events[0]
    assert isinstance(admitted, SubmissionAdmitted) and decision.receipt is not None
    assert admitted.flow_run_id == decision.receipt.run_id == flow_run_id_for(cid, sid)
    log.commit(cid, decision)
    return admitted.flow_run_id


def test_the_owner_mints_the_run_id_of_an_opening_turn_and_its_receipt_and_duplicate_carry_it(log: Log) -> None:
    run_id = opened(log)
    assert log.state.conversation("c1").flow_runs == {run_id: "s1"}
    again = admit(log.state.conversation("c1"), proposal("s1b", "k-s1", value=flow_input("refund", "hi")),
                  log.ref(), T0)  # fmt: skip
    assert isinstance(again.events[0], SubmissionDuplicate) and again.receipt is not None
    assert (again.receipt.outcome, again.receipt.run_id) == (ReceiptOutcome.DUPLICATE, run_id)
    plain = admit(log.state.conversation("c1"), proposal("s2", "k-s2", value="hello"), log.ref(), T0)
    assert plain.receipt is not None and plain.receipt.run_id is None
    assert isinstance(plain.events[0], SubmissionAdmitted) and plain.events[0].flow_run_id is None


def test_a_run_id_resumes_the_run_outranks_a_flow_name_and_mints_nothing(log: Log) -> None:
    run_id = opened(log)
    envelope = {"settled_flow": {"name": "other", "run_id": run_id}, "input": {"amount": 3}}
    decision = admit(log.state.conversation("c1"), proposal("s2", "k-s2", value=envelope), log.ref(), T0)
    admitted = decision.events[0]
    assert isinstance(admitted, SubmissionAdmitted) and decision.receipt is not None
    assert admitted.flow_run_id == decision.receipt.run_id == run_id
    log.commit("c1", decision)
    assert log.state.conversation("c1").flow_runs == {run_id: "s1"}, "no run minted"


def test_an_invented_run_id_and_another_conversations_get_the_same_unknown_target(log: Log) -> None:
    theirs = opened(log, "s1", cid="c2")
    answers = []
    for run_id in ("fr-invented", theirs):
        ref = log.ref()
        decision = admit(log.state.conversation("c1"), proposal(f"s-{run_id}", f"k-{run_id}",
                         value=flow_resume_input(run_id, {})), ref, T0)  # fmt: skip
        (rejected,) = decision.events
        assert isinstance(rejected, SubmissionRejected)
        assert (rejected.reason, rejected.field) == (SubmissionRejectReason.UNKNOWN_TARGET, "run_id")
        assert rejected.detail == f"conversation 'c1' holds no flow run {run_id!r}"
        assert decision.receipt is not None and decision.receipt.outcome is ReceiptOutcome.REJECTED
        assert decision.receipt.run_id is None and decision.settlement is None
        assert decision.receipt.reason is not None
        answers.append((rejected.reason, decision.receipt.reason.replace(run_id, "<id>")))
        log.commit("c1", decision)
    assert answers[0] == answers[1]
    assert log.state.conversation("c1").flow_runs == {}
    assert log.state.conversation("c1").submissions == {}


def test_a_malformed_flow_envelope_is_rejected_naming_the_field(log: Log) -> None:
    decision = admit(log.state.conversation("c1"), proposal("s1", "k1", value={"settled_flow": {"run_id": 7}}),
                     log.ref(), T0)  # fmt: skip
    (rejected,) = decision.events
    assert isinstance(rejected, SubmissionRejected) and rejected.field == "input"
    assert "input.settled_flow.run_id must be a non-empty string, got 7" in rejected.detail


def test_a_restart_mints_a_new_run_for_its_turn_and_an_abandon_keeps_the_run(log: Log) -> None:
    run_id = opened(log)
    restart = admit(log.state.conversation("c1"), proposal("s2", "restart-1", value=flow_operator_input(run_id,
                    "restart")), log.ref(), T0)  # fmt: skip
    admitted = restart.events[0]
    assert isinstance(admitted, SubmissionAdmitted) and restart.receipt is not None
    assert admitted.flow_run_id == restart.receipt.run_id == flow_run_id_for("c1", "s2") != run_id
    log.commit("c1", restart)
    assert log.state.conversation("c1").flow_runs == {run_id: "s1", flow_run_id_for("c1", "s2"): "s2"}
    again = admit(log.state.conversation("c1"), proposal("s2b", "restart-1", value=flow_operator_input(run_id,
                  "restart")), log.ref(), T0)  # fmt: skip
    assert again.receipt is not None and again.receipt.outcome is ReceiptOutcome.DUPLICATE
    assert again.receipt.run_id == flow_run_id_for("c1", "s2")
    abandon = admit(log.state.conversation("c1"), proposal("s3", "abandon-1", value=flow_operator_input(run_id,
                    "abandon")), log.ref(), T0)  # fmt: skip
    assert abandon.receipt is not None and abandon.receipt.run_id == run_id
