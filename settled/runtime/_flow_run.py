"""Running a flow run's turn (issue 18 items 1-2): the machinery behind `settled/runtime/_flow.py`.

A flow run is a sequence of turns (submissions) of one conversation: the one that opens it (its input
`settled.protocol.flow_input`; the owner minted its run id, `settled.protocol.flow_run_id_for`) and the later ones
that resume it (`settled.protocol.flow_resume_input`). A turn walks the graph from the flow's ``start`` over every
turn of the run in order: each earlier turn (from `RunContext.history`: its input and its recorded effects) is
replayed up to the ``collect`` where it parked, then the walk goes on with the next turn's input, and the current
turn's effects run. Effects are the run's own (`RunContext`): ``collect``'s extraction and each ``reply`` are
``ctx.model`` calls, an ``action``'s ``run`` uses ``ctx`` directly; each takes the next ordinal when it is made and
the ordinals continue across the run's turns, so a later turn (or a new attempt after a crash) gets every recorded
effect back at its ordinal and runs nothing recorded again (docs/semantics.md §9, DUR-008, DUR-010). While an
earlier turn is replayed the context's run id is that turn's submission id (the key of its recorded calls, waits
and approvals); the current turn's new effects are keyed by its own.

The opening turn's first record pins the flow's digest (``StepRecorded`` ``flow-pin``, issue 18 item 3); every
later walk reads it back before any node, and another digest than the deployed flow's fails the turn with
`FlowDriftError` (nothing recorded; such a refused turn is left out of later walks). An operator's turn
(``settled flows abandon|restart``) ends the run: ``abandon`` runs no node; ``restart`` walks the deployed flow as
the opening turn of a new run (minted for the restart turn) with the old run's opening input.

Each node the walk enters is recorded once, as a ``StepRecorded`` named ``flow:<node id>`` (its result
``{"flow", "node", "run_id"}``), buffered: it commits with the run's next record, at no extra commit. The parked
run's state is therefore in the log: the turns' inputs, their effects and the node records, which is what
``ProjectionReader.flow_run`` reads back (status, flow, node, what it waits for).

The turn's reply (canonical JSON):

* a ``collect`` lacking required fields: ``{"flow", "run_id", "status": "waiting", "node", "ask", "missing",
  "invalid", "messages", "state"}`` (``invalid``: the values the schema refused, by field, each with its problem);
  the run is parked there until its next turn;
* an `End`: ``{"flow", "run_id", "status": "completed", "outcome", "node", "messages", "state"}``;
* a `Handoff`: ``{"handoff": to, "reason": reason}`` (settled routes nothing).

``messages`` holds the texts of the ``reply`` nodes this turn visited, in order; ``state`` the flow's state bag. A
turn fails (`RunFailedError`, not retried) when its flow is not registered (``unknown_flow``), its run's earlier
turns are not in the history the worker keeps (``unknown_flow_run``), the run already ended (an earlier turn ended
it or did not complete: ``flow_run_ended``), an action returns anything but `Goto`/`End`/`Handoff` or goes to a node
that does not exist (``bad_flow_result``), or it visits more than ``max_node_visits`` nodes (``flow_loop``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from settled._faults import fault_enabled
from settled.processors import RunFailedError
from settled.protocol import FlowInvocation, bounded_text, flow_invocation, flow_run_id_for
from settled.runtime._context import RunContext, _describe, _Journal
from settled.runtime._errors import ReplayDivergenceError
from settled.runtime._flow import Action, Collect, End, Flow, FlowDriftError, FlowNode, Goto, Handoff, Reply
from settled.runtime._model import Message
from settled.runtime._tools import invoke
from settled.schemas import LogEvent, SettlementOutcome, StepRecorded, canonical_json, json_digest

_log = logging.getLogger(__name__)

__all__ = ["NODE_PREFIX", "FlowTurn", "run_flow"]

#: The record-name prefix of a node the walk entered (module docstring).
NODE_PREFIX = "flow:"

#: The name of the record that pins the flow's digest when a run opens (``{"flow", "digest", "run_id"}``).
PIN_NAME = "flow-pin"


def _user_text(value: Any) -> str:
    """The user's message of a turn's input: the string itself, else its canonical JSON."""
    return value if isinstance(value, str) else canonical_json(value)


@dataclass(frozen=True)
class _Turn:
    """One turn of a flow run, as the walk replays or runs it."""

    submission_id: str
    input: Any
    outcome: SettlementOutcome | None  # None: the current turn
    events: tuple[LogEvent, ...] = ()


@dataclass(frozen=True)
class _Parked:
    """An earlier turn's walk reached the collect where it parked: the walk goes on with the next turn from there."""

    node: str


