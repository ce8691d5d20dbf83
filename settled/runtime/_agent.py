"""The default, model-driven agent (issue 6 item 2; docs/semantics.md §9, §10; DUR-008).

Each run: the prompt is the conversation's history (earlier settled submissions, see `history_messages`) plus the
submission's input as a user message; the model is called (`RunContext.model`: its completed response is canonical
before any tool it declares is prepared); the declared tool calls run in declaration order — in parallel only when
every one of them is parallel-safe — a call to a tool not offered for the turn is refused (``ToolCallRefused``) and
answered to the model as an error; a denied call of a tool that needs approval is answered with `denial_result`
(who denied it and why, do not retry: a result, not an error; issue 16 item 5); a call waiting for its approval ends
the attempt once the batch's calls before it settled (parallel-safe siblings: all of them), and the run resumes from
the declaration once it is decided; the results go back to the model; the loop ends when the model answers without
tool calls, and that answer is the reply.

Re-entry replays everything recorded (responses, tool results), so a committed response whose tool batch has no
prepared records resumes from its declaration without calling the model again; a stream cut mid-way left only
deltas, which never count as an assistant turn: the call is made again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Sequence
from typing import Any

from settled.processors import HistoryTurn, RunFailedError
from settled.protocol import approval_id_for
from settled.runtime._context import ApprovalDecision, RunContext
from settled.runtime._errors import APPROVAL_DENIED, ToolApprovalDeniedError, ToolCallError
from settled.runtime._model import Message, ModelProvider, ToolDeclaration, user_text
from settled.runtime._tools import POLICY_DENIER
from settled.schemas import (
    DeclaredToolCall,
    LogEvent,
    ModelResponseCompleted,
    ResolutionKind,
    ToolCallRefused,
    ToolCallSettled,
    UnknownResolved,
    WaitResolved,
    canonical_json,
)

__all__ = ["ModelAgent", "denial_result", "history_messages", "user_text"]


def denial_result(tool: str, by: str | None, reason: str | None) -> dict[str, Any]:
    """Return the structured denial a model receives as the result of a denied call (issue 16 item 5).

    A denial is not a malfunction: it is a result (not an error) that says who said no and that the call must not be
    retried, so the model can tell the user it was declined.

    Args:
        tool: The tool whose call was denied.
        by: Who denied it: an approver's key id, ``"policy"`` (the tool's approval policy), or None (the approval
            expired at its deadline).
        reason: Why, or None.

    Returns:
        ``{"denied": true, "tool", "by", "reason", "retry": false, "message"}``.
    """
    who = "nobody before its deadline" if by is None else ("its approval policy" if by == POLICY_DENIER else by)
    why = "" if not reason else f" ({reason})"
    return {
        "denied": True,
        "tool": tool,
        "by": by,
        "reason": reason,
        "retry": False,
        "message": f"The call to {tool!r} was not approved by {who}{why}. Tell the user it was declined; "
        "do not retry it.",
    }


def _tool_message(call: DeclaredToolCall, outcome: LogEvent) -> Message:
    if isinstance(outcome, ToolCallSettled):
        if outcome.error is not None:
            return Message(
                "tool", f"error: {outcome.error.type}: {outcome.error.message}", call_id=call.call_id, is_error=True
            )
        return Message("tool", outcome.result_json or "null", call_id=call.call_id)
    if isinstance(outcome, ToolCallRefused):
        if outcome.reason.startswith(f"{APPROVAL_DENIED}:"):
            denial = denial_result(call.tool, POLICY_DENIER, outcome.reason)
            return Message("tool", canonical_json(denial), call_id=call.call_id)
        return Message("tool", f"error: refused: {outcome.reason}", call_id=call.call_id, is_error=True)
    if isinstance(outcome, WaitResolved):  # a denied approval (issue 16 item 5)
        decision = ApprovalDecision.of(outcome)
        return Message(
            "tool", canonical_json(denial_result(call.tool, decision.by, decision.reason)), call_id=call.call_id
        )
    assert isinstance(outcome, UnknownResolved)
    return Message("tool", outcome.result_json or "null", call_id=call.call_id)


def _turn_messages(run_id: str, events: Sequence[LogEvent]) -> list[Message]:
    """The complete assistant turns and tool results of one run's record, in order."""
    outcomes: dict[str, LogEvent] = {}
    denial_prefix = approval_id_for(run_id, call_id="")
    for e in events:
        if isinstance(e, (ToolCallSettled, ToolCallRefused)):
            outcomes[e.call_id] = e
        elif isinstance(e, WaitResolved) and e.wait_id.startswith(denial_prefix):
            if not ApprovalDecision.of(e).approved:  # a denied call never runs: the denial is its outcome
                outcomes[e.wait_id.removeprefix(denial_prefix)] = e
        elif isinstance(e, UnknownResolved) and e.kind is ResolutionKind.CALL_OUTCOME:
            outcomes[e.call_id] = e
    out: list[Message] = []
    for e in events:
        if not isinstance(e, ModelResponseCompleted):
            continue  # deltas of a cut stream never form an assistant turn (docs/semantics.md §9)
        ids = [f"{run_id}#{e.response_ordinal + 1 + i}" for i in range(len(e.tool_calls))]
        if not all(i in outcomes for i in ids):
            # an incomplete batch: its declaration and partial results are never shown again (docs/semantics.md §10)
            break
        out.append(Message("assistant", e.text, e.tool_calls))
        out.extend(_tool_message(call, outcomes[i]) for call, i in zip(e.tool_calls, ids, strict=True))
    return out


