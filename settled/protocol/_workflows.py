"""Workflow submissions (issue 17 item 1): how a submission names the workflow it runs.

A workflow run is one submission whose input is the envelope `workflow_input` builds::

    {"settled_workflow": {"name": "process-invoice", "task_id": "inv-42"}, "input": <the run's input>}

in the conversation `workflow_conversation_id` gives by default (``wf:<name>:<task_id>``), with the task id as its
idempotency key: the same task id and input again is a duplicate of the original run, another input a conflict.
The worker reads the envelope back with `workflow_invocation` and runs the named workflow instead of the agent.

Approvals and pauses (issue 17 item 2) use the generic wait of `settled/protocol/_waits.py`:

* a step with ``requires_approval`` asks for approval under `step_approval_id` (run, step, ask number): a denied
  ask that pauses the run is never the answer of the next ask, which has its own id;
* a paused run waits on a signal wait named `RESUME_SIGNAL` whose wait id is `pause_wait_id`; ``Client.pause_run``
  sends the signal `PAUSE_SIGNAL`, which the run honours at its next step boundary, and ``Client.resume_run`` the
  signal `RESUME_SIGNAL`, which delivers the pause wait. `run_control_problem` says why the owner refuses either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from settled.schemas import CommandRejectReason

if TYPE_CHECKING:
    from settled.protocol._fold import Submission

__all__ = [
    "APPROVAL_ANSWER_PREFIX",
    "APPROVAL_REQUEST_PREFIX",
    "PAUSE_SIGNAL",
    "RESUME_SIGNAL",
    "WORKFLOW_KEY",
    "WorkflowInvocation",
    "is_pause_wait",
    "pause_wait_id",
    "run_control_problem",
    "step_approval_id",
    "workflow_conversation_id",
    "workflow_input",
    "workflow_invocation",
]

#: Name prefixes of a workflow step's approval records (``StepRecorded``, settled/runtime/_workflow_run.py): the
#: request of ask ``k`` (``approval-request:<step>#<k>``) and ``on_approval_needed``'s answer (``approval:<step>#<k>``).
APPROVAL_REQUEST_PREFIX = "approval-request:"
APPROVAL_ANSWER_PREFIX = "approval:"

#: The signal that pauses a workflow run at its next step boundary (``Client.pause_run``; payload ``{"reason"}``).
PAUSE_SIGNAL = "settled.pause"
#: The signal that resumes a paused workflow run (``Client.resume_run``): it delivers the run's pause wait.
RESUME_SIGNAL = "settled.resume"

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


def step_approval_id(run_id: str, step: str, ask: int) -> str:
    """Return the approval id of a workflow step's ``ask``-th approval request (1-based).

    Args:
        run_id: The run id.
        step: The step's name.
        ask: The ask number: 1, then one more after each denial that paused the run and its resume.

    Returns:
        ``<run_id>#approve:<step>#<ask>`` (an approval of that run: `settled.protocol.approval_problem`).
    """
    return f"{run_id}#approve:{step}#{ask}"


def pause_wait_id(run_id: str, ordinal: int) -> str:
    """Return the wait id of a workflow run's pause at a record ordinal.

    Args:
        run_id: The run id.
        ordinal: The ordinal of the pause's ``WaitRequested``.

    Returns:
        ``<run_id>#p<ordinal>``.
    """
    return f"{run_id}#p{ordinal}"


def is_pause_wait(run_id: str, wait_id: str) -> bool:
    """Whether ``wait_id`` is a pause of run ``run_id`` (`pause_wait_id`).

    Args:
        run_id: The run id.
        wait_id: A wait id.

    Returns:
        True for a pause wait of that run.
    """
    prefix = f"{run_id}#p"
    return wait_id.startswith(prefix) and wait_id[len(prefix) :].isdigit()


def run_control_problem(sub: Submission, name: str) -> tuple[CommandRejectReason, str] | None:
    """Say why the owner refuses a pause or resume signal to an unsettled run, or None when it accepts it.

    A pause or resume is for a workflow run only (``invalid``); a resume needs the run paused, a pause needs it not
    paused (``stale``: the run's state moved on, e.g. a resume sent before the pause took effect). Other signal
    names are never refused here.

    Args:
        sub: The target run (unsettled).
        name: The signal's name.

    Returns:
        (reason, detail) naming the run and what it is doing, or None.
    """
    if name not in (PAUSE_SIGNAL, RESUME_SIGNAL):
        return None
    try:
        invocation = None if sub.input_json is None else workflow_invocation(sub.input_json)
    except ValueError:
        invocation = None
    if invocation is None:
        return (CommandRejectReason.INVALID, f"run {sub.submission_id!r} is not a workflow run; {name!r} is refused")
    paused = any(is_pause_wait(sub.submission_id, w) for w in sub.waits)
    if name == RESUME_SIGNAL and not paused:
        return (CommandRejectReason.STALE, f"run {sub.submission_id!r} is not paused (it is {sub.state.value})")
    if name == PAUSE_SIGNAL and paused:
        return (CommandRejectReason.STALE, f"run {sub.submission_id!r} is already paused")
    return None
