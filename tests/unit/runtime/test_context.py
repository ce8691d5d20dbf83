"""RunContext without Kafka: effects go to an in-memory recorder that commits at once; a new attempt replays them.

The recorder stands where the conductor stands (`AgentRun.record`): it keeps the events in order and resolves
each future when "committed". Replay is exercised by starting the next attempt with the recorded events as its
journal, exactly what the conductor hands a new attempt (issue 6; docs/design.md §3, §5; DUR-009, DUR-010).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from settled.processors import AgentRun, CancelSignal
from settled.runtime import (
    App,
    ReplayDivergenceError,
    RunCancelledError,
    RunContext,
    RunOptions,
    ToolCall,
    ToolCallError,
    ToolRefusedError,
    ToolTransportError,
    ToolUnavailableError,
    UnsafeReplayError,
    UnsafeToolsError,
    execute,
    recovered,
)
from settled.schemas import (
    RESULT_TOO_LARGE,
    EffectKind,
    EffectRecorded,
    LogEvent,
    RecoveryDecision,
    RecoveryDecisionKind,
    ResolutionKind,
    StepRecorded,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    ToolCallUnknown,
    UnknownResolved,
    canonical_json,
    json_digest,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class Recorder:
    """Commits every batch at once; ``batches`` is the log in order."""

    def __init__(self) -> None:
        self.batches: list[tuple[LogEvent, ...]] = []
        self.lock = threading.Lock()

    def __call__(self, events: Sequence[LogEvent]) -> Future[None]:
        with self.lock:
            self.batches.append(tuple(events))
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @property
    def events(self) -> list[LogEvent]:
        return [e for b in self.batches for e in b]

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def attempt(
    recorder: Recorder, journal: Sequence[LogEvent] = (), n: int = 1, tools_offered: tuple[str, ...] = ()
) -> AgentRun:
    return AgentRun(
        conversation_id="c1",
        submission_id="s1",
        attempt_id=f"a{n}",
        attempt=n,
        input_json=canonical_json({"x": 1}),
        owner_epoch=7,
        cancelled=CancelSignal(),
        run_id="s1",
        tools_offered=tools_offered,
        journal=tuple(journal),
        record=recorder,
    )


def abort_when(started: threading.Event, agent_run: AgentRun) -> None:
    started.wait(5)
    agent_run.cancelled.set()


def run(app: App, agent_run: AgentRun) -> Any:
    return execute(app.agent, app.tools, app.options, agent_run)


class World:
    """The outside world of the tools: invocations and effects, counted."""

    def __init__(self) -> None:
        self.invocations: list[tuple[str, str, int]] = []  # (tool, key, epoch)
        self.effects: dict[str, int] = {}
        self.lock = threading.Lock()

    def invoked(self, call: ToolCall) -> int:
        with self.lock:
            self.invocations.append((call.tool, call.idempotency_key, call.owner_epoch))
            return sum(1 for t, k, _ in self.invocations if k == call.idempotency_key)


def make_app(agent: Any, world: World, **options: Any) -> App:
    app = App(agent=agent, resolver_keys={"k": "x"}, options=RunOptions(clock=lambda: T0, **options))

    @app.tool(idempotent=True, parallel_safe=True)
    def charge(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        world.invoked(call)
        with world.lock:
            world.effects[call.idempotency_key] = world.effects.get(call.idempotency_key, 0) + 1
        return {"charged": args["amount"]}

    @app.tool
    def send(args: dict[str, Any], call: ToolCall) -> str:
        world.invoked(call)
        return "sent"

    @app.tool
    def boom(args: dict[str, Any], call: ToolCall) -> str:
        world.invoked(call)
        raise ValueError("boom")

    return app


# ------------------------------------------------------------------------------------------------------ tools


def test_a_tool_call_is_prepared_then_settled_and_gets_its_key_and_epoch() -> None:
    world, rec = World(), Recorder()

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("charge", {"amount": 5})

    reply = run(make_app(agent, world), attempt(rec))
    assert reply == canonical_json({"charged": 5})
    assert [type(b[0]) for b in rec.batches] == [ToolCallPrepared, ToolCallSettled]  # two commits, in order
    (prepared,) = rec.of(ToolCallPrepared)
    assert prepared.ordinal == 0 and prepared.call_id == "s1#0" and prepared.owner_epoch == 7
    assert world.invocations == [("charge", prepared.idempotency_key, 7)]
    (settled,) = rec.of(ToolCallSettled)
    assert settled.result_json == canonical_json({"charged": 5}) and settled.attempt_id == "a1"


def test_replay_returns_the_recorded_result_without_running_the_tool() -> None:
    world, rec = World(), Recorder()

    async def agent(ctx: RunContext) -> Any:
        return [await ctx.tool("charge", {"amount": 5}), await ctx.tool("send", {"to": "bob"})]

    app = make_app(agent, world)
    first = run(app, attempt(rec))
    again = Recorder()
    assert run(app, attempt(again, rec.events, n=2)) == first
    assert len(world.invocations) == 2 and again.batches == []


def test_two_runs_with_the_same_call_never_share_a_key() -> None:
    world = World()

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("charge", {"amount": 5})

    app = make_app(agent, world)
    run(app, attempt(Recorder()))
    other = attempt(Recorder())
    run(app, AgentRun(**{**other.__dict__, "submission_id": "s2", "run_id": "s2"}))
    keys = {k for _, k, _ in world.invocations}
    assert len(keys) == 2  # ordinals are scoped to one run: the key includes the run id


def test_an_application_error_is_recorded_and_re_raised_identically_on_replay() -> None:
    world, rec = World(), Recorder()
    seen: list[tuple[str, str]] = []

    async def agent(ctx: RunContext) -> Any:
        try:
            await ctx.tool("boom")
        except ToolCallError as exc:
            seen.append((exc.error_type, exc.message))
            return "handled"
        return "no error"

    app = make_app(agent, world)
    assert run(app, attempt(rec)) == '"handled"'
    (settled,) = rec.of(ToolCallSettled)
    assert settled.error is not None and settled.error.type == "ValueError" and settled.error.message == "boom"
    assert run(app, attempt(Recorder(), rec.events, n=2)) == '"handled"'
    assert seen == [("ValueError", "boom"), ("ValueError", "boom")]
    assert len(world.invocations) == 1


def test_another_tool_at_a_recorded_ordinal_is_a_divergence_naming_both() -> None:
    world, rec = World(), Recorder()

    async def before(ctx: RunContext) -> Any:
        return await ctx.tool("charge", {"amount": 5})

    async def after(ctx: RunContext) -> Any:
        return await ctx.tool("send", {"amount": 5})

    run(make_app(before, world), attempt(rec))
    with pytest.raises(ReplayDivergenceError) as info:
        run(make_app(after, world), attempt(Recorder(), rec.events, n=2))
    assert info.value.ordinal == 0
    assert "'charge'" in info.value.expected and "'send'" in info.value.actual
    assert "ordinal 0" in str(info.value) and info.value.non_retryable


def test_other_arguments_at_a_recorded_ordinal_are_a_divergence() -> None:
    world, rec = World(), Recorder()

    def agent_with(amount: int) -> Any:
        async def agent(ctx: RunContext) -> Any:
            return await ctx.tool("charge", {"amount": amount})

        return agent

    run(make_app(agent_with(5), world), attempt(rec))
    with pytest.raises(ReplayDivergenceError, match="ordinal 0"):
        run(make_app(agent_with(6), world), attempt(Recorder(), rec.events, n=2))


def test_a_prepared_call_is_never_re_run_unless_declared_safe() -> None:
    world, rec = World(), Recorder()

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("send", {"to": "bob"})

    app = make_app(agent, world)
    run(app, attempt(rec))
    prepared_only = [e for e in rec.events if isinstance(e, ToolCallPrepared)]
    with pytest.raises(UnsafeReplayError, match="refusing to re-run"):
        run(app, attempt(Recorder(), prepared_only, n=2))
    assert len(world.invocations) == 1
    decision = RecoveryDecision(
        submission_id="s1", attempt_id="a1", decision=RecoveryDecisionKind.SAFE_RETRY, reason="r", call_ids=("s1#0",)
    )
    again = Recorder()
    assert run(app, attempt(again, [*prepared_only, decision], n=2)) == '"sent"'
    (re_prepared,) = again.of(ToolCallPrepared)
    assert re_prepared.idempotency_key == prepared_only[0].idempotency_key and re_prepared.attempt_id == "a2"


def test_an_unknown_call_resolved_with_its_outcome_returns_it_without_running() -> None:
    world, rec = World(), Recorder()

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("send", {"to": "bob"})

    app = make_app(agent, world)
    run(app, attempt(rec))
    prepared = rec.of(ToolCallPrepared)
    result = canonical_json("resolved")
    resolution = UnknownResolved(
        command_id="cmd",
        submission_id="s1",
        call_id="s1#0",
        kind=ResolutionKind.CALL_OUTCOME,
        result_json=result,
        result_digest=json_digest(result),
        principal="ops",
        key_id="k",
    )
    unknown = ToolCallUnknown(submission_id="s1", call_id="s1#0", reason="timeout")
    assert run(app, attempt(Recorder(), [*prepared, unknown, resolution], n=2)) == result
    assert len(world.invocations) == 1


def test_a_tool_not_offered_is_refused_recorded_and_never_run() -> None:
    world, rec = World(), Recorder()

    async def agent(ctx: RunContext) -> Any:
        try:
            await ctx.tool("send", {"to": "bob"})
        except ToolRefusedError as exc:
            return exc.message
        return "ran"

    app = make_app(agent, world)
    reply = run(app, attempt(rec, tools_offered=("charge",)))
    assert "not_offered" in reply and world.invocations == []
    (refused,) = rec.of(ToolCallRefused)
    assert refused.tool == "send"
    assert run(app, attempt(Recorder(), rec.events, n=2, tools_offered=("charge",))) == reply


# ------------------------------------------------------------------------------------------ in doubt, retries


def test_an_idempotent_call_in_doubt_is_retried_under_the_same_key() -> None:
    rec = Recorder()
    keys: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("flaky", {})

    app = App(agent=agent, options=RunOptions(retry_backoff_s=0.001))

    @app.tool(idempotent=True)
    def flaky(args: dict[str, Any], call: ToolCall) -> str:
        keys.append(call.idempotency_key)
        if len(keys) < 3:
            raise ConnectionRefusedError("tool server down")
        return "ok"

    assert run(app, attempt(rec)) == '"ok"'
    assert len(set(keys)) == 1 and len(keys) == 3
    assert len(rec.of(ToolCallPrepared)) == 1 and len(rec.of(ToolCallSettled)) == 1
    assert all(e.error is None for e in rec.of(ToolCallSettled))  # no connection error recorded as a result


def test_an_idempotent_call_in_doubt_past_its_budget_ends_the_attempt_with_the_call_prepared() -> None:
    rec = Recorder()

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("down", {})

    app = App(agent=agent, options=RunOptions(retry_backoff_s=0.01))

    @app.tool(idempotent=True, retry_budget_s=0.1)
    def down(args: dict[str, Any], call: ToolCall) -> str:
        raise ToolTransportError("connection reset")

    with pytest.raises(ToolUnavailableError, match="stayed in doubt"):
        run(app, attempt(rec))
    assert [type(e) for e in rec.events] == [ToolCallPrepared]


@pytest.mark.parametrize("failure", ["transport", "timeout"])
def test_a_non_idempotent_call_in_doubt_is_marked_unknown_and_the_run_stops(failure: str) -> None:
    rec = Recorder()
    invocations: list[int] = []
    after: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        try:
            await ctx.tool("pay", {})
        except Exception:  # noqa: BLE001 - the test checks that agent code cannot swallow the stop
            after.append("swallowed")
        return "continued"

    app = App(agent=agent, resolver_keys={"k": "x"})

    @app.tool(timeout_s=0.2)
    def pay(args: dict[str, Any], call: ToolCall) -> str:
        invocations.append(1)
        if failure == "timeout":
            time.sleep(2)
        raise ConnectionResetError("reset by peer")

    with pytest.raises(RunCancelledError, match="Unknown"):
        run(app, attempt(rec))
    assert [type(e) for e in rec.events] == [ToolCallPrepared, ToolCallUnknown]
    assert invocations == [1] and after == []
    assert "neither idempotent nor reconcilable" in rec.of(ToolCallUnknown)[0].reason


def test_a_hung_idempotent_call_is_retried_after_its_timeout() -> None:
    rec = Recorder()
    calls: list[str] = []

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("slow", {})

    app = App(agent=agent, options=RunOptions(retry_backoff_s=0.001))

    @app.tool(idempotent=True, timeout_s=0.2)
    def slow(args: dict[str, Any], call: ToolCall) -> str:
        calls.append(call.idempotency_key)
        if len(calls) == 1:
            time.sleep(1.0)
        return "late but fine"

    assert run(app, attempt(rec)) == '"late but fine"'
    assert len(calls) == 2 and len(set(calls)) == 1


def test_a_reconcilable_call_in_doubt_settles_with_the_recovered_result() -> None:
    rec = Recorder()

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("transfer", {"n": 1})

    app = App(agent=agent)

    def check(key: str, args: dict[str, Any]) -> Any:
        return recovered({"transfer": key[:8]})

    @app.tool(reconcile=check)
    def transfer(args: dict[str, Any], call: ToolCall) -> str:
        raise ToolTransportError("lost answer")

    reply = run(app, attempt(rec))
    (settled,) = rec.of(ToolCallSettled)
    assert settled.result_json == reply and "transfer" in reply


def test_an_oversized_result_is_recorded_as_result_too_large_with_its_digest() -> None:
    rec = Recorder()

    async def agent(ctx: RunContext) -> Any:
        try:
            return await ctx.tool("big", {})
        except ToolCallError as exc:
            return exc.error_type

    app = App(agent=agent, options=RunOptions(max_result_bytes=100))

    @app.tool(idempotent=True)
    def big(args: dict[str, Any], call: ToolCall) -> str:
        return "x" * 1000

    assert run(app, attempt(rec)) == canonical_json(RESULT_TOO_LARGE)
    (settled,) = rec.of(ToolCallSettled)
    assert settled.result_json is None and settled.result_digest == json_digest(canonical_json("x" * 1000))


# -------------------------------------------------------------------------------------------- parallel effects


def test_parallel_calls_reserve_ordinals_in_call_order_and_replay_aligns() -> None:
    world, rec = World(), Recorder()

    async def agent(ctx: RunContext) -> Any:
        return await asyncio.gather(*(ctx.tool("wait", {"s": s}) for s in (0.3, 0.1, 0.2)))

    app = App(agent=agent)
    active: list[int] = [0, 0]  # now, max

    @app.tool(idempotent=True, parallel_safe=True)
    async def wait(args: dict[str, Any], call: ToolCall) -> float:
        world.invoked(call)
        active[0] += 1
        active[1] = max(active)
        await asyncio.sleep(args["s"])
        active[0] -= 1
        return float(args["s"])

    assert run(app, attempt(rec)) == "[0.3,0.1,0.2]"
    assert active[1] == 3  # parallel-safe calls overlap
    finished = [e.call_id for e in rec.of(ToolCallSettled)]
    assert finished == ["s1#1", "s1#2", "s1#0"]  # finish order differs from ordinal order
    assert run(app, attempt(Recorder(), rec.events, n=2)) == "[0.3,0.1,0.2]"
    assert len(world.invocations) == 3


def test_calls_that_are_not_parallel_safe_run_one_at_a_time() -> None:
    rec = Recorder()
    active: list[int] = [0, 0]

    async def agent(ctx: RunContext) -> Any:
        return await asyncio.gather(*(ctx.tool("solo", {"i": i}) for i in range(3)))

    app = App(agent=agent)

    @app.tool(idempotent=True)
    async def solo(args: dict[str, Any], call: ToolCall) -> int:
        active[0] += 1
        active[1] = max(active)
        await asyncio.sleep(0.05)
        active[0] -= 1
        return int(args["i"])

    assert run(app, attempt(rec)) == "[0,1,2]"
    assert active[1] == 1


# ------------------------------------------------------------------------------------------------- now / uuid


def test_now_and_uuid_are_recorded_with_the_next_effect_and_identical_on_replay() -> None:
    world, rec = World(), Recorder()
    clock = [T0]

    async def agent(ctx: RunContext) -> Any:
        t, u = ctx.now(), ctx.uuid()
        await ctx.tool("charge", {"amount": 1})
        return [t.isoformat(), str(u)]

    app = App(agent=agent, options=RunOptions(clock=lambda: clock[0]))
    app.tools.register(make_app(agent, world).tools.get("charge"))
    first = run(app, attempt(rec))
    assert [type(e) for e in rec.batches[0]] == [EffectRecorded, EffectRecorded, ToolCallPrepared]
    clock[0] = T0 + timedelta(hours=1)
    assert run(app, attempt(Recorder(), rec.events, n=2)) == first


def test_buffered_values_are_committed_before_the_reply() -> None:
    rec = Recorder()

    async def agent(ctx: RunContext) -> Any:
        return str(ctx.uuid())

    reply = run(App(agent=agent), attempt(rec))
    (effect,) = rec.of(EffectRecorded)
    assert effect.kind is EffectKind.UUID and canonical_json(effect.value) == reply
    uuid.UUID(effect.value)


def test_a_recorded_now_where_the_code_asks_for_a_uuid_is_a_divergence() -> None:
    rec = Recorder()

    async def before(ctx: RunContext) -> Any:
        return ctx.now().isoformat()

    async def after(ctx: RunContext) -> Any:
        return str(ctx.uuid())

    run(App(agent=before), attempt(rec))
    with pytest.raises(ReplayDivergenceError, match=r"records ctx.now\(\), the code asked for ctx.uuid\(\)"):
        run(App(agent=after), attempt(Recorder(), rec.events, n=2))


# --------------------------------------------------------------------------------------------------- steps


def test_a_step_records_one_success_and_a_failure_is_not_recorded() -> None:
    rec = Recorder()
    bodies: list[int] = []

    def body(x: int) -> int:
        bodies.append(x)
        if len(bodies) == 1:
            raise RuntimeError("transient")
        return x * 2

    async def agent(ctx: RunContext) -> Any:
        return await ctx.step("double", body, 21, version=2)

    app = App(agent=agent)
    with pytest.raises(RuntimeError, match="transient"):
        run(app, attempt(rec))
    assert rec.events == []  # a failure is not recorded (DUR-010)
    assert run(app, attempt(rec, n=2)) == "42"
    (step,) = rec.of(StepRecorded)
    assert (step.name, step.version, step.ordinal, step.result_json) == ("double", 2, 0, "42")
    assert run(app, attempt(Recorder(), rec.events, n=3)) == "42"
    assert bodies == [21, 21]  # the replay did not run the body


def test_a_changed_step_version_is_a_divergence() -> None:
    rec = Recorder()

    def agent_v(version: int) -> Any:
        async def agent(ctx: RunContext) -> Any:
            return await ctx.step("s", lambda: 1, version=version)

        return agent

    run(App(agent=agent_v(1)), attempt(rec))
    with pytest.raises(ReplayDivergenceError, match=r"step 's' version 1.*step 's' version 2"):
        run(App(agent=agent_v(2)), attempt(Recorder(), rec.events, n=2))


# ------------------------------------------------------------------------------------------------ cancellation


def test_an_abort_gives_a_call_in_flight_its_grace_to_settle() -> None:
    rec = Recorder()
    started = threading.Event()

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("slow", {})

    app = App(agent=agent, options=RunOptions(abort_grace_s=5.0))

    @app.tool(idempotent=True)
    def slow(args: dict[str, Any], call: ToolCall) -> str:
        started.set()
        time.sleep(0.3)
        return "done"

    agent_run = attempt(rec)
    threading.Thread(target=abort_when, args=(started, agent_run), daemon=True).start()
    with pytest.raises(RunCancelledError):
        run(app, agent_run)
    assert [type(e) for e in rec.events] == [ToolCallPrepared, ToolCallSettled]


def test_past_the_grace_the_call_stays_prepared_and_its_late_return_records_nothing() -> None:
    rec = Recorder()
    started, returned = threading.Event(), threading.Event()

    async def agent(ctx: RunContext) -> Any:
        return await ctx.tool("slow", {})

    app = App(agent=agent, options=RunOptions(abort_grace_s=0.1), resolver_keys={"k": "x"})

    @app.tool
    def slow(args: dict[str, Any], call: ToolCall) -> str:
        started.set()
        time.sleep(0.5)
        returned.set()
        return "late"

    agent_run = attempt(rec)
    threading.Thread(target=abort_when, args=(started, agent_run), daemon=True).start()
    with pytest.raises(RunCancelledError):
        run(app, agent_run)
    assert returned.wait(5)
    time.sleep(0.1)
    assert [type(e) for e in rec.events] == [ToolCallPrepared]


# ---------------------------------------------------------------------------------------------------- the app


def test_the_app_refuses_unsafe_tools_without_a_resolver() -> None:
    async def agent(ctx: RunContext) -> Any:
        return None

    app = App(agent=agent)

    @app.tool
    def pay(args: dict[str, Any], call: ToolCall) -> None:
        return None

    with pytest.raises(UnsafeToolsError, match=r"\['pay'\].*DUR-017"):
        app.check()
    App(agent=agent, resolver_keys={"k": "x"}, tools=app.tools).check()
    with pytest.raises(ValueError, match="already registered"):
        app.tool(pay, name="pay")
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        app.tool(pay, name="other", timeout_s=0)