class FlowTurn:
    """One attempt of one turn of a flow run: every turn of the run walked in order, the current one run.

    Args:
        ctx: The run's context.
        flow: The flow.
        run_id: The flow run's id.
        turns: The run's turns in order, the current one last.
    """

    def __init__(self, ctx: RunContext, flow: Flow, run_id: str, turns: Sequence[_Turn]) -> None:
        self._ctx = ctx
        self.flow = flow
        self.run_id = run_id
        self._turns = tuple(turns)
        self._turn = self._turns[-1]
        self.input: Any = None
        self.state: dict[str, Any] = {}
        self.messages: list[str] = []
        earlier = [e for t in self._turns[:-1] for e in t.events]
        if earlier:
            # The earlier turns' effects at their ordinals (they continue across the run's turns), then this turn's.
            ctx._journal = _Journal([*earlier, *ctx._run.journal])
            ctx._replay_until = max(ctx._journal.by_ordinal, default=-1)

    def _fail(self, code: str, detail: str) -> RunFailedError:
        return RunFailedError(code, bounded_text(f"flow {self.flow.name!r} run {self.run_id!r}: {detail}"))

    @property
    def _current(self) -> bool:
        return self._turn is self._turns[-1]

    def _enter(self, node: FlowNode) -> None:
        """Record that the walk entered ``node`` (once: a replay finds the record at its ordinal)."""
        ctx = self._ctx
        ordinal = ctx._next_ordinal()
        name = NODE_PREFIX + node.id
        rec = ctx._recorded(ordinal)
        if rec is not None:
            if not (isinstance(rec, StepRecorded) and rec.name == name):
                raise ReplayDivergenceError(ordinal, _describe(rec), f"flow node {node.id!r}")
            return
        if not self._current:
            raise ReplayDivergenceError(
                ordinal, "nothing", f"flow node {node.id!r} of turn {self._turn.submission_id!r}"
            )
        result_json = canonical_json({"flow": self.flow.name, "node": node.id, "run_id": self.run_id})
        ctx._pipeline.buffer.append(
            StepRecorded(
                submission_id=ctx.submission_id,
                attempt_id=ctx.attempt_id,
                name=name,
                version=1,
                step_id=json_digest(canonical_json([ctx.run_id, ordinal, "step", name])),
                ordinal=ordinal,
                result_json=result_json,
                result_digest=json_digest(result_json),
            )
        )

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
            "run_id": self.run_id,
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

    async def _walk(self, at: str) -> dict[str, Any] | _Parked:
        """Walk one turn from node ``at``: its reply, or `_Parked` for an earlier turn that parked at a collect."""
        where: str | End | Handoff = at
        last = at
        visits = 0
        while isinstance(where, str):
            visits += 1
            if visits > self.flow.max_node_visits:
                raise self._fail(
                    "flow_loop", f"the turn visited {self.flow.max_node_visits} nodes without ending (at {where!r})"
                )
            node = self.flow.node(where)
            last = where
            self._enter(node)
            if isinstance(node, Collect):
                waiting = await self._collect(node)
                if waiting is not None:
                    return waiting if self._current else _Parked(node.id)
                where = self._after(node, node.next)
            elif isinstance(node, Reply):
                await self._reply(node)
                where = self._after(node, node.next)
            else:
                where = await self._action(node)
        if not self._current:
            raise self._fail(
                "flow_run_ended", f"the run ended in its turn {self._turn.submission_id!r}; a new turn cannot resume it"
            )
        if isinstance(where, Handoff):
            return {"handoff": where.to, "reason": where.reason}
        return {
            "flow": self.flow.name,
            "run_id": self.run_id,
            "status": "completed",
            "outcome": where.outcome,
            "node": last,
            "messages": list(self.messages),
            "state": dict(self.state),
        }

    def _pin(self) -> None:
        """Pin the flow's digest when the run opens, or check the pin (issue 18 item 3), before any node.

        The pin is the opening turn's first record (its first ordinal).

        Raises:
            FlowDriftError: The run pinned another digest than the deployed flow's.
        """
        ctx = self._ctx
        ordinal = ctx._next_ordinal()
        rec = ctx._recorded(ordinal)
        if rec is not None:
            if not (isinstance(rec, StepRecorded) and rec.name == PIN_NAME):
                raise ReplayDivergenceError(ordinal, _describe(rec), f"the pin of flow {self.flow.name!r}")
            pinned = json.loads(rec.result_json).get("digest")
            if pinned != self.flow.digest and not fault_enabled("flow_drift_unchecked"):
                raise FlowDriftError(self.run_id, self.flow.name, str(pinned), self.flow.digest)
            return
        if not self._current:
            raise ReplayDivergenceError(ordinal, "nothing", f"the pin of flow {self.flow.name!r}")
        result_json = canonical_json({"flow": self.flow.name, "digest": self.flow.digest, "run_id": self.run_id})
        ctx._pipeline.buffer.append(
            StepRecorded(
                submission_id=ctx.submission_id,
                attempt_id=ctx.attempt_id,
                name=PIN_NAME,
                version=1,
                step_id=json_digest(canonical_json([ctx.run_id, ordinal, "step", PIN_NAME])),
                ordinal=ordinal,
                result_json=result_json,
                result_digest=json_digest(result_json),
            )
        )

    async def run(self) -> dict[str, Any]:
        """Walk the run's turns in order from ``start``; run the current one until it parks or the flow ends.

        Returns:
            The turn's reply (module docstring).

        Raises:
            FlowDriftError: The run is pinned to another digest than the deployed flow's (no node ran).
            RunFailedError: ``flow_run_ended``, ``bad_flow_result`` or ``flow_loop`` (module docstring).
        """
        ctx = self._ctx
        own_run_id = ctx.run_id
        at = self.flow.start
        try:
            for index, turn in enumerate(self._turns):
                self._turn = turn
                self.input = turn.input
                self.messages = []
                ctx.run_id = own_run_id if self._current else turn.submission_id  # the key of that turn's effects
                if index == 0:
                    self._pin()
                walked = await self._walk(at)
                if not isinstance(walked, _Parked):
                    return walked
                at = walked.node
            raise AssertionError("unreachable: the current turn returns or raises")  # pragma: no cover
        finally:
            ctx.run_id = own_run_id


