"""Flow submissions (issue 18 item 1): how a submission names the flow its turn runs.

A flow turn is one submission whose input is the envelope `flow_input` builds::

    {"settled_flow": {"name": "refund"}, "input": <the turn's input>}

The worker reads the envelope back with `flow_invocation` and runs the named flow instead of the agent
(`settled/runtime/_flow_run.py`). The input is what the flow's ``collect`` nodes take their fields from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["FLOW_KEY", "FlowInvocation", "flow_input", "flow_invocation"]

#: The input key that marks a submission as a flow turn.
FLOW_KEY = "settled_flow"


@dataclass(frozen=True)
class FlowInvocation:
    """A submission's request to run a flow.

    Attributes:
        name: The flow's name.
        input: The turn's input (decoded JSON).
    """

    name: str
    input: Any


def flow_input(name: str, input: Any) -> dict[str, Any]:
    """Build the input of a submission whose turn runs flow ``name`` (the module docstring's envelope).

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


def flow_invocation(input_json: str) -> FlowInvocation | None:
    """Read the flow a submission's input names, if it names one.

    Args:
        input_json: The submission's input, canonical JSON.

    Returns:
        The invocation, or None when the input is not a flow envelope.

    Raises:
        ValueError: The input has the envelope's key but not its shape (the message names the field and value).
    """
    value = json.loads(input_json)
    if not isinstance(value, dict) or FLOW_KEY not in value:
        return None
    header = value[FLOW_KEY]
    if not isinstance(header, dict):
        raise ValueError(f"input.{FLOW_KEY} must be an object, got {header!r}")
    name = header.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"input.{FLOW_KEY}.name must be a non-empty string, got {name!r}")
    return FlowInvocation(name=name, input=value.get("input"))
