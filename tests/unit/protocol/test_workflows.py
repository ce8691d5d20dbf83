"""The workflow submission envelope (issue 17 item 1): built, read back, and refused naming the field."""

from __future__ import annotations

import pytest

from settled.protocol import (
    WorkflowInvocation,
    workflow_conversation_id,
    workflow_input,
    workflow_invocation,
)
from settled.schemas import canonical_json


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