@dataclass(frozen=True)
class _Earlier:
    """A settled turn of the conversation that names a flow (its envelope read back)."""

    submission_id: str
    invocation: FlowInvocation
    outcome: SettlementOutcome
    events: tuple[LogEvent, ...]


def _flow_turns(ctx: RunContext) -> list[_Earlier]:
    out: list[_Earlier] = []
    for h in ctx.history:
        try:
            invocation = flow_invocation(h.input_json)
        except ValueError:
            continue  # never admitted as a flow turn (the owner refuses a malformed envelope)
        if invocation is not None:
            out.append(_Earlier(h.submission_id, invocation, h.outcome, h.events))
    return out


def _opening(ctx: RunContext, earlier: list[_Earlier], run_id: str) -> tuple[str, Any, str] | None:
    """The run's flow name, opening input and opening turn (a restart's opening input is its old run's)."""
    for e in earlier:
        if flow_run_id_for(ctx.conversation_id, e.submission_id) != run_id:
            continue
        if e.invocation.run_id is None and e.invocation.name is not None:
            return e.invocation.name, e.invocation.input, e.submission_id
        if e.invocation.operator == "restart" and e.invocation.run_id is not None:
            old = _opening(ctx, earlier, e.invocation.run_id)
            return None if old is None else (old[0], old[1], e.submission_id)
    return None


