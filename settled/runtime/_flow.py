"""Flows: guided conversations of ``collect``, ``reply`` and ``action`` nodes (issue 18 item 1).

::

    async def issue_refund(state: dict, ctx: RunContext) -> Goto | End | Handoff:
        decision = await ctx.approve(title=f"Approve a refund of {state['amount']}?")
        if not decision.approved:
            return Goto("declined")
        receipt = await ctx.tool("process_refund", {"amount": state["amount"]})
        return Goto("confirmed", {"receipt": receipt})

    refund = Flow(
        "refund",
        description="Collect a refund amount, get a supervisor's approval, then refund",
        start="collect_amount",
        nodes=[
            collect(
                "collect_amount",
                schema={"type": "object", "properties": {"amount": {"type": "number"}}},
                required=["amount"],
                ask=lambda missing: f"What {' and '.join(missing)} should the refund be for?",
                next="issue_refund",
            ),
            action("issue_refund", issue_refund),
            reply("confirmed", "Tell the customer the refund was processed.", next=End("refunded")),
            reply("declined", "Tell the customer a supervisor declined the refund.", next=End("declined")),
        ],
        provider=provider,  # the model of reply nodes (and of collect's extraction)
    )
    app.flow(refund)

A turn of a flow is a submission whose input is `settled.protocol.flow_input` (the flow's name and the turn's
input). The worker walks the graph from ``start``:

* ``collect`` takes the fields its ``schema`` names from the turn's JSON input (an object); when the flow has a
  ``provider`` and required fields are still missing, one recorded model call extracts them from the user's text.
  A value of the wrong type is not taken. When required fields are missing the turn settles completed with the
  question (``ask``) and what is missing; otherwise the fields join the flow's state and the flow goes on to
  ``next``.
* ``reply`` makes one recorded model call with its ``instructions`` (and the flow's state), whose text joins the
  turn's messages, then goes on to ``next``: a node id, an `End`, or a function of the state returning either.
* ``action`` calls ``run(state, ctx)`` with the run's `settled.runtime.RunContext` (``tool``, ``step``, ``approve``,
  ``signal``, ``now``, ``uuid``: every effect recorded, replayed on a resume) and goes where it returns: `Goto`
  (another node, its ``data`` merged into the state), `End` (the flow's outcome) or `Handoff` (the turn completes
  with the reply ``{"handoff": to, "reason": reason}``; settled routes nothing).

A turn's graph is walked again from ``start`` on a new attempt (after a crash): every model call, tool call, step
and wait is replayed from the log at its ordinal, so nothing recorded runs twice, as with an agent; ``run`` must
branch only on its state and on what ``ctx`` returns (``ctx.now``/``ctx.uuid``, never the clock or random).

This module is the author-facing API; the machinery that runs a flow inside a run is
`settled/runtime/_flow_run.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from settled.processors import RunFailedError
from settled.schemas import canonical_json, json_digest

if TYPE_CHECKING:
    from settled.runtime._context import RunContext
    from settled.runtime._model import ModelProvider

__all__ = [
    "Action",
    "ActionFunction",
    "Collect",
    "End",
    "Flow",
    "FlowDriftError",
    "FlowNode",
    "Goto",
    "Handoff",
    "Reply",
    "action",
    "collect",
    "reply",
]

#: Names: node ids and flow names (letters, digits, ``_``, ``.``, ``-``; at most 128 characters).
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")

#: The JSON Schema types a ``collect`` schema's properties may name, and the Python values each accepts.
_TYPES: Mapping[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


@dataclass(frozen=True)
class Goto:
    """An action's result: go to node ``node``, merging ``data`` into the flow's state.

    Attributes:
        node: The next node's id.
        data: Keys to set in the flow's state (a JSON object).
    """

    node: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class End:
    """The flow ends with ``outcome`` (the turn completes; its reply names the outcome).

    Attributes:
        outcome: The outcome's name, e.g. ``"refunded"``.
    """

    outcome: str


@dataclass(frozen=True)
class Handoff:
    """The flow hands the conversation to ``to``: the turn completes with ``{"handoff": to, "reason": reason}``.

    settled routes nothing: the caller reads the reply and acts on it.

    Attributes:
        to: Who takes over (e.g. ``"human"``).
        reason: Why.
    """

    to: str
    reason: str = ""


class FlowDriftError(RunFailedError):
    """A turn reached a flow run pinned to another definition than the deployed one (issue 18 item 3).

    The turn runs no node and settles failed with this error type until an operator chooses: ``settled flows
    abandon RUN_ID --conversation C`` ends the run, ``settled flows restart ...`` ends it and opens a new run of the
    deployed flow with the same opening input.

    Attributes:
        run_id: The run.
        flow: The flow's name.
        pinned_digest: The digest the run pinned when it opened.
        deployed_digest: The deployed flow's digest.
        recovery: What an operator may do: ``("restart", "abandon")``.
    """

    recovery = ("restart", "abandon")

    def __init__(self, run_id: str, flow: str, pinned_digest: str, deployed_digest: str) -> None:
        """Build the error.

        Args:
            run_id: The run.
            flow: The flow's name.
            pinned_digest: The digest the run pinned when it opened.
            deployed_digest: The deployed flow's digest.
        """
        super().__init__(
            "FlowDriftError",
            f"flow run {run_id!r} of flow {flow!r} is pinned to digest {pinned_digest} but the deployed flow's digest "
            f"is {deployed_digest}; no node ran. Recovery: restart or abandon (settled flows restart|abandon "
            f"{run_id} --conversation C)",
        )
        self.run_id = run_id
        self.flow = flow
        self.pinned_digest = pinned_digest
        self.deployed_digest = deployed_digest


#: An action node's body: ``run(state, ctx)`` returning `Goto`, `End` or `Handoff`; sync (on a thread) or async.
ActionFunction = Callable[[dict[str, Any], "RunContext"], Any]

#: Where a ``collect`` or ``reply`` goes next: a node id, an `End`, or (reply only) a function of the state.
Next = str | End | Callable[[dict[str, Any]], "str | End"]


def _check_name(what: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{what} {name!r} must be 1-128 letters, digits, '_', '.' or '-'")


def _check_next(node: str, value: Any) -> None:
    if isinstance(value, str):
        _check_name(f"node {node!r}: next", value)
    elif not isinstance(value, End) and not callable(value):
        raise ValueError(f"node {node!r}: next must be a node id, an End or a function of the state, got {value!r}")


@dataclass(frozen=True)
class Collect:
    """A node that collects fields from the user (`collect` builds it).

    Attributes:
        id: The node's id.
        schema: A JSON Schema object: ``{"type": "object", "properties": {field: {"type": ...}}}``; each property's
            ``type`` is one of string, number, integer, boolean, object, array, null (or a list of them), or absent
            (any value).
        required: The fields the flow cannot go on without.
        ask: The question for what is missing: a string, or a function of the missing field names.
        next: Where the flow goes once every required field is known.
    """

    id: str
    schema: Mapping[str, Any]
    required: tuple[str, ...]
    ask: str | Callable[[list[str]], str]
    next: str | End

    def __post_init__(self) -> None:
        _check_name("collect id", self.id)
        if not isinstance(self.schema, Mapping):
            raise ValueError(f"collect {self.id!r}: schema must be a JSON Schema object, got {self.schema!r}")
        properties = self.schema.get("properties")
        if not isinstance(properties, Mapping) or not properties:
            raise ValueError(f"collect {self.id!r}: schema.properties must be a non-empty object, got {properties!r}")
        for name, spec in properties.items():
            if not isinstance(spec, Mapping):
                raise ValueError(f"collect {self.id!r}: schema.properties.{name} must be an object, got {spec!r}")
            types = spec.get("type")
            for t in [types] if isinstance(types, str) else (types or []):
                if t not in _TYPES:
                    raise ValueError(
                        f"collect {self.id!r}: schema.properties.{name}.type {t!r} is not one of {sorted(_TYPES)}"
                    )
        required = tuple(self.required)
        unknown = [r for r in required if r not in properties]
        if unknown:
            raise ValueError(f"collect {self.id!r}: required {unknown} are not in schema.properties")
        object.__setattr__(self, "required", required)
        if not isinstance(self.ask, str) and not callable(self.ask):
            raise ValueError(f"collect {self.id!r}: ask must be a string or a function, got {self.ask!r}")
        if not isinstance(self.next, str | End):
            raise ValueError(f"collect {self.id!r}: next must be a node id or an End, got {self.next!r}")
        _check_next(self.id, self.next)

    @property
    def properties(self) -> Mapping[str, Mapping[str, Any]]:
        """The schema's properties by field name."""
        properties: Mapping[str, Mapping[str, Any]] = self.schema["properties"]
        return properties

    def problem(self, name: str, value: Any) -> str | None:
        """Say what is wrong with ``value`` for field ``name``, or return None when the schema accepts it.

        Args:
            name: A field of the schema.
            value: Its candidate value.

        Returns:
            The problem (naming the field, the value and the expected types), or None.
        """
        types = self.properties[name].get("type")
        if types is None:
            return None
        allowed = [types] if isinstance(types, str) else list(types)
        if any(_TYPES[t](value) for t in allowed):
            return None
        return f"field {name!r}: {value!r} is not of type {' or '.join(allowed)}"

    def question(self, missing: list[str]) -> str:
        """Return the question for the ``missing`` fields.

        Args:
            missing: The missing required fields, in ``required`` order.

        Returns:
            The question.

        Raises:
            TypeError: ``ask`` returned something other than a string.
        """
        if isinstance(self.ask, str):
            return self.ask
        text = self.ask(list(missing))
        if not isinstance(text, str):
            raise TypeError(f"collect {self.id!r}: ask returned {type(text).__name__}, not a str")
        return text