def history_messages(history: Iterable[HistoryTurn]) -> list[Message]:
    """The prompt's history: each earlier submission's input and its complete turns (docs/semantics.md §10).

    Every run shows its input and its complete turns, in order, up to its first incomplete tool batch (a failed or
    aborted run's last one): never that batch's orphan declaration or partial results (docs/semantics.md §10).

    Args:
        history: The conversation's settled submissions, oldest first.

    Returns:
        The messages.
    """
    out: list[Message] = []
    for turn in history:
        out.append(Message("user", user_text(turn.input_json)))
        out.extend(_turn_messages(turn.submission_id, turn.events))
    return out


class ModelAgent:
    """The default agent: model → tools → model … until the model answers without tools (module docstring).

    Args:
        provider: The model provider.
        model: The model name.
        system: An optional system instruction, first in every prompt.
        max_turns: Model calls per run before the run fails (a loop guard).

    Attributes:
        needs_history: True: the app keeps the conversation's history for this agent.
    """

    needs_history = True

    def __init__(
        self, provider: ModelProvider, *, model: str = "default", system: str | None = None, max_turns: int = 16
    ) -> None:
        if max_turns < 1:
            raise ValueError(f"ModelAgent.max_turns must be >= 1, got {max_turns}")
        self.provider = provider
        self.model = model
        self.system = system
        self.max_turns = max_turns

    def _declarations(self, ctx: RunContext, offered: Sequence[str]) -> tuple[ToolDeclaration, ...]:
        out = []
        for name in offered:
            spec = ctx.tools.get(name)
            out.append(ToolDeclaration(name=name, description=spec.model_description, parameters=spec.parameters))
        return tuple(out)

    async def __call__(self, ctx: RunContext) -> Any:
        """One run: see the module docstring. Returns the model's final text."""
        offered = tuple(ctx.tools_offered) or tuple(sorted(spec.name for spec in ctx.tools))
        declarations = self._declarations(ctx, [n for n in offered if n in {s.name for s in ctx.tools}])
        messages: list[Message] = [Message("system", self.system)] if self.system else []
        messages += history_messages(ctx.history)
        messages.append(Message("user", user_text(ctx.input_json)))
        for _ in range(self.max_turns):
            response = await ctx.model(self.provider, messages, tools=declarations, model=self.model)
            messages.append(Message("assistant", response.text, response.tool_calls))
            if not response.tool_calls:
                return response.text
            messages.extend(await self._run_calls(ctx, response.tool_calls, offered))
        raise RunFailedError(
            "max_turns", f"the model still called tools after {self.max_turns} turns", non_retryable=True
        )

    async def _run_calls(
        self, ctx: RunContext, calls: Sequence[DeclaredToolCall], offered: Sequence[str]
    ) -> list[Message]:
        # Ordinals are reserved in declaration order (the history maps call i to response ordinal + 1 + i).
        pending = [ctx.tool(c.tool, json.loads(c.args_json), offered=offered) for c in calls]
        known = {s.name: s for s in ctx.tools}
        parallel = all(c.tool in known and known[c.tool].parallel_safe for c in calls)
        results: list[Any] = []
        if parallel:
            results = list(await asyncio.gather(*pending, return_exceptions=True))
        else:
            try:
                for awaitable in pending:
                    try:
                        results.append(await awaitable)
                    except (ToolCallError, ToolApprovalDeniedError) as exc:
                        results.append(exc)
            finally:
                for unstarted in pending[len(results) + 1 :]:
                    unstarted.close()  # coroutines the run stopped before
        out = []
        for call, result in zip(calls, results, strict=True):
            if isinstance(result, ToolApprovalDeniedError):  # not an error: the model is told who said no
                denial = denial_result(result.tool, result.by, result.reason)
                out.append(Message("tool", canonical_json(denial), call_id=call.call_id))
            elif isinstance(result, ToolCallError):
                out.append(
                    Message(
                        "tool", f"error: {result.error_type}: {result.message}", call_id=call.call_id, is_error=True
                    )
                )
            elif isinstance(result, BaseException):
                raise result
            else:
                out.append(Message("tool", canonical_json(result), call_id=call.call_id))
        return out
