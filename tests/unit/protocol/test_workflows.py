"""The workflow submission envelope (issue 17 item 1): built, read back, and refused naming the field."""

from __future__ import annotations

import pytest

from settled.protocol import (
    PAUSE_SIGNAL,
    RESUME_SIGNAL,
    WorkflowInvocation,
    admit,
    check_command,
    is_pause_wait,
    pause_wait_id,
    run_control_problem,
    signal,
    start_attempt,
    step_approval_id,
    workflow_conversation_id,
    workflow_input,
    workflow_invocation,
)
from settled.schemas import ReceiptOutcome, SendSignal, WaitKind, WaitRequested, canonical_json

from ._sim import T0, Log, proposal


def test_envelope_round_trips() -> None:
    envelope = workflow_input("process-invoice", "inv-42", {"file": "a.pdf"})
    assert workflow_invocation(canonical_json(envelope)) == WorkflowInvocation(
        "process-invoice", "inv-42", {"file": "a.pdf"}
    )
    assert workflow_conversation_id("process-invoice", "inv-42") == "wf:process-invoice:inv-42"


@pytest.mark.parametrize("value", ["hello", {"plan": []}, [1, 2], None])
def test_an_agent_input_is_not_a_workflow(value: object) -> None:
    assert workflow_invocation(canonical_json(value)) is None


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"settled_workflow": "x"}, "input.settled_workflow"),
        ({"settled_workflow": {"task_id": "t"}}, "input.settled_workflow.name"),
        ({"settled_workflow": {"name": "w", "task_id": 7}}, "input.settled_workflow.task_id"),
    ],
)
def test_a_malformed_envelope_names_the_field(value: object, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        workflow_invocation(canonical_json(value))


@pytest.mark.parametrize(("name", "task_id", "field"), [(" ", "t", "workflow name"), ("w", "", "task_id")])
def test_empty_name_or_task_id_is_refused(name: str, task_id: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        workflow_input(name, task_id, None)


# -- approvals and pauses (issue 17 item 2) -----------------------------------------------------------------------


def _workflow_log(value: object) -> Log:
    log = Log()
    log.claim()
    log.commit("c1", admit(log.state.conversation("c1"), proposal("s1", "k1", value=value), log.ref(), T0))
    log.commit("c1", start_attempt(log.state.conversation("c1"), "s1", "a1", log.epoch))
    return log


def _control(name: str, command_id: str = "g1") -> SendSignal:
    return SendSignal(
        command_id=command_id,
        principal="ops",
        conversation_id="c1",
        submission_id="s1",
        name=name,
        payload_json=canonical_json(None),
        sent_at=T0,
    )


def _decide(log: Log, name: str, command_id: str = "g1") -> tuple[ReceiptOutcome, str | None]:
    d = signal(log.state.conversation("c1"), _control(name, command_id), log.ref(), T0)
    log.commit("c1", d)
    assert d.receipt is not None
    return d.receipt.outcome, d.receipt.reason


def test_step_approval_ids_name_the_run_step_and_ask_and_differ_per_ask() -> None:
    first, second = step_approval_id("s1", "send", 1), step_approval_id("s1", "send", 2)
    assert first == "s1#approve:send#1" and first != second
    assert first.startswith("s1#")  # an approval of that run (approval_problem)
    assert is_pause_wait("s1", pause_wait_id("s1", 7))
    assert not is_pause_wait("s1", first) and not is_pause_wait("s2", pause_wait_id("s1", 7))
    assert not is_pause_wait("s1", "s1#w3")


def test_pause_and_resume_are_refused_for_an_agent_run_naming_it() -> None:
    log = _workflow_log("hello")
    outcome, reason = _decide(log, PAUSE_SIGNAL)
    assert outcome is ReceiptOutcome.REJECTED and reason is not None
    assert reason.startswith("invalid") and "'s1' is not a workflow run" in reason
    assert _decide(log, "paid", "g2")[0] is ReceiptOutcome.APPLIED  # other names are not refused


def test_a_pause_is_applied_once_and_a_resume_needs_the_run_paused() -> None:
    log = _workflow_log(workflow_input("pay", "t1", None))
    outcome, reason = _decide(log, RESUME_SIGNAL, "r0")
    assert outcome is ReceiptOutcome.REJECTED and reason is not None and reason.startswith("stale"), reason
    assert _decide(log, PAUSE_SIGNAL, "p1")[0] is ReceiptOutcome.APPLIED
    assert _decide(log, PAUSE_SIGNAL, "p1")[0] is ReceiptOutcome.DUPLICATE
    pause = WaitRequested(
        submission_id="s1",
        attempt_id="a1",
        wait_id=pause_wait_id("s1", 3),
        kind=WaitKind.SIGNAL,
        name=RESUME_SIGNAL,
        ordinal=3,
    )
    log.append("c1", [pause])
    outcome, reason = _decide(log, PAUSE_SIGNAL, "p2")
    assert outcome is ReceiptOutcome.REJECTED and reason is not None and "already paused" in reason, reason
    assert _decide(log, PAUSE_SIGNAL, "p1")[0] is ReceiptOutcome.DUPLICATE  # a repeat stays a duplicate
    assert _decide(log, RESUME_SIGNAL, "r1")[0] is ReceiptOutcome.APPLIED
    sub = log.state.conversation("c1").submission("s1")
    assert sub is not None
    assert run_control_problem(sub, "anything") is None


def test_the_contract_lets_clients_send_pause_and_resume_but_no_other_reserved_name() -> None:
    assert check_command(_control(PAUSE_SIGNAL)) is None
    assert check_command(_control(RESUME_SIGNAL)) is None
    violation = check_command(_control("settled.retry#1"))
    assert violation is not None and violation.field == "name"