@dataclass(frozen=True)
class Reply:
    """A node that says something: one recorded model call with its instructions (`reply` builds it).

    Attributes:
        id: The node's id.
        instructions: What the model is told to say (the system message; the flow's state follows it).
        next: Where the flow goes after it: a node id, an `End`, or a function of the state returning either.
    """

    id: str
    instructions: str
    next: Next

    def __post_init__(self) -> None:
        _check_name("reply id", self.id)
        if not isinstance(self.instructions, str) or not self.instructions.strip():
            raise ValueError(f"reply {self.id!r}: instructions must be a non-empty string, got {self.instructions!r}")
        _check_next(self.id, self.next)


@dataclass(frozen=True)
class Action:
    """A node that runs code with the run's durable context (`action` builds it).

    Attributes:
        id: The node's id.
        run: ``run(state, ctx)`` returning `Goto`, `End` or `Handoff`.
        version: The behaviour's version: the author raises it when ``run``'s behaviour changes (issue 18 item 3
            pins it).
    """

    id: str
    run: ActionFunction
    version: int = 1

    def __post_init__(self) -> None:
        _check_name("action id", self.id)
        if not callable(self.run):
            raise ValueError(f"action {self.id!r}: run must be callable, got {self.run!r}")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"action {self.id!r}: version must be an int >= 1, got {self.version!r}")


