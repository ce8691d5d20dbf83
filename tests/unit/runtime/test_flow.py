"""Flows without Kafka (issue 18 item 1): a flow turn's records go to an in-memory recorder; a new attempt gets them
back, as in `tests/unit/runtime/test_workflow.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from settled.processors import AgentRun, CancelSignal, HistoryTurn, RunFailedError
from settled.protocol import flow_input, flow_invocation, flow_operator_input, flow_resume_input, flow_run_id_for
from settled.runtime import (
    App,
    End,
    Flow,
    FlowDriftError,
    Goto,
    Handoff,
    ModelRequest,
    ModelResponse,
    RunContext,
    RunOptions,
    ScriptedProvider,
    ToolCall,
    action,
    collect,
    reply,
)
from settled.runtime._model import ScriptStep
from settled.schemas import (
    LogEvent,
    ModelResponseCompleted,
    SettlementOutcome,
    StepRecorded,
    ToolCallPrepared,
    ToolCallSettled,
    canonical_json,
)
from tests._promise import promise
from tests.unit.runtime.test_context import Recorder

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RUN = flow_run_id_for("c1", "s1")  # the run the tests' opening turn (submission s1 of conversation c1) opens

AMOUNT_SCHEMA = {"type": "object", "properties": {"amount": {"type": "number"}, "note": {"type": "string"}}}


def attempt(recorder: Recorder, n: int, input_value: Any, journal: Sequence[LogEvent] = ()) -> AgentRun:
    return AgentRun(
        conversation_id="c1",
        submission_id="s1",
        attempt_id=f"a{n}",
        attempt=n,
        input_json=canonical_json(input_value),
        owner_epoch=1,
        cancelled=CancelSignal(),
        run_id="s1",
        journal=tuple(journal),
        record=recorder,
    )


def talk(request: ModelRequest) -> list[ScriptStep]:
    """The scripted model: an extraction answers ``{"amount": 12.5}``; a reply echoes its instructions' first word."""
    system = request.messages[0].text
    if system.startswith("Extract"):
        return [ModelResponse('{"amount": 12.5}')]
    return [ModelResponse(f"said: {system.split()[0]}")]


