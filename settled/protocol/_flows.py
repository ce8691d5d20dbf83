"""Flow submissions (issue 18): how a submission names the flow its turn runs, or the flow run it resumes.

A turn that opens a flow run has the input `flow_input` builds; a later turn of that run has the input
`flow_resume_input` builds::

    {"settled_flow": {"name": "refund"}, "input": <the turn's input>}       # opens a run of flow "refund"
    {"settled_flow": {"run_id": "fr-..."}, "input": <the turn's input>}     # resumes run fr-...

A ``run_id`` outranks a ``name`` beside it: a turn that names a run only resumes it (`flow_invocation` drops the
name). An operator's turn names a run and an ``operator`` (`flow_operator_input`, issue 18 item 3): ``abandon`` ends
the run; ``restart`` ends it and opens a new run (its id minted for the restart turn) of the deployed flow with the
run's opening input; sent under one idempotency key (the command id), a repeat is a duplicate.

The owner mints the run id when it admits the opening turn (`flow_run_id_for`: a digest of the conversation and the
submission id, so a replayed decision mints the same id) and the receipt carries it; a turn naming a run id the
conversation does not hold is rejected ``unknown_target`` (`settled/protocol/_decide.py`). The worker reads the
envelope back with `flow_invocation` and runs the flow instead of the agent (`settled/runtime/_flow_run.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from settled.schemas import canonical_json, json_digest

__all__ = [
    "FLOW_KEY",
    "FlowInvocation",
    "FlowRunView",
    "TranscriptEntry",
    "flow_input",
    "flow_invocation",
    "flow_operator_input",
    "flow_resume_input",
    "flow_run_id_for",
    "flow_run_view",
]

#: The input key that marks a submission as a flow turn.
FLOW_KEY = "settled_flow"

#: The prefix of a minted flow run id.
_RUN_PREFIX = "fr-"

#: What an operator may do to a flow run (``settled flows abandon|restart``).
FLOW_OPERATORS = ("abandon", "restart")


@dataclass(frozen=True)
class FlowInvocation:
    """A submission's request to run a flow turn.

    Attributes:
        name: The flow's name, for a turn that opens a run (None when it resumes one).
        run_id: The run a later turn resumes (None for a turn that opens one).
        input: The turn's input (decoded JSON).
        operator: For an operator's turn: ``abandon`` or ``restart`` (of ``run_id``); None otherwise.
    """

    name: str | None
    run_id: str | None
    input: Any
    operator: str | None = None


def flow_run_id_for(conversation_id: str, submission_id: str) -> str:
    """Return the run id the owner mints for the turn that opens a flow run.

    Args:
        conversation_id: The conversation.
        submission_id: The opening turn's submission id.

    Returns:
        ``fr-`` and 32 hex digits of a digest of both (the same for a replayed decision).
    """
    return _RUN_PREFIX + json_digest(canonical_json(["flow-run", conversation_id, submission_id]))[:32]


def flow_input(name: str, input: Any) -> dict[str, Any]:
    """Build the input of a submission whose turn opens a run of flow ``name`` (the module docstring's envelope).

    Args:
        name: The flow's name.
        input: The turn's input, a JSON-compatible value.

    Returns:
        The envelope.

    Raises:
        ValueError: ``name`` is empty or blank (the message names the field and value).
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"flow name must be a non-empty string, got {name!r}")
    return {FLOW_KEY: {"name": name}, "input": input}


def flow_resume_input(run_id: str, input: Any) -> dict[str, Any]:
    """Build the input of a submission whose turn resumes flow run ``run_id``.

    Args:
        run_id: The run id (a receipt's ``run_id``).
        input: The turn's input, a JSON-compatible value.

    Returns:
        The envelope.

    Raises:
        ValueError: ``run_id`` is empty or blank (the message names the field and value).
    """
    if not isinstance(run_id, str) or not run_id.strip():
        raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
    return {FLOW_KEY: {"run_id": run_id}, "input": input}


def flow_operator_input(run_id: str, operator: str) -> dict[str, Any]:
    """Build the input of an operator's turn that abandons or restarts flow run ``run_id``.

    Args:
        run_id: The run id.
        operator: ``abandon`` or ``restart``.

    Returns:
        The envelope.

    Raises:
        ValueError: ``run_id`` is blank or ``operator`` is not one of `FLOW_OPERATORS` (named with the value).
    """
    if operator not in FLOW_OPERATORS:
        raise ValueError(f"operator must be one of {list(FLOW_OPERATORS)}, got {operator!r}")
    envelope = flow_resume_input(run_id, None)
    envelope[FLOW_KEY]["operator"] = operator
    return envelope


def flow_invocation(input_json: str) -> FlowInvocation | None:
    """Read the flow turn a submission's input asks for, if it asks for one.

    Args:
        input_json: The submission's input, canonical JSON.

    Returns:
        The invocation (a ``run_id`` outranks a ``name``: the name is dropped), or None when the input is not a flow
        envelope.

    Raises:
        ValueError: The input has the envelope's key but not its shape (the message names the field and value).
    """
    if FLOW_KEY not in input_json:
        return None  # cheap: most inputs are not flow turns
    value = json.loads(input_json)
    if not isinstance(value, dict) or FLOW_KEY not in value:
        return None
    header = value[FLOW_KEY]
    if not isinstance(header, dict):
        raise ValueError(f"input.{FLOW_KEY} must be an object, got {header!r}")
    run_id = header.get("run_id")
    if run_id is not None:
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"input.{FLOW_KEY}.run_id must be a non-empty string, got {run_id!r}")
        operator = header.get("operator")
        if operator is not None and operator not in FLOW_OPERATORS:
            raise ValueError(f"input.{FLOW_KEY}.operator must be one of {list(FLOW_OPERATORS)}, got {operator!r}")
        return FlowInvocation(name=None, run_id=run_id, input=value.get("input"), operator=operator)
    name = header.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"input.{FLOW_KEY}.name must be a non-empty string, got {name!r}")
    return FlowInvocation(name=name, run_id=None, input=value.get("input"))


