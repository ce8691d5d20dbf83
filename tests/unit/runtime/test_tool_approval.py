"""Tools that need approval without Kafka (issue 16 item 5): the pause before the tool runs, denials, parallel batches.

Effects go to the in-memory recorder of ``test_context``; the decision the owner would append is the
`WaitResolved` the protocol's `decide_approval` builds (its payload is `approval_payload`), handed to the next
attempt in its journal, as the conductor does.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from settled.processors import HistoryTurn, RunFailedError
from settled.protocol import approval_id_for, approval_payload, arguments_digest
from settled.runtime import (
    App,
    ApprovalVerdict,
    ModelAgent,
    ModelRequest,
    ModelResponse,
    RunCancelledError,
    RunContext,
    RunOptions,
    ScriptedProvider,
    ToolApprovalDeniedError,
    ToolCall,
    declared_call,
    denial_result,
    history_messages,
)
from settled.runtime._model import ScriptStep
from settled.schemas import (
    DecideApproval,
    LogEvent,
    SettlementOutcome,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
    canonical_json,
)
from tests._promise import promise
from tests.unit.runtime.test_context import T0, Recorder, attempt, run


def _decided(request: WaitRequested, *, approved: bool, key_id: str = "ops-1") -> WaitResolved:
    details = json.loads(request.details_json or "null")
    command = DecideApproval(
        command_id=f"d-{request.wait_id}",
        principal="supervisor",
        conversation_id="c1",
        submission_id=request.submission_id,
        approval_id=request.wait_id,
        args_digest=details["args_digest"],
        approved=approved,
        reason="within policy" if approved else "over the limit",
        key_id=key_id,
        signature=b"",
        requested_at=T0,
    )
    return WaitResolved(
        submission_id=request.submission_id,
        wait_id=request.wait_id,
        outcome=WaitOutcome.DELIVERED,
        source_id=command.command_id,
        payload_json=approval_payload(command),
        decided_at=T0,
    )


def _threshold(args: dict[str, Any]) -> ApprovalVerdict:
    return ApprovalVerdict.ASK if args["cents"] > 10000 else ApprovalVerdict.ALLOW


def _app(agent: Any, calls: list[str]) -> App:
    app = App(agent=agent, resolver_keys={"k": "x"}, options=RunOptions(clock=lambda: T0, settle_linger_s=0))

    @app.tool(idempotent=True, needs_approval=True, parallel_safe=True)
    def refund(args: dict[str, Any], call: ToolCall) -> str:
        """Refund an order."""
        calls.append(f"refund {args['cents']}")
        return "refunded"

    @app.tool(idempotent=True, approval_policy=_threshold)
    def refund_small(args: dict[str, Any], call: ToolCall) -> str:
        """Refund; a person approves above 100.00."""
        calls.append(f"refund_small {args['cents']}")
        return "refunded"

    @app.tool(idempotent=True, approval_policy=lambda args: "deny")
    def wipe(args: dict[str, Any], call: ToolCall) -> str:
        """Never allowed."""
        calls.append("wipe")
        return "wiped"

    @app.tool(idempotent=True, parallel_safe=True)
    def lookup(args: dict[str, Any], call: ToolCall) -> str:
        """Read-only."""
        calls.append(f"lookup {args['n']}")
        return f"found {args['n']}"

    @app.tool(idempotent=True, parallel_safe=True)
    async def slow_lookup(args: dict[str, Any], call: ToolCall) -> str:
        """Read-only, slow."""
        await asyncio.sleep(0.2)
        calls.append(f"slow_lookup {args['n']}")
        return f"found {args['n']} slowly"

    return app


async def _refund_agent(ctx: RunContext) -> Any:
    try:
        return {"result": await ctx.tool("refund", {"cents": 12000})}
    except ToolApprovalDeniedError as exc:
        return {"denied": [exc.tool, exc.by, exc.reason]}


def test_a_tool_that_needs_approval_runs_only_after_its_approval_is_canonical() -> None:
    """Fault switch ``tool_runs_before_approval`` (tests/fault_switches.toml) makes this fail."""
    calls: list[str] = []
    app = _app(_refund_agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError, match="waits for approval 'refund'"):
        run(app, attempt(rec))
    promise(
        "WAIT-003.tool-approved-before-run",
        calls == [] and not rec.of(ToolCallPrepared),
        f"the tool ran or was prepared before its approval was decided: calls={calls}, "
        f"prepared={rec.of(ToolCallPrepared)}",
    )
    [request] = rec.of(WaitRequested)
    assert rec.events == [request]
    approval_id = approval_id_for("s1", call_id="s1#0")
    assert (request.kind, request.name, request.wait_id, request.ordinal) == (
        WaitKind.APPROVAL,
        "refund",
        approval_id,
        0,
    )
    details = json.loads(request.details_json or "null")
    assert details["tool"] == "refund" and details["args_json"] == '{"cents":12000}'
    assert details["args_digest"] == arguments_digest('{"cents":12000}')
    assert details["description"] == "Refund an order."
    # The same attempt again (a replay with the request but no decision) asks for nothing and runs nothing.
    with pytest.raises(RunCancelledError, match="still open"):
        run(app, attempt(Recorder(), rec.events, n=2))
    assert calls == []
    journal: list[LogEvent] = [*rec.events, _decided(request, approved=True)]
    rec2 = Recorder()
    assert json.loads(run(app, attempt(rec2, journal, n=2))) == {"result": "refunded"}
    assert calls == ["refund 12000"]
    [prepared] = rec2.of(ToolCallPrepared)
    assert prepared.args_digest == details["args_digest"]  # the approval named exactly the call that ran
    # A later replay runs nothing again.
    assert json.loads(run(app, attempt(Recorder(), [*journal, *rec2.events], n=3))) == {"result": "refunded"}
    assert calls == ["refund 12000"]


def test_a_denied_call_never_runs_and_action_code_catches_who_denied_and_why() -> None:
    calls: list[str] = []
    app = _app(_refund_agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError):
        run(app, attempt(rec))
    [request] = rec.of(WaitRequested)
    journal = [*rec.events, _decided(request, approved=False)]
    rec2 = Recorder()
    assert json.loads(run(app, attempt(rec2, journal, n=2))) == {"denied": ["refund", "ops-1", "over the limit"]}
    assert calls == [] and rec2.events == []
    expired = WaitResolved(submission_id="s1", wait_id=request.wait_id, outcome=WaitOutcome.EXPIRED, decided_at=T0)
    assert json.loads(run(app, attempt(Recorder(), [*rec.events, expired], n=2))) == {
        "denied": ["refund", None, "deadline_expired"]
    }
    assert calls == []


def test_an_uncaught_denial_fails_the_run_not_retryable_with_type_approval_denied() -> None:
    calls: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("refund", {"cents": 12000})

    app = _app(agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError):
        run(app, attempt(rec))
    [request] = rec.of(WaitRequested)
    with pytest.raises(ToolApprovalDeniedError) as caught:
        run(app, attempt(Recorder(), [*rec.events, _decided(request, approved=False)], n=2))
    err = caught.value
    assert isinstance(err, RunFailedError) and err.non_retryable and err.error_type == "approval_denied"
    assert (err.tool, err.call_id, err.by, err.reason) == ("refund", "s1#0", "ops-1", "over the limit")
    assert calls == []


def test_a_deny_policy_never_pauses_and_a_threshold_policy_asks_only_above_it() -> None:
    calls: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        out: list[Any] = [await ctx.tool("refund_small", {"cents": 500})]
        try:
            await ctx.tool("wipe", {"all": True})
        except ToolApprovalDeniedError as exc:
            out.append([exc.by, exc.reason])
        out.append(await ctx.tool("refund_small", {"cents": 50000}))
        return out

    app = _app(agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError, match="waits for approval 'refund_small'"):
        run(app, attempt(rec))
    assert calls == ["refund_small 500"]  # below the threshold: no approval; wipe: denied by policy, never run
    [refused] = rec.of(ToolCallRefused)
    assert refused.tool == "wipe" and refused.reason.startswith("approval_denied: ")
    [request] = rec.of(WaitRequested)  # only the call above the threshold waits
    assert request.ordinal == 2 and json.loads(request.details_json or "null")["args_json"] == '{"cents":50000}'
    assert [type(e).__name__ for e in rec.events] == [
        "ToolCallPrepared",
        "ToolCallSettled",
        "ToolCallRefused",
        "WaitRequested",
    ]
    rec2 = Recorder()
    reply = json.loads(run(app, attempt(rec2, [*rec.events, _decided(request, approved=True)], n=2)))
    assert reply == ["refunded", ["policy", refused.reason], "refunded"]
    assert calls == ["refund_small 500", "refund_small 50000"]
    assert [type(e).__name__ for e in rec2.events] == ["ToolCallPrepared", "ToolCallSettled"]


def test_a_policy_answering_something_else_is_a_clear_error() -> None:
    app = App(agent=_refund_agent, resolver_keys={"k": "x"})

    @app.tool(idempotent=True, approval_policy=lambda args: "maybe")  # type: ignore[arg-type,return-value]
    def odd(args: dict[str, Any], call: ToolCall) -> str:
        return "x"

    with pytest.raises(ValueError, match=r"tool 'odd': approval_policy returned 'maybe'"):
        app.tools.get("odd").approval_verdict({})
    with pytest.raises(ValueError, match="not both"):
        app.tool(needs_approval=True, approval_policy=lambda args: "ask")(lambda args, call: None)


def test_a_gathers_other_calls_settle_before_it_suspends_and_none_runs_again_after_the_approval() -> None:
    calls: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        return list(
            await asyncio.gather(
                ctx.tool("slow_lookup", {"n": 1}), ctx.tool("refund", {"cents": 12000}), ctx.tool("lookup", {"n": 3})
            )
        )

    app = _app(agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError, match="waits for approval 'refund'"):
        run(app, attempt(rec))
    assert sorted(calls) == ["lookup 3", "slow_lookup 1"]
    kinds = [type(e).__name__ for e in rec.events]
    assert kinds[-1] == "WaitRequested" and kinds.count("ToolCallSettled") == 2, kinds  # siblings settled first
    [request] = rec.of(WaitRequested)
    assert request.ordinal == 1
    rec2 = Recorder()
    reply = json.loads(run(app, attempt(rec2, [*rec.events, _decided(request, approved=True)], n=2)))
    assert reply == ["found 1 slowly", "refunded", "found 3"]
    assert sorted(calls) == ["lookup 3", "refund 12000", "slow_lookup 1"]  # the siblings did not run again
    assert [type(e).__name__ for e in rec2.events] == ["ToolCallPrepared", "ToolCallSettled"]


def test_three_parallel_approvals_are_asked_together_and_each_decision_applies_to_its_own_call() -> None:
    calls: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        async def one(cents: int) -> Any:
            try:
                return await ctx.tool("refund", {"cents": cents})
            except ToolApprovalDeniedError as exc:
                return f"denied by {exc.by}"

        return list(await asyncio.gather(one(1), one(2), one(3)))

    app = _app(agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError):
        run(app, attempt(rec))
    requests = rec.of(WaitRequested)
    assert [r.ordinal for r in requests] == [0, 1, 2] and len(rec.batches) == 1  # one hand-over, three waits
    decisions = [
        _decided(requests[2], approved=True, key_id="k3"),
        _decided(requests[0], approved=False, key_id="k1"),
        _decided(requests[1], approved=True, key_id="k2"),
    ]
    reply = json.loads(run(app, attempt(Recorder(), [*rec.events, *decisions], n=2)))
    assert reply == ["denied by k1", "refunded", "refunded"]
    assert sorted(calls) == ["refund 2", "refund 3"]


def _model_script(request: ModelRequest) -> list[ScriptStep]:
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    turns = sum(1 for m in request.messages[last_user:] if m.role == "assistant")
    if turns == 0:
        calls = (declared_call("c1", "refund", {"cents": 12000}), declared_call("c2", "wipe", {"all": True}))
        return [ModelResponse("", calls, model="m1")]
    return [ModelResponse("told the user", model="m1")]


def test_a_model_receives_structured_denials_and_the_turn_goes_on() -> None:
    calls: list[str] = []
    provider = ScriptedProvider(_model_script)
    app = _app(ModelAgent(provider, model="m1"), calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError, match="waits for approval 'refund'"):
        run(app, attempt(rec))
    [request] = rec.of(WaitRequested)
    assert [type(e).__name__ for e in rec.events] == ["ModelResponseCompleted", "WaitRequested"]
    journal = [*rec.events, _decided(request, approved=False)]
    rec2 = Recorder()
    assert run(app, attempt(rec2, journal, n=2)) == canonical_json("told the user")
    assert calls == []
    prompt = provider.prompts[-1].messages
    tool_messages = [m for m in prompt if m.role == "tool"]
    expected = [
        ("c1", denial_result("refund", "ops-1", "over the limit")),
        ("c2", denial_result("wipe", "policy", rec2.of(ToolCallRefused)[0].reason)),
    ]
    assert [(m.call_id, json.loads(m.text)) for m in tool_messages] == expected
    assert not any(m.is_error for m in tool_messages)  # a denial is not a malfunction
    assert expected[0][1]["retry"] is False and "do not retry" in expected[0][1]["message"]
    # The settled run's history shows the same denials to the next submission's model.
    turn = HistoryTurn(
        submission_id="s1",
        input_json=canonical_json({"x": 1}),
        outcome=SettlementOutcome.COMPLETED,
        events=tuple([*journal, *rec2.events]),
    )
    shown = [(m.call_id, json.loads(m.text)) for m in history_messages([turn]) if m.role == "tool"]
    assert shown == expected
    assert not [e for e in rec2.events if isinstance(e, (ToolCallPrepared, ToolCallSettled))]


def _parallel_script(request: ModelRequest) -> list[ScriptStep]:
    last_user = max(i for i, m in enumerate(request.messages) if m.role == "user")
    if sum(1 for m in request.messages[last_user:] if m.role == "assistant") == 0:
        calls = (
            declared_call("c1", "slow_lookup", {"n": 1}),
            declared_call("c2", "refund", {"cents": 12000}),
            declared_call("c3", "lookup", {"n": 3}),
        )
        return [ModelResponse("", calls, model="m1")]
    return [ModelResponse("done", model="m1")]


def test_a_models_parallel_batch_settles_its_other_calls_before_it_waits_and_never_runs_them_again() -> None:
    calls: list[str] = []
    provider = ScriptedProvider(_parallel_script)
    app = _app(ModelAgent(provider, model="m1"), calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError, match="waits for approval 'refund'"):
        run(app, attempt(rec))
    assert sorted(calls) == ["lookup 3", "slow_lookup 1"]
    kinds = [type(e).__name__ for e in rec.events]
    assert kinds[-1] == "WaitRequested" and kinds.count("ToolCallSettled") == 2, kinds
    [request] = rec.of(WaitRequested)
    assert request.ordinal == 2  # the response at 0, the batch's calls at 1, 2, 3
    rec2 = Recorder()
    assert run(app, attempt(rec2, [*rec.events, _decided(request, approved=True)], n=2)) == canonical_json("done")
    assert sorted(calls) == ["lookup 3", "refund 12000", "slow_lookup 1"]
    tool_messages = [(m.call_id, m.text) for m in provider.prompts[-1].messages if m.role == "tool"]
    assert tool_messages == [("c1", '"found 1 slowly"'), ("c2", '"refunded"'), ("c3", '"found 3"')]