def refund_app(provider: ScriptedProvider, refunds: list[float], crash: dict[str, bool] | None = None) -> App:
    """The seed's refund flow without the approval: collect the amount, refund it, confirm."""
    app = App(agent=None, resolver_keys={"k": "x"}, options=RunOptions(clock=lambda: T0))

    @app.tool(idempotent=True)
    def process_refund(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        refunds.append(args["amount"])
        return {"refunded": args["amount"]}

    async def issue_refund(state: dict[str, Any], ctx: RunContext) -> Goto | End | Handoff:
        receipt = await ctx.tool("process_refund", {"amount": state["amount"]})
        if crash is not None and crash["on"]:
            raise RuntimeError("crash after the refund")
        return Goto("confirmed", {"receipt": receipt})

    app.flow(
        Flow(
            "refund",
            description="Collect an amount, refund it, confirm",
            start="collect_amount",
            nodes=[
                collect(
                    "collect_amount",
                    schema=AMOUNT_SCHEMA,
                    required=["amount"],
                    ask=lambda missing: f"What {' and '.join(missing)} should the refund be for?",
                    next="issue_refund",
                ),
                action("issue_refund", issue_refund),
                reply("confirmed", "Confirm the refund.", next=End("refunded")),
            ],
            provider=provider,
            model="m1",
        )
    )
    return app


def test_the_envelope_round_trips_and_a_malformed_one_names_the_field() -> None:
    invocation = flow_invocation(canonical_json(flow_input("refund", {"amount": 5})))
    assert invocation is not None and (invocation.name, invocation.input) == ("refund", {"amount": 5})
    assert flow_invocation(canonical_json({"amount": 5})) is None
    with pytest.raises(ValueError, match=r"input\.settled_flow\.name must be a non-empty string, got 7"):
        flow_invocation(canonical_json({"settled_flow": {"name": 7}}))
    with pytest.raises(ValueError, match="flow name must be a non-empty string, got ' '"):
        flow_input(" ", None)


def test_collect_takes_json_fields_then_the_action_and_reply_run_and_the_flow_ends() -> None:
    provider, rec = ScriptedProvider(talk), Recorder()
    refunds: list[float] = []
    app = refund_app(provider, refunds)
    reply_json = app.runner()(attempt(rec, 1, flow_input("refund", {"amount": 40, "note": "late"})))
    assert reply_json == canonical_json(
        {
            "flow": "refund",
            "run_id": RUN,
            "status": "completed",
            "outcome": "refunded",
            "node": "confirmed",
            "messages": ["said: Confirm"],
            "state": {"amount": 40, "note": "late", "receipt": {"refunded": 40}},
        }
    )
    assert refunds == [40]
    # The input held every required field: no extraction call, one reply call, shown the state.
    assert [p.messages[0].text.split()[0] for p in provider.prompts] == ["Confirm"]
    assert '"receipt":{"refunded":40}' in provider.prompts[0].messages[0].text
    assert len(rec.of(ModelResponseCompleted)) == 1 and len(rec.of(ToolCallSettled)) == 1


def test_a_collect_lacking_fields_settles_with_the_question_and_runs_nothing_after_it() -> None:
    refunds: list[float] = []
    app = refund_app(ScriptedProvider(talk), refunds)
    app.flows.clear()
    no_model = Flow(
        "refund",
        description="",
        start="collect_amount",
        nodes=[
            collect(
                "collect_amount",
                AMOUNT_SCHEMA,
                ["amount", "note"],
                ask=lambda missing: f"What {' and '.join(missing)}?",
                next=End("x"),
            )
        ],
    )
    app.flow(no_model)
    rec = Recorder()
    out = app.runner()(attempt(rec, 1, flow_input("refund", {"amount": "ten"})))
    assert out == canonical_json(
        {
            "flow": "refund",
            "run_id": RUN,
            "status": "waiting",
            "node": "collect_amount",
            "ask": "What amount and note?",
            "missing": ["amount", "note"],
            "invalid": {"amount": "field 'amount': 'ten' is not of type number"},
            "messages": [],
            "state": {},
        }
    )
    assert refunds == [] and rec.of(ToolCallPrepared) == [] and rec.of(ModelResponseCompleted) == []


def test_with_a_provider_collect_extracts_missing_fields_in_one_recorded_model_call() -> None:
    provider, rec = ScriptedProvider(talk), Recorder()
    refunds: list[float] = []
    app = refund_app(provider, refunds)
    out = app.runner()(attempt(rec, 1, flow_input("refund", "Please refund twelve fifty")))
    assert refunds == [12.5]
    assert [p.messages[0].text.split()[0] for p in provider.prompts] == ["Extract", "Confirm"]
    assert provider.prompts[0].messages[1].text == "Please refund twelve fifty"
    assert [r.text for r in rec.of(ModelResponseCompleted)] == ['{"amount": 12.5}', "said: Confirm"]
    assert '"outcome":"refunded"' in out


def test_a_new_attempt_replays_the_recorded_tool_and_model_calls_and_runs_nothing_twice() -> None:
    provider, rec = ScriptedProvider(talk), Recorder()
    refunds: list[float] = []
    crash = {"on": True}
    app = refund_app(provider, refunds, crash)
    envelope = flow_input("refund", "refund 12.5 please")
    with pytest.raises(RuntimeError, match="crash after the refund"):
        app.runner()(attempt(rec, 1, envelope))
    assert refunds == [12.5] and len(provider.prompts) == 1  # the extraction, then the refund; then the crash
    crash["on"] = False
    first = list(rec.events)
    out = app.runner()(attempt(rec, 2, envelope, first))
    assert refunds == [12.5], "the recorded refund is not run again"
    assert [p.messages[0].text.split()[0] for p in provider.prompts] == ["Extract", "Confirm"]  # extraction replayed
    assert '"receipt":{"refunded":12.5}' in out
    assert len(rec.of(ToolCallSettled)) == 1 and len(rec.of(ModelResponseCompleted)) == 2


def test_a_handoff_completes_the_turn_with_its_reply() -> None:
    async def hand(state: dict[str, Any], ctx: RunContext) -> Handoff:
        return Handoff("human", "declined")

    app = App(agent=None)
    app.flow(Flow("h", description="", start="a", nodes=[action("a", hand)]))
    out = app.runner()(attempt(Recorder(), 1, flow_input("h", {})))
    assert out == canonical_json({"handoff": "human", "reason": "declined"})


def test_a_reply_next_function_decides_from_the_state() -> None:
    def route(state: dict[str, Any]) -> str | End:
        return End("big") if state["amount"] > 10 else End("small")

    app = App(agent=None)
    app.flow(
        Flow(
            "r",
            description="",
            start="c",
            nodes=[collect("c", AMOUNT_SCHEMA, ["amount"], "how much?", next="say"), reply("say", "Say it.", route)],
            provider=ScriptedProvider(talk),
        )
    )
    assert '"outcome":"big"' in app.runner()(attempt(Recorder(), 1, flow_input("r", {"amount": 11})))
    assert '"outcome":"small"' in app.runner()(attempt(Recorder(), 1, flow_input("r", {"amount": 1})))


def test_bad_results_loops_and_unknown_flows_fail_the_turn_naming_them() -> None:
    async def nowhere(state: dict[str, Any], ctx: RunContext) -> Goto:
        return Goto("missing")

    async def junk(state: dict[str, Any], ctx: RunContext) -> Any:
        return {"goto": "b"}

    async def spin(state: dict[str, Any], ctx: RunContext) -> Goto:
        return Goto("loop", {"n": state.get("n", 0) + 1})

    app = App(agent=None)
    app.flow(Flow("nowhere", description="", start="a", nodes=[action("a", nowhere)]))
    app.flow(Flow("junk", description="", start="a", nodes=[action("a", junk)]))
    app.flow(Flow("loop", description="", start="loop", nodes=[action("loop", spin)], max_node_visits=5))
    cases = {
        "nowhere": ("bad_flow_result", "node 'a' goes to 'missing', not a node id"),
        "junk": ("bad_flow_result", "returned {'goto': 'b'}, not a Goto, an End or a Handoff"),
        "loop": ("flow_loop", "visited 5 nodes without ending"),
        "absent": ("unknown_flow", "no flow named 'absent'"),
    }
    for name, (code, text) in cases.items():
        with pytest.raises(RunFailedError, match=text) as failed:
            app.runner()(attempt(Recorder(), 1, flow_input(name, {})))
        assert failed.value.error_type == code


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Flow("f", "", "zz", [action("a", print)]), "start 'zz' is not a node id"),
        (lambda: Flow("f", "", "a", [action("a", print), action("a", print)]), r"node ids \['a'\] repeat"),
        (lambda: Flow("f", "", "a", [reply("a", "hi", next="b")]), "node 'a' has next 'b', not a node id"),
        (lambda: Flow("f", "", "a", [reply("a", "hi", next=End("x"))]), r"reply nodes \['a'\] need a provider"),
        (lambda: collect("c", {"properties": {"a": {"type": "decimal"}}}, [], "?", next=End("x")), "'decimal'"),
        (lambda: collect("c", AMOUNT_SCHEMA, ["total"], "?", next=End("x")), r"required \['total'\]"),
        (lambda: collect("c", {"type": "object"}, [], "?", next=End("x")), "schema.properties must be"),
        (lambda: action("a b", print), "action id 'a b'"),
        (lambda: action("a", print, version=0), "version must be an int >= 1, got 0"),
        (lambda: Flow("f", "", "a", []), "nodes must not be empty"),
    ],
)
def test_a_bad_definition_is_refused_naming_the_field_and_value(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_registering_two_flows_of_one_name_is_refused() -> None:
    app = App(agent=None)
    app.flow(Flow("f", "", "a", [action("a", print)]))
    with pytest.raises(ValueError, match="a flow named 'f' is already registered"):
        app.flow(Flow("f", "", "a", [action("a", print)]))


# -------------------------------------------------------------------------------- flow runs spanning turns (item 2)


def turn(recorder: Recorder, submission_id: str, input_value: Any, history: Sequence[HistoryTurn] = ()) -> AgentRun:
    return AgentRun(
        conversation_id="c1",
        submission_id=submission_id,
        attempt_id=f"{submission_id}-a1",
        attempt=1,
        input_json=canonical_json(input_value),
        owner_epoch=1,
        cancelled=CancelSignal(),
        run_id=submission_id,
        record=recorder,
        history=tuple(history),
    )


def settled_turn(recorder: Recorder, submission_id: str, input_value: Any) -> HistoryTurn:
    """A settled turn as the conductor's history hands it over: its input and its committed effects."""
    events = tuple(e for e in recorder.events if getattr(e, "submission_id", None) == submission_id)
    return HistoryTurn(submission_id, canonical_json(input_value), SettlementOutcome.COMPLETED, events)


def charge_then_ask_app(charges: list[str], *, version: int = 1, description: str = "") -> App:
    """A flow whose action charges, then a collect asks for a note, then it ends."""
    app = App(agent=None, resolver_keys={"k": "x"}, options=RunOptions(clock=lambda: T0))

    @app.tool(idempotent=True)
    def charge(args: dict[str, Any], call: ToolCall) -> dict[str, Any]:
        charges.append(call.idempotency_key)
        return {"charged": args["amount"]}

    async def pay(state: dict[str, Any], ctx: RunContext) -> Goto:
        return Goto("ask", {"receipt": await ctx.tool("charge", {"amount": 5})})

    note = {"type": "object", "properties": {"note": {"type": "string"}}}
    app.flow(
        Flow(
            "pay",
            description=description,
            start="pay",
            nodes=[action("pay", pay, version=version), collect("ask", note, ["note"], "Any note?", next=End("done"))],
        )
    )
    return app


def test_a_later_turn_resumes_the_parked_run_and_gets_the_recorded_outcomes_back() -> None:
    charges: list[str] = []
    app = charge_then_ask_app(charges)
    rec = Recorder()
    opening = flow_input("pay", {})
    first = json.loads(app.runner()(turn(rec, "s1", opening)))
    assert first["status"] == "waiting" and first["node"] == "ask" and first["run_id"] == RUN
    assert len(charges) == 1
    later = flow_resume_input(RUN, {"note": "thanks"})
    second = json.loads(app.runner()(turn(rec, "s2", later, [settled_turn(rec, "s1", opening)])))
    assert second == {
        "flow": "pay",
        "run_id": RUN,
        "status": "completed",
        "outcome": "done",
        "node": "ask",
        "messages": [],
        "state": {"receipt": {"charged": 5}, "note": "thanks"},
    }
    assert len(charges) == 1, "the charge recorded in the first turn is replayed, not run again"
    # Ordinals continue across the run's turns; every node entered is recorded once per turn that entered it.
    s1 = [e.ordinal for e in rec.events if isinstance(e, StepRecorded | ToolCallPrepared) and e.submission_id == "s1"]
    s2 = [e.ordinal for e in rec.events if isinstance(e, StepRecorded | ToolCallPrepared) and e.submission_id == "s2"]
    assert s2 and min(s2) > max(s1), (s1, s2)
    names = [(e.submission_id, e.name) for e in rec.of(StepRecorded)]
    assert names == [("s1", "flow-pin"), ("s1", "flow:pay"), ("s1", "flow:ask"), ("s2", "flow:ask")]


def test_a_turn_of_a_run_that_ended_fails_and_runs_nothing() -> None:
    charges: list[str] = []
    app = charge_then_ask_app(charges)
    rec = Recorder()
    opening = flow_input("pay", {"note": "at once"})
    assert '"outcome":"done"' in app.runner()(turn(rec, "s1", opening))
    with pytest.raises(RunFailedError, match="the run ended in its turn 's1'") as ended:
        app.runner()(turn(rec, "s2", flow_resume_input(RUN, {}), [settled_turn(rec, "s1", opening)]))
    assert ended.value.error_type == "flow_run_ended"
    assert len(charges) == 1 and not [e for e in rec.events if getattr(e, "submission_id", "") == "s2"]


def test_a_later_turn_without_its_opening_turn_in_the_history_fails_naming_the_run() -> None:
    app = charge_then_ask_app([])
    with pytest.raises(RunFailedError, match="its opening turn is not in the history") as missing:
        app.runner()(turn(Recorder(), "s2", flow_resume_input(RUN, {})))
    assert missing.value.error_type == "unknown_flow_run"


def test_a_run_id_outranks_a_flow_name_in_the_envelope() -> None:
    both = canonical_json({"settled_flow": {"name": "other", "run_id": "fr-1"}, "input": 1})
    invocation = flow_invocation(both)
    assert invocation is not None and (invocation.name, invocation.run_id) == (None, "fr-1")


# ------------------------------------------------------------------------------------- the digest pin (item 3)


def test_the_digest_covers_the_structure_not_the_description() -> None:
    def flow(**changes: Any) -> Flow:
        nodes = changes.pop("nodes", [action("a", print), reply("r", "Say hi.", next=End("x"))])
        return Flow("f", changes.pop("description", "d"), "a", nodes, provider=ScriptedProvider(talk), **changes)

    base = flow()
    assert len(base.digest) == 64
    assert flow(description="another description").digest == base.digest
    assert flow(max_node_visits=7).digest == base.digest
    assert flow(nodes=[action("a", print, version=2), reply("r", "Say hi.", next=End("x"))]).digest != base.digest
    assert flow(nodes=[action("a", print), reply("r", "Say hi.", next=End("y"))]).digest != base.digest
    assert flow(nodes=[action("a", print), reply("r", "Say hi.", next=lambda s: End("x"))]).digest != base.digest


def drifted_turn(app: App, rec: Recorder, opening: Any) -> AgentRun:
    return turn(rec, "s2", flow_resume_input(RUN, {"note": "n"}), [settled_turn(rec, "s1", opening)])


def test_a_changed_flow_under_a_parked_run_fails_the_turn_with_both_digests_and_runs_no_node() -> None:
    charges: list[str] = []
    rec = Recorder()
    opening = flow_input("pay", {})
    v1 = charge_then_ask_app(charges)
    v1.runner()(turn(rec, "s1", opening))
    v2 = charge_then_ask_app(charges, version=2)
    with pytest.raises(FlowDriftError) as drift:
        v2.runner()(drifted_turn(v2, rec, opening))
    error = drift.value
    assert error.error_type == "FlowDriftError" and error.recovery == ("restart", "abandon")
    assert (error.pinned_digest, error.deployed_digest) == (v1.flows["pay"].digest, v2.flows["pay"].digest)
    assert v1.flows["pay"].digest in str(error) and v2.flows["pay"].digest in str(error)
    assert "restart or abandon" in str(error)
    assert len(charges) == 1 and not [e for e in rec.events if getattr(e, "submission_id", "") == "s2"]


@pytest.mark.parametrize("redeploy", ["unchanged", "description"])
def test_an_unchanged_or_description_only_redeploy_resumes(redeploy: str) -> None:
    charges: list[str] = []
    rec = Recorder()
    opening = flow_input("pay", {})
    charge_then_ask_app(charges).runner()(turn(rec, "s1", opening))
    again = charge_then_ask_app(charges, description="new words" if redeploy == "description" else "")
    out = json.loads(again.runner()(drifted_turn(again, rec, opening)))
    assert (out["status"], out["outcome"]) == ("completed", "done") and len(charges) == 1


def test_the_drift_check_off_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches the fault switch ``flow_drift_unchecked`` (a parked run resumed against a changed flow)."""
    charges: list[str] = []
    rec = Recorder()
    opening = flow_input("pay", {})
    charge_then_ask_app(charges).runner()(turn(rec, "s1", opening))
    v2 = charge_then_ask_app(charges, version=2)
    try:
        v2.runner()(drifted_turn(v2, rec, opening))
        refused = False
    except FlowDriftError:
        refused = True
    promise(
        "DUR-010.flow-pinned",
        refused and not [e for e in rec.events if getattr(e, "submission_id", "") == "s2"],
        "a turn of a run pinned to another flow digest ran instead of failing with FlowDriftError",
    )


# ----------------------------------------------------------------------------------- abandon and restart (item 3)


def test_abandon_ends_the_run_and_a_later_turn_fails_flow_run_ended() -> None:
    charges: list[str] = []
    app = charge_then_ask_app(charges)
    rec = Recorder()
    opening = flow_input("pay", {})
    app.runner()(turn(rec, "s1", opening))
    history = [settled_turn(rec, "s1", opening)]
    out = json.loads(app.runner()(turn(rec, "s2", flow_operator_input(RUN, "abandon"), history)))
    assert out == {"flow": "pay", "run_id": RUN, "status": "abandoned"}
    history.append(settled_turn(rec, "s2", flow_operator_input(RUN, "abandon")))
    with pytest.raises(RunFailedError, match="was abandoned by turn 's2'") as ended:
        app.runner()(turn(rec, "s3", flow_resume_input(RUN, {"note": "n"}), history))
    assert ended.value.error_type == "flow_run_ended" and len(charges) == 1


def test_restart_opens_a_new_run_of_the_deployed_flow_with_the_opening_input_and_it_completes() -> None:
    charges: list[str] = []
    rec = Recorder()
    opening = flow_input("pay", {})
    charge_then_ask_app(charges).runner()(turn(rec, "s1", opening))
    v2 = charge_then_ask_app(charges, version=2)
    history = [settled_turn(rec, "s1", opening)]
    restart = flow_operator_input(RUN, "restart")
    out = json.loads(v2.runner()(turn(rec, "s2", restart, history)))
    new_run = flow_run_id_for("c1", "s2")
    assert (out["run_id"], out["restarted_from"], out["status"], out["node"]) == (new_run, RUN, "waiting", "ask")
    assert len(charges) == 2, "the new run charged under its own keys"
    history.append(settled_turn(rec, "s2", restart))
    with pytest.raises(RunFailedError, match="was restarted by turn 's2'"):
        v2.runner()(turn(rec, "s3", flow_resume_input(RUN, {"note": "n"}), history))
    done = json.loads(v2.runner()(turn(rec, "s4", flow_resume_input(new_run, {"note": "n"}), history)))
    assert (done["run_id"], done["status"], done["outcome"]) == (new_run, "completed", "done")
    assert len(charges) == 2