@dataclass(frozen=True)
class TranscriptEntry:
    """One entry of a conversation's transcript, as `flow_run_view` reads it (the projection's ``transcript`` rows).

    Attributes:
        submission_id: The submission it belongs to.
        kind: ``input``, ``step``, ``wait``, ``wait_resolved``, ``reply``, ``settlement``, ... (others are skipped).
        name: A step's or wait's name.
        call_id: A wait's id (for ``wait`` and ``wait_resolved``).
        content: Its content (JSON for the kinds read here, the failure's text for ``settlement``).
    """

    submission_id: str | None
    kind: str
    name: str | None
    call_id: str | None
    content: str | None


@dataclass(frozen=True)
class FlowRunView:
    """Where a flow run is (``ProjectionReader.flow_run``; the seed's ``getRun``).

    Attributes:
        run_id: The run.
        conversation_id: Its conversation.
        flow: The flow's name.
        status: ``running`` (a turn runs), ``waiting`` (parked at a ``collect`` for the user's next turn, or a turn
            waits for an approval or a signal), ``completed`` (ended by an `End` or a handoff), ``failed`` or
            ``aborted`` (its last turn settled so; a drifted run's turns fail ``FlowDriftError``), ``abandoned`` or
            ``restarted`` (an operator ended it).
        node: The node the run last entered (None before its first).
        waiting_for: What it waits for: ``{"kind": "input", "node", "ask", "missing"}`` for a parked collect,
            ``{"kind": "approval" | "signal", "name", "wait_id"}`` for an open wait; None otherwise.
        outcome: The `End`'s outcome, or ``handoff:<to>`` for a handoff, once completed.
        submission_ids: The run's turns, in order.
    """

    run_id: str
    conversation_id: str
    flow: str
    status: str
    node: str | None
    waiting_for: dict[str, Any] | None
    outcome: str | None
    submission_ids: tuple[str, ...]


def flow_run_view(conversation_id: str, run_id: str, entries: list[TranscriptEntry]) -> FlowRunView | None:
    """Read where flow run ``run_id`` is from its conversation's transcript, in event order.

    Args:
        conversation_id: The conversation.
        run_id: The run.
        entries: The conversation's transcript entries in event order.

    Returns:
        The view, or None when the conversation holds no such run.
    """
    flows: dict[str, str] = {}  # run id -> flow name, of every run opened (or restarted) so far
    turns: list[str] = []
    ended: str | None = None  # "abandoned" or "restarted", once an operator ended the run
    for e in entries:
        if e.kind != "input" or e.submission_id is None or e.content is None:
            continue
        try:
            invocation = flow_invocation(e.content)
        except ValueError:
            continue  # the owner admits no malformed envelope
        if invocation is None:
            continue
        minted = flow_run_id_for(conversation_id, e.submission_id)
        if invocation.run_id is None and invocation.name is not None:
            flows[minted] = invocation.name
        elif invocation.operator == "restart" and invocation.run_id in flows:
            flows[minted] = flows[invocation.run_id]
        if minted == run_id and run_id in flows:
            turns.append(e.submission_id)  # the opening turn (a restart turn opens the new run)
        elif invocation.run_id == run_id and turns and ended is None:
            if invocation.operator is not None:
                ended = "abandoned" if invocation.operator == "abandon" else "restarted"
            else:
                turns.append(e.submission_id)
    flow = flows.get(run_id)
    if flow is None or not turns:
        return None
    last = turns[-1]
    mine = set(turns)
    node: str | None = None
    waits: dict[str, dict[str, Any]] = {}
    reply: Any = None
    failure: str | None = None
    for e in entries:
        if e.submission_id not in mine:
            continue
        if e.kind == "step" and e.name is not None and e.name.startswith("flow:") and e.content is not None:
            node = json.loads(e.content).get("node", node)
        if e.submission_id != last:
            continue
        if e.kind == "wait" and e.call_id is not None and e.content is not None:
            asked = json.loads(e.content)
            waits[e.call_id] = {"kind": asked.get("kind"), "name": asked.get("name"), "wait_id": e.call_id}
        elif e.kind == "wait_resolved" and e.call_id is not None:
            waits.pop(e.call_id, None)
        elif e.kind == "reply" and e.content is not None:
            reply = json.loads(e.content)
        elif e.kind == "settlement":
            failure = e.content or "failed"
    status, waiting_for, outcome = "running", None, None
    if ended is not None:
        status = ended
    elif failure is not None:
        status = "aborted" if failure.startswith("aborted") else "failed"
    elif isinstance(reply, dict) and "handoff" in reply:
        status, outcome = "completed", f"handoff:{reply['handoff']}"
    elif isinstance(reply, dict) and reply.get("status") == "waiting":
        status = "waiting"
        waiting_for = {key: reply.get(key) for key in ("node", "ask", "missing")}
        waiting_for["kind"] = "input"
    elif isinstance(reply, dict) and reply.get("status") == "completed":
        status, outcome = "completed", reply.get("outcome")
    elif waits:
        status, waiting_for = "waiting", next(iter(waits.values()))
    return FlowRunView(run_id, conversation_id, flow, status, node, waiting_for, outcome, tuple(turns))