#: A flow's node.
FlowNode = Collect | Reply | Action


def collect(
    id: str,
    schema: Mapping[str, Any],
    required: Sequence[str],
    ask: str | Callable[[list[str]], str],
    *,
    next: str | End,
) -> Collect:
    """Build a ``collect`` node (`Collect`).

    Args:
        id: The node's id.
        schema: A JSON Schema object of the fields (`Collect.schema`).
        required: The fields the flow cannot go on without.
        ask: The question for what is missing: a string, or a function of the missing field names.
        next: Where the flow goes once every required field is known: a node id or an `End`.

    Returns:
        The node.

    Raises:
        ValueError: An argument is invalid (the message names the node, the field and the value).
    """
    return Collect(id=id, schema=schema, required=tuple(required), ask=ask, next=next)


def reply(id: str, instructions: str, next: Next) -> Reply:
    """Build a ``reply`` node (`Reply`).

    Args:
        id: The node's id.
        instructions: What the model is told to say.
        next: Where the flow goes after it: a node id, an `End`, or a function of the state returning either.

    Returns:
        The node.

    Raises:
        ValueError: An argument is invalid (the message names the node, the field and the value).
    """
    return Reply(id=id, instructions=instructions, next=next)


def action(id: str, run: ActionFunction, *, version: int = 1) -> Action:
    """Build an ``action`` node (`Action`).

    Args:
        id: The node's id.
        run: ``run(state, ctx)`` returning `Goto`, `End` or `Handoff`.
        version: The behaviour's version (raise it when ``run``'s behaviour changes).

    Returns:
        The node.

    Raises:
        ValueError: An argument is invalid (the message names the node, the field and the value).
    """
    return Action(id=id, run=run, version=version)


