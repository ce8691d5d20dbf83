"""Workflow submissions (issue 17 item 1): how a submission names the workflow it runs.

A workflow run is one submission whose input is the envelope `workflow_input` builds::

    {"settled_workflow": {"name": "process-invoice", "task_id": "inv-42"}, "input": <the run's input>}

in the conversation `workflow_conversation_id` gives by default (``wf:<name>:<task_id>``), with the task id as its
idempotency key: the same task id and input again is a duplicate of the original run, another input a conflict.
The worker reads the envelope back with `workflow_invocation` and runs the named workflow instead of the agent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["WORKFLOW_KEY", "WorkflowInvocation", "workflow_conversation_id", "workflow_input", "workflow_invocation"]

#: The input key that marks a submission as a workflow run.
WORKFLOW_KEY = "settled_workflow"


@dataclass(frozen=True)
class WorkflowInvocation:
    """A submission's request to run a workflow.

    Attributes:
        name: The workflow's name.
        task_id: The run's task id (its idempotency key).
        input: The run's input (decoded JSON).
    """

    name: str
    task_id: str
    input: Any


def workflow_conversation_id(name: str, task_id: str) -> str:
    """Return the default conversation of a workflow run: ``wf:<name>:<task_id>``.

    Args:
        name: The workflow's name.
        task_id: The run's task id.

    Returns:
        The conversation id (runs of different tasks spread over the partitions).
    """
    return f"wf:{name}:{task_id}"


def workflow_input(name: str, task_id: str, input: Any) -> dict[str, Any]:
    """Build the input of a submission that runs workflow ``name`` (the module docstring's envelope).

    Args:
        name: The workflow's name.
        task_id: The run's task id.
        input: The run's input, a JSON-compatible value.

    Returns:
        The envelope.

    Raises:
        ValueError: ``name`` or ``task_id`` is empty (the message names the field).
    """
    if not name.strip():
        raise ValueError(f"workflow name must not be empty, got {name!r}")
    if not task_id.strip():
        raise ValueError(f"task_id must not be empty, got {task_id!r}")
    return {WORKFLOW_KEY: {"name": name, "task_id": task_id}, "input": input}


def workflow_invocation(input_json: str) -> WorkflowInvocation | None:
    """Read the workflow a submission's input names, if it names one.

    Args:
        input_json: The submission's input, canonical JSON.

    Returns:
        The invocation, or None when the input is not a workflow envelope (an agent's submission).

    Raises:
        ValueError: The input has the envelope's key but not its shape (the message names the field and value).
    """
    value = json.loads(input_json)
    if not isinstance(value, dict) or WORKFLOW_KEY not in value:
        return None
    header = value[WORKFLOW_KEY]
    if not isinstance(header, dict):
        raise ValueError(f"input.{WORKFLOW_KEY} must be an object, got {header!r}")
    name, task_id = header.get("name"), header.get("task_id")
    if not isinstance(name, str) or not name:
        raise ValueError(f"input.{WORKFLOW_KEY}.name must be a non-empty string, got {name!r}")
    if not isinstance(task_id, str) or not task_id:
        raise ValueError(f"input.{WORKFLOW_KEY}.task_id must be a non-empty string, got {task_id!r}")
    return WorkflowInvocation(name=name, task_id=task_id, input=value.get("input"))
