"""``ctx.signal`` without Kafka (issue 16 item 3): the wait is the run's last record; a decision replays.

Effects go to the in-memory recorder of ``test_context``; the next attempt gets the recorded events, plus the
owner's `WaitResolved` (as the conductor hands them over), as its journal.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

from settled.runtime import App, RunCancelledError, RunContext, RunOptions, ToolCall, WaitExpiredError
from settled.schemas import (
    LogEvent,
    ToolCallPrepared,
    ToolCallSettled,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
)
from tests.unit.runtime.test_context import T0, Recorder, attempt, run


def _app(agent: Any, calls: list[str]) -> App:
    app = App(agent=agent, resolver_keys={"k": "x"}, options=RunOptions(clock=lambda: T0))

    @app.tool(idempotent=True, parallel_safe=True)
    def slow(args: dict[str, Any], call: ToolCall) -> str:
        time.sleep(0.2)
        calls.append("slow")
        return "slow done"

    @app.tool(idempotent=True, parallel_safe=True)
    def fast(args: dict[str, Any], call: ToolCall) -> str:
        calls.append("fast")
        return "fast done"

    return app


def _decided(request: WaitRequested, outcome: WaitOutcome, payload_json: str | None = None) -> WaitResolved:
    return WaitResolved(
        submission_id=request.submission_id,
        wait_id=request.wait_id,
        outcome=outcome,
        source_id="g1" if outcome is WaitOutcome.DELIVERED else None,
        payload_json=payload_json,
        decided_at=T0,
    )


def test_a_wait_is_the_runs_last_record_and_the_next_attempt_returns_the_delivered_payload() -> None:
    calls: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        paid = await ctx.signal("paid", deadline=timedelta(seconds=30))
        return {"paid": paid, "tool": await ctx.tool("fast", {})}

    app = _app(agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError, match="waits for signal 'paid'"):
        run(app, attempt(rec))
    [request] = rec.of(WaitRequested)
    assert rec.events[-1] is request
    assert (request.kind, request.name, request.ordinal, request.wait_id) == (WaitKind.SIGNAL, "paid", 0, "s1#w0")
    assert request.deadline == T0 + timedelta(seconds=30)
    assert calls == []
    journal: list[LogEvent] = [*rec.events, _decided(request, WaitOutcome.DELIVERED, '{"cents":250}')]
    rec2 = Recorder()
    reply = run(app, attempt(rec2, journal, n=2))
    assert reply == '{"paid":{"cents":250},"tool":"fast done"}'
    assert not rec2.of(WaitRequested)  # replayed, not asked again
    assert calls == ["fast"]


def test_an_expired_wait_raises_wait_expired_error_live_and_on_replay() -> None:
    async def agent(ctx: RunContext) -> Any:
        try:
            return await ctx.signal("paid")
        except WaitExpiredError as exc:
            return {"expired": exc.name}

    app = _app(agent, [])
    rec = Recorder()
    with pytest.raises(RunCancelledError):
        run(app, attempt(rec))
    [request] = rec.of(WaitRequested)
    assert request.deadline is None
    journal = [*rec.events, _decided(request, WaitOutcome.EXPIRED)]
    assert run(app, attempt(Recorder(), journal, n=2)) == '{"expired":"paid"}'


def test_calls_beside_a_wait_settle_before_it_is_handed_over_and_never_run_again() -> None:
    calls: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        return await asyncio.gather(ctx.tool("slow", {}), ctx.signal("go"), ctx.tool("fast", {}))

    app = _app(agent, calls)
    rec = Recorder()
    with pytest.raises(RunCancelledError):
        run(app, attempt(rec))
    kinds = [type(e) for e in rec.events]
    assert kinds.index(WaitRequested) == len(kinds) - 1  # after both settlements
    assert len(rec.of(ToolCallSettled)) == 2 and len(rec.of(ToolCallPrepared)) == 2
    assert sorted(calls) == ["fast", "slow"]
    [request] = rec.of(WaitRequested)
    journal = [*rec.events, _decided(request, WaitOutcome.DELIVERED, '"ok"')]
    reply = run(app, attempt(Recorder(), journal, n=2))
    assert reply == '["slow done","ok","fast done"]'
    assert sorted(calls) == ["fast", "slow"]  # neither ran again


def test_parallel_waits_are_handed_over_in_one_batch() -> None:
    async def agent(ctx: RunContext) -> Any:
        return await asyncio.gather(ctx.signal("a"), ctx.signal("b"))

    rec = Recorder()
    with pytest.raises(RunCancelledError):
        run(_app(agent, []), attempt(rec))
    assert [[type(e) for e in b] for b in rec.batches] == [[WaitRequested, WaitRequested]]


def test_a_naive_deadline_is_refused_naming_it() -> None:
    async def agent(ctx: RunContext) -> Any:
        return await ctx.signal("paid", deadline=T0.replace(tzinfo=None))

    with pytest.raises(ValueError, match=r"deadline .* is naive"):
        run(_app(agent, []), attempt(Recorder()))