def _ended(ctx: RunContext, earlier: list[_Earlier], run_id: str, opening_id: str) -> None:
    """Raise ``flow_run_ended`` when an operator ended the run or one of its turns failed after acting."""
    for e in earlier:
        if e.invocation.run_id != run_id or e.submission_id == opening_id:
            continue
        if e.invocation.operator is not None:
            verb = "abandoned" if e.invocation.operator == "abandon" else "restarted"
            raise RunFailedError("flow_run_ended", f"flow run {run_id!r} was {verb} by turn {e.submission_id!r}")


def _run_turns(ctx: RunContext, earlier: list[_Earlier], run_id: str, opening: tuple[str, Any, str]) -> list[_Turn]:
    """The run's earlier turns in order, its opening turn first.

    A later turn that failed having recorded nothing (a drift refusal: it ran no node) is left out.
    """
    _, opening_input, opening_id = opening
    turns: list[_Turn] = []
    for e in earlier:
        if e.submission_id == opening_id:
            turns.append(_Turn(e.submission_id, opening_input, e.outcome, e.events))
        elif e.invocation.run_id == run_id and e.invocation.operator is None:
            if e.outcome is not SettlementOutcome.COMPLETED and not e.events:
                continue
            if e.outcome is not SettlementOutcome.COMPLETED:
                raise RunFailedError(
                    "flow_run_ended", f"flow run {run_id!r}: its turn {e.submission_id!r} settled {e.outcome.value}"
                )
            turns.append(_Turn(e.submission_id, e.invocation.input, e.outcome, e.events))
    return turns


async def run_flow(ctx: RunContext, flows: Mapping[str, Flow], invocation: FlowInvocation) -> dict[str, Any]:
    """Run the flow run turn a submission names: opening, resuming, abandoning or restarting a run.

    Args:
        ctx: The run's context.
        flows: The registered flows by name.
        invocation: The submission's request.

    Returns:
        The turn's reply (`FlowTurn.run`; an abandon's is ``{"flow", "run_id", "status": "abandoned"}``, a
        restart's is the new run's first turn with ``restarted_from``).

    Raises:
        RunFailedError: No flow of that name is registered (``unknown_flow``), the run's opening turn is not in the
            history (``unknown_flow_run``), the run ended (``flow_run_ended``), or the turn failed (not retried).
        FlowDriftError: The run is pinned to another digest than the deployed flow's (no node ran).
    """
    earlier = _flow_turns(ctx)
    current_run = flow_run_id_for(ctx.conversation_id, ctx.submission_id)
    if invocation.run_id is None:
        name, opening, run_id = invocation.name, None, current_run
        turns = [_Turn(ctx.submission_id, invocation.input, None)]
    else:
        found = _opening(ctx, earlier, invocation.run_id)
        if found is None:
            raise RunFailedError(
                "unknown_flow_run",
                f"flow run {invocation.run_id!r}: its opening turn is not in the history this worker keeps "
                "(App.keep_history)",
            )
        _ended(ctx, earlier, invocation.run_id, found[2])
        name, opening, run_id = found[0], found, invocation.run_id
        if invocation.operator == "abandon":
            return {"flow": name, "run_id": run_id, "status": "abandoned"}
        if invocation.operator == "restart":
            turns, run_id = [_Turn(ctx.submission_id, found[1], None)], current_run
        else:
            turns = [*_run_turns(ctx, earlier, run_id, found), _Turn(ctx.submission_id, invocation.input, None)]
    flow = flows.get(name or "")
    if flow is None:
        raise RunFailedError("unknown_flow", f"no flow named {name!r} is registered on the app")
    reply = await FlowTurn(ctx, flow, run_id, turns).run()
    if invocation.operator == "restart" and opening is not None:
        reply["restarted_from"] = invocation.run_id
    return reply