@dataclass(frozen=True)
class Flow:
    """A named graph of nodes, registered on the app (``App.flow``); a turn names it with `settled.protocol.flow_input`.

    Attributes:
        name: The flow's name.
        description: What the flow does, in a few words.
        start: The first node's id.
        nodes: The nodes; ids unique; every static edge (``next`` given as a node id) names one of them.
        provider: The model of ``reply`` nodes and of ``collect``'s extraction; required when a ``reply`` exists.
        model: The model name passed to the provider.
        max_node_visits: How many nodes one turn may visit before it fails (``flow_loop``): a graph that cycles
            without collecting never spins a worker.
        digest: SHA-256 (hex) of the canonical JSON of the flow's structure (`structure`), pinned by a run when it
            opens (issue 18 item 3): a description, a provider or a dynamic ``next`` function does not change it.

    Raises:
        ValueError: A value is invalid (the message names the flow, the field and the value).
    """

    name: str
    description: str
    start: str
    nodes: Sequence[FlowNode]
    provider: ModelProvider | None = None
    model: str = "default"
    max_node_visits: int = 100
    digest: str = field(init=False, compare=False)
    _index: Mapping[str, FlowNode] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name("Flow.name", self.name)
        nodes = tuple(self.nodes)
        if not nodes:
            raise ValueError(f"Flow {self.name!r}: nodes must not be empty")
        for n in nodes:
            if not isinstance(n, Collect | Reply | Action):
                raise ValueError(f"Flow {self.name!r}: nodes holds {n!r}, not a collect, reply or action node")
        ids = [n.id for n in nodes]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"Flow {self.name!r}: node ids {repeated} repeat")
        index = {n.id: n for n in nodes}
        if self.start not in index:
            raise ValueError(f"Flow {self.name!r}: start {self.start!r} is not a node id; nodes are {ids}")
        for n in nodes:
            target = n.next if isinstance(n, Collect | Reply) else None
            if isinstance(target, str) and target not in index:
                raise ValueError(f"Flow {self.name!r}: node {n.id!r} has next {target!r}, not a node id")
        if self.provider is None:
            talking = [n.id for n in nodes if isinstance(n, Reply)]
            if talking:
                raise ValueError(f"Flow {self.name!r}: reply nodes {talking} need a provider, got provider=None")
        if self.max_node_visits < 1:
            raise ValueError(f"Flow {self.name!r}: max_node_visits must be >= 1, got {self.max_node_visits}")
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "digest", json_digest(canonical_json(self.structure())))

    def structure(self) -> dict[str, Any]:
        """Return what the digest covers (issue 18 item 3): the name, ``start``, and per node its id and kind.

        Besides: a collect's schema, required fields and ``next``; a reply's ``next`` when static (a node id or an
        `End`); an action's ``version``.

        Returns:
            The structure, a JSON object.
        """

        def edge(target: Any) -> Any:
            if isinstance(target, str):
                return target
            if isinstance(target, End):
                return {"end": target.outcome}
            return None  # a function of the state: not a static edge

        nodes: list[dict[str, Any]] = []
        for n in self.nodes:
            if isinstance(n, Collect):
                nodes.append(
                    {
                        "id": n.id,
                        "kind": "collect",
                        "schema": n.schema,
                        "required": list(n.required),
                        "next": edge(n.next),
                    }
                )
            elif isinstance(n, Reply):
                nodes.append({"id": n.id, "kind": "reply", "next": edge(n.next)})
            else:
                nodes.append({"id": n.id, "kind": "action", "version": n.version})
        return {"name": self.name, "start": self.start, "nodes": nodes}

    def node(self, node_id: str) -> FlowNode:
        """Return the node ``node_id``.

        Args:
            node_id: A node id.

        Returns:
            The node.

        Raises:
            KeyError: No node has that id.
        """
        return self._index[node_id]
