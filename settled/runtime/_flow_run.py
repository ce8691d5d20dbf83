"""Running a `Flow` turn inside one run (issue 18 item 1): the machinery behind `settled/runtime/_flow.py`.

The turn walks the graph from the flow's ``start``. Its effects are the run's own (`RunContext`): ``collect``'s
extraction and each ``reply`` are ``ctx.model`` calls, an ``action``'s ``run`` uses ``ctx`` directly; each takes
the next ordinal when it is made, so a new attempt that walks the same graph over the same input gets every
recorded effect back at its ordinal and runs nothing recorded again (docs/semantics.md §9, DUR-008, DUR-010).

The turn's reply (canonical JSON):

* a ``collect`` lacking required fields: ``{"flow", "status": "waiting", "node", "ask", "missing", "invalid",
  "messages", "state"}`` (``invalid``: the values the schema refused, by field, each with its problem);
* an `End`: ``{"flow", "status": "completed", "outcome", "node", "messages", "state"}``;
* a `Handoff`: ``{"handoff": to, "reason": reason}`` (settled routes nothing).

``messages`` holds the texts of the ``reply`` nodes visited, in order; ``state`` the flow's state bag. A turn fails
(`RunFailedError`, not retried) when its flow is not registered (``unknown_flow``), an action returns anything but
`Goto`/`End`/`Handoff` or goes to a node that does not exist (``bad_flow_result``), or it visits more than
``max_node_visits`` nodes (``flow_loop``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from settled.processors import RunFailedError
from settled.protocol import FlowInvocation, bounded_text
from settled.runtime._context import RunContext
from settled.runtime._flow import Action, Collect, End, Flow, FlowNode, Goto, Handoff, Reply
from settled.runtime._model import Message
from settled.runtime._tools import invoke
from settled.schemas import canonical_json

_log = logging.getLogger(__name__)

__all__ = ["FlowTurn", "run_flow"]


def _user_text(value: Any) -> str:
    """The user's message of a turn's input: the string itself, else its canonical JSON."""
    return value if isinstance(value, str) else canonical_json(value)


class FlowTurn:
    """One attempt of one flow turn: the graph walked from ``start`` with the run's context.

    Args:
        ctx: The run's context.
        flow: The flow.
        invocation: What the submission asked for.
    """

    def __init__(self, ctx: RunContext, flow: Flow, invocation: FlowInvocation) -> None:
        self._ctx = ctx
        self.flow = flow
        self.input = invocation.input
        self.state: dict[str, Any] = {}
        self.messages: list[str] = []

    def _fail(self, code: str, detail: str) -> RunFailedError:
        return RunFailedError(code, bounded_text(f"flow {self.flow.name!r}: {detail}"))

    async def _extract(self, node: Collect) -> dict[str, Any]:
        """One recorded model call that extracts ``node``'s fields from the user's text; the object it answered."""
        assert self.flow.provider is not None
        instructions = (
            "Extract these fields from the user's message, as described by this JSON Schema: "
            f"{canonical_json(dict(node.schema))}. Answer with one JSON object holding only the fields the message "
            "gives, and nothing else."
        )
        response = await self._ctx.model(
            self.flow.provider,
            [Message("system", instructions), Message("user", _user_text(self.input))],
            model=self.flow.model,
        )
        try:
            answer = json.loads(response.text)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            _log.info(
                "flow collect: the model's extraction is not a JSON object; nothing taken from it",
                extra={"submission_id": self._ctx.submission_id, "node": node.id},
            )
            return {}
        return answer

    async def _collect(self, node: Collect) -> dict[str, Any] | None:
        """Take ``node``'s fields; return the waiting reply when required ones are missing, else None."""
        invalid: dict[str, str] = {}

        def take(source: Mapping[str, Any]) -> None:
            for name in node.properties:
                if name not in source or name in self.state:
                    continue
                problem = node.problem(name, source[name])
                if problem is None:
                    self.state[name] = source[name]
                    invalid.pop(name, None)
                else:
                    invalid[name] = problem

        if isinstance(self.input, dict):
            take(self.input)
        if self.flow.provider is not None and any(r not in self.state for r in node.required):
            take(await self._extract(node))
        missing = [r for r in node.required if r not in self.state]
        if not missing:
            return None
        return {
            "flow": self.flow.name,
            "status": "waiting",
            "node": node.id,
            "ask": node.question(missing),
            "missing": missing,
            "invalid": invalid,
            "messages": list(self.messages),
            "state": dict(self.state),
        }

    async def _reply(self, node: Reply) -> None:
        assert self.flow.provider is not None
        system = f"{node.instructions}\n\nThe flow's state: {canonical_json(self.state)}"
        response = await self._ctx.model(
            self.flow.provider,
            [Message("system", system), Message("user", _user_text(self.input))],
            model=self.flow.model,
        )
        self.messages.append(response.text)

    def _after(self, node: FlowNode, target: Any) -> str | End:
        if callable(target) and not isinstance(target, End):
            target = target(dict(self.state))
        if isinstance(target, End):
            return target
        if isinstance(target, str):
            try:
                self.flow.node(target)
            except KeyError:
                raise self._fail("bad_flow_result", f"node {node.id!r} goes to {target!r}, not a node id") from None
            return target
        raise self._fail("bad_flow_result", f"node {node.id!r}: next returned {target!r}, not a node id or an End")

    async def _action(self, node: Action) -> str | End | Handoff:
        result = await invoke(node.run, dict(self.state), self._ctx)
        if isinstance(result, End | Handoff):
            return result
        if not isinstance(result, Goto):
            raise self._fail(
                "bad_flow_result", f"action {node.id!r} returned {result!r}, not a Goto, an End or a Handoff"
            )
        if not isinstance(result.data, Mapping):
            raise self._fail("bad_flow_result", f"action {node.id!r}: Goto.data {result.data!r} is not an object")
        self.state.update(result.data)
        return self._after(node, result.node)

    async def run(self) -> dict[str, Any]:
        """Walk the graph from ``start`` until a ``collect`` lacks fields, an `End` or a `Handoff`.

        Returns:
            The turn's reply (module docstring).

        Raises:
            RunFailedError: ``bad_flow_result`` or ``flow_loop`` (module docstring).
        """
        at: str | End | Handoff = self.flow.start
        last = self.flow.start
        visits = 0
        while isinstance(at, str):
            visits += 1
            if visits > self.flow.max_node_visits:
                raise self._fail(
                    "flow_loop", f"the turn visited {self.flow.max_node_visits} nodes without ending (at {at!r})"
                )
            node = self.flow.node(at)
            last = at
            if isinstance(node, Collect):
                waiting = await self._collect(node)
                if waiting is not None:
                    return waiting
                at = self._after(node, node.next)
            elif isinstance(node, Reply):
                await self._reply(node)
                at = self._after(node, node.next)
            else:
                at = await self._action(node)
        if isinstance(at, Handoff):
            return {"handoff": at.to, "reason": at.reason}
        return {
            "flow": self.flow.name,
            "status": "completed",
            "outcome": at.outcome,
            "node": last,
            "messages": list(self.messages),
            "state": dict(self.state),
        }


async def run_flow(ctx: RunContext, flow: Flow | None, invocation: FlowInvocation) -> dict[str, Any]:
    """Run (or resume) the flow turn a submission names.

    Args:
        ctx: The run's context.
        flow: The registered flow of that name, or None.
        invocation: The submission's request.

    Returns:
        The turn's reply (`FlowTurn.run`).

    Raises:
        RunFailedError: No flow of that name is registered (``unknown_flow``; not retried), or the turn failed.
    """
    if flow is None:
        raise RunFailedError("unknown_flow", f"no flow named {invocation.name!r} is registered on the app")
    return await FlowTurn(ctx, flow, invocation).run()
