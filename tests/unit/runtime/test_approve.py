"""``ctx.approve`` without Kafka (issue 16 item 4): an approval wait bound to its arguments' digest; a decision replays.

The decision the owner would append is built with the protocol's own `decide_approval` output shape
(`approval_payload`), as the conductor hands a `WaitResolved` to the next attempt.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from settled.protocol import approval_payload, arguments_digest
from settled.runtime import App, ApprovalDecision, RunCancelledError, RunContext, RunOptions, ToolCall
from settled.schemas import DecideApproval, LogEvent, WaitKind, WaitOutcome, WaitRequested, WaitResolved
from tests.unit.runtime.test_context import T0, Recorder, attempt, run


def _app(agent: Any, calls: list[str]) -> App:
    app = App(agent=agent, resolver_keys={"k": "x"}, options=RunOptions(clock=lambda: T0))

    @app.tool(idempotent=True)
    def refund(args: dict[str, Any], call: ToolCall) -> str:
        calls.append(f"refund {args['cents']}")
        return "refunded"

    return app


async def _agent(ctx: RunContext) -> Any:
    decision = await ctx.approve("refund", "refund 120.00 EUR of order o-7", deadline=timedelta(hours=1))
    if not decision.approved:
        return {"denied_by": decision.by, "reason": decision.reason}
    return {"by": decision.by, "result": await ctx.tool("refund", {"cents": 12000})}


def _approved(request: WaitRequested, *, approved: bool) -> WaitResolved:
    details = json.loads(request.details_json or "null")
    command = DecideApproval(
        command_id="d1",
        principal="supervisor",
        conversation_id="c1",
        submission_id=request.submission_id,
        approval_id=request.wait_id,
        args_digest=details["args_digest"],
        approved=approved,
        reason="ok" if approved else "over the limit",
        key_id="ops-1",
        signature=b"",
        requested_at=T0,
    )
    return WaitResolved(
        submission_id=request.submission_id,
        wait_id=request.wait_id,
        outcome=WaitOutcome.DELIVERED,
        source_id="d1",
        payload_json=approval_payload(command),
        decided_at=T0,
    )


def test_an_approval_is_a_wait_bound_to_its_arguments_and_the_tool_runs_only_after_it() -> None:
    calls: list[str] = []
    app = _app(_agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError, match="waits for approval 'refund'"):
        run(app, attempt(rec))
    [request] = rec.of(WaitRequested)
    assert isinstance(request, WaitRequested)
    assert rec.events[-1] is request
    assert (request.kind, request.name, request.wait_id) == (WaitKind.APPROVAL, "refund", "s1#w0")
    assert request.deadline == T0 + timedelta(hours=1)
    details = json.loads(request.details_json or "null")
    args = '{"description":"refund 120.00 EUR of order o-7","title":"refund"}'
    assert details["args_digest"] == arguments_digest(args) and details["args_json"] == args
    assert calls == []  # nothing ran before the decision
    journal: list[LogEvent] = [*rec.events, _approved(request, approved=True)]
    rec2 = Recorder()
    assert run(app, attempt(rec2, journal, n=2)) == '{"by":"ops-1","result":"refunded"}'
    assert not rec2.of(WaitRequested) and calls == ["refund 12000"]


def test_a_denial_and_an_expiry_are_decisions_the_run_reads() -> None:
    calls: list[str] = []
    app = _app(_agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError):
        run(app, attempt(rec))
    [request] = rec.of(WaitRequested)
    assert isinstance(request, WaitRequested)
    denied = run(app, attempt(Recorder(), [*rec.events, _approved(request, approved=False)], n=2))
    assert denied == '{"denied_by":"ops-1","reason":"over the limit"}'
    expiry = WaitResolved(
        submission_id="s1", wait_id=request.wait_id, outcome=WaitOutcome.EXPIRED, decided_at=T0 + timedelta(hours=1)
    )
    assert ApprovalDecision.of(expiry) == ApprovalDecision(approved=False, by=None, reason="deadline_expired")
    expired = run(app, attempt(Recorder(), [*rec.events, expiry], n=2))
    assert expired == '{"denied_by":null,"reason":"deadline_expired"}'
    assert calls == []  # denied or expired: the refund never ran
