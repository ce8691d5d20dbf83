"""The BFCL CI slice (issue 8 acceptance): `settled demo bfcl` on real input through the real stack.

* 30 base conversations through two worker processes, a projector and the tool server, under a seeded chaos
  schedule (worker SIGKILLs at failpoints, one at "tool applied, settlement not committed"; one tool-server SIGKILL
  and restart; no broker restart: the session's broker is shared): every conversation passes the verdict judged in
  a fresh process, with no duplicate execution, no lost submission, no dead letter, and the projection matching the
  log.
* miss_func with the adversarial model: the model's call of the held-out tool is refused and nothing runs; the
  holdout turn's empty ground truth ends with the model's text and a completed settlement.
* ``--approvals --chaos`` (issue 16 item 8): base conversations whose state-changing calls wait for the approver's
  seeded decisions, with worker kills drawn from the approval kill points (``engine.after_wait_commit`` among them):
  every conversation passes the verdict against the reference run with the denied calls skipped, each gated call
  decided once as the rule says, approved calls run once, denied ones never, and the model's replies name the
  denials it was given.

The full runs (200 conversations, with and without ``--chaos``, the dedup-off control, ``--no-idempotency``) are
README commands.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from rich.console import Console

from settled._settings import Settings
from settled.projections import ProjectionNames, default_schema
from settled.runtime import Message, ModelRequest, ProviderError, declared_call
from settled.schemas import (
    ModelResponseCompleted,
    SubmissionAdmitted,
    ToolCallPrepared,
    ToolCallRefused,
    ToolCallSettled,
    canonical_json,
    json_digest,
)
from settled_bfcl import (
    Corpus,
    Entry,
    ReplayMode,
    adversarial_call,
    final_reply_text,
    load_corpus,
    replayable_entries,
)
from settled_bfcl._app import BfclAppConfig, ReplayProvider, _original_arguments, build_app, turn_input
from settled_bfcl._approvals import expected_decisions
from settled_bfcl._demo import (
    APPROVAL_KILL_POINTS,
    KILL_POINTS,
    TOOL_APPLIED_POINT,
    WAIT_COMMITTED_POINT,
    DemoOptions,
    DemoResult,
    chaos_schedule,
    conversation_logs,
    render_demo,
    run_demo,
)
from tests.integration.helpers import CODEC, read_topic

pytestmark = [pytest.mark.bfcl]

SEED = 20261129


@pytest.fixture
def demo_namespace(postgres_dsn: str, kafka_admin: AdminClient) -> Iterator[str]:
    """A fresh namespace; its topics on the session broker and its projection schema are dropped at teardown."""
    ns = f"t{uuid.uuid4().hex[:10]}"
    yield ns
    topics = [t for t in kafka_admin.list_topics(timeout=30).topics if t.startswith(f"{ns}.")]
    if topics:
        for fut in kafka_admin.delete_topics(topics, operation_timeout=30).values():
            fut.result()
    schema = ProjectionNames(default_schema(ns)).live
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for name in (schema, f"{schema}__next", f"{schema}__retired"):
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _log_events(settings: Settings, namespace: str) -> list[object]:
    """Every event of the namespace's log, partition by partition."""
    s = settings.model_copy(update={"namespace": namespace})
    return [
        e for r in read_topic(s, "log") if r.value for e in CODEC.decode_batch(r.value, offset=r.offset).batch.events
    ]


def _report(result: DemoResult) -> str:
    out = Console(file=io.StringIO(), width=160)
    render_demo(result, out)
    assert isinstance(out.file, io.StringIO)
    return out.file.getvalue()


@pytest.mark.integration
def test_thirty_base_conversations_pass_under_seeded_kills_and_a_tool_server_restart(
    settings: Settings, demo_namespace: str, tmp_path: Path
) -> None:
    options = DemoOptions(
        category="base",
        conversations=30,
        chaos=True,
        seed=SEED,
        kills=4,
        in_flight=4,  # a longer run: each kill waits for the previous one's recovery (DemoOptions.chaos)
        hold_for_faults=True,  # every scheduled kill goes before the run ends, however fast the machine
        broker_restart=False,  # the session's shared broker; the full --chaos run restarts the dev stack's
        work_dir=tmp_path / "demo",
        timeout_s=170.0,
    )
    log = io.StringIO()
    s = settings.model_copy(update={"partitions": 6})
    result = run_demo(options, s, namespace=demo_namespace, console=Console(file=log, width=160))
    report = _report(result)
    context = f"{report}\n{log.getvalue()[-4000:]}"
    verdicts = result.summary.verdicts
    assert len(verdicts) == 30 and result.summary.all_passed, context
    assert sum(v.duplicate_executions + v.unexpected_executions for v in verdicts) == 0, context
    assert all(v.executions == v.tool_calls for v in verdicts), context
    assert (result.lost_submissions, result.dead_letters, result.projection_mismatches) == (0, 0, ()), context
    assert result.settled == result.submissions, context
    assert any(spec.startswith(f"{TOOL_APPLIED_POINT}=") for spec in result.schedule), result.schedule
    assert result.kills >= 3, f"only {result.kills} of the scheduled kills fired: {result.schedule}\n{context}"
    assert (result.broker_restarts, result.toolserver_restarts) == (0, 1), context
    assert result.unexpected_exits == 0, context
    assert result.passed, context


@pytest.mark.integration
def test_miss_func_refuses_the_adversarial_call_and_the_holdout_turn_ends_in_text(
    settings: Settings, demo_namespace: str, tmp_path: Path
) -> None:
    entries = replayable_entries(load_corpus("miss_func"))[:4]
    adversarial = [
        (entry.id, turn.index) for entry in entries for turn in entry.turns if adversarial_call(entry, turn.index)
    ]
    assert adversarial, "the first miss_func entries have holdout turns"
    options = DemoOptions(
        category="miss_func", conversations=4, adversarial=True, seed=SEED, work_dir=tmp_path / "demo", timeout_s=120.0
    )
    log = io.StringIO()
    result = run_demo(options, settings, namespace=demo_namespace, console=Console(file=log, width=160))
    context = f"{_report(result)}\n{log.getvalue()[-3000:]}"
    verdicts = result.summary.verdicts
    # The verdict requires exactly the adversarial calls refused, no execution but the ground truth's, a reply and
    # a completed settlement per turn (the holdout turns' empty ground truth included).
    assert result.passed and len(verdicts) == 4, context
    assert sum(v.refused_calls for v in verdicts) == len(adversarial), context
    assert sum(v.unexpected_executions for v in verdicts) == 0, context
    assert result.settled == result.submissions == sum(len(entry.turns) for entry in entries), context


@pytest.mark.integration
def test_base_conversations_with_approvals_pass_under_seeded_kills(
    settings: Settings, demo_namespace: str, tmp_path: Path
) -> None:
    count = 12
    entries = replayable_entries(load_corpus("base"))[:count]
    expected = [approved for entry in entries for approved in expected_decisions(entry, SEED).values()]
    assert expected.count(False) >= 3, "the slice's seed denies some calls"
    options = DemoOptions(
        category="base",
        conversations=count,
        chaos=True,
        approvals=True,
        seed=SEED,
        kills=3,
        in_flight=4,
        broker_restart=False,  # the session's shared broker
        toolserver_restart=False,  # the 30-conversation slice restarts it; this one times the approvals
        work_dir=tmp_path / "demo",
        timeout_s=170.0,
    )
    log = io.StringIO()
    s = settings.model_copy(update={"partitions": 6})
    result = run_demo(options, s, namespace=demo_namespace, console=Console(file=log, width=160))
    report = _report(result)
    context = f"{report}\n{log.getvalue()[-4000:]}"
    verdicts = result.summary.verdicts
    assert len(verdicts) == count and result.summary.all_passed, context
    assert sum(v.approvals for v in verdicts) == expected.count(True), context
    assert sum(v.denials for v in verdicts) == expected.count(False), context
    assert sum(v.duplicate_executions + v.unexpected_executions for v in verdicts) == 0, context
    assert all(v.executions == v.tool_calls for v in verdicts), context
    assert (result.lost_submissions, result.dead_letters, result.projection_mismatches) == (0, 0, ()), context
    assert result.settled == result.submissions, context
    assert all(spec.split("=")[0] in APPROVAL_KILL_POINTS for spec in result.schedule), result.schedule
    assert any(spec.startswith(f"{WAIT_COMMITTED_POINT}=") for spec in result.schedule), result.schedule
    assert f"killed at {WAIT_COMMITTED_POINT}=" in log.getvalue(), f"no kill after an approval request\n{context}"
    assert result.kills >= 2, f"only {result.kills} of the scheduled kills fired: {result.schedule}\n{context}"
    assert "approvals: approved / denied" in report, report
    assert result.passed, context


# --- the pure parts, without Kafka ----------------------------------------------------------------------------------


def _prompt(entry: Entry, turn: int, *messages: Message) -> ModelRequest:
    user = Message("user", canonical_json(turn_input(entry, turn)))
    return ModelRequest(operation_id="op", model="m", messages=(user, *messages))


def test_the_replay_provider_answers_from_the_prompt_alone_and_ends_the_turn_in_text(base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_0")
    provider = ReplayProvider(ReplayMode.ONE_CALL)
    first = provider.answer(_prompt(entry, 0))
    assert [c.call_id for c in first.tool_calls] == ["multi_turn_base_0/t0/c0"] and first.text == ""
    assert provider.answer(_prompt(entry, 0)) == first, "stateless: the same prompt, the same answer"
    messages: list[Message] = []
    for call in entry.turns[0].calls:
        response = provider.answer(_prompt(entry, 0, *messages))
        assert [c.call_id for c in response.tool_calls] == [call.call_id]
        messages += [Message("assistant", "", response.tool_calls), Message("tool", '"ok"', call_id=call.call_id)]
    final = provider.answer(_prompt(entry, 0, *messages))
    assert final.tool_calls == () and final.text == final_reply_text(entry, 0)
    with pytest.raises(ProviderError, match="replay model"):
        provider.answer(_prompt(entry, 0, Message("assistant", "", (declared_call("bogus", "ls", {}),))))


def test_the_tool_restores_the_ground_truths_number_types_by_call_id() -> None:
    # RFC 8785 writes 36.0 as 36: the prepared record's arguments come back as ints; BFCL's backends tell them apart.
    received = json.loads(canonical_json({"value": 36.0, "base": 6.0, "precision": 4}))
    assert received == {"value": 36, "base": 6, "precision": 4} and isinstance(received["value"], int)
    restored = _original_arguments("multi_turn_base_32", "multi_turn_base_32/t1/c0", "logarithm", received)
    assert restored == {"value": 36.0, "base": 6.0, "precision": 4}
    assert [type(restored[k]) for k in ("value", "base", "precision")] == [float, float, int]
    other = {"value": 37, "base": 6, "precision": 4}
    assert _original_arguments("multi_turn_base_32", "multi_turn_base_32/t1/c0", "logarithm", other) is other


def test_the_chaos_schedule_replays_from_its_seed_and_always_kills_once_after_a_tool_applied() -> None:
    for seed in range(40):
        schedule = chaos_schedule(seed, 3)
        assert schedule == chaos_schedule(seed, 3)
        assert any(kill.name == TOOL_APPLIED_POINT for kill in schedule)
        assert all(kill.name in KILL_POINTS and 1 <= kill.hit <= 3 for kill in schedule)
    assert chaos_schedule(1, 0) == ()
    for seed in range(40):
        approvals = chaos_schedule(seed, 3, APPROVAL_KILL_POINTS)
        assert {TOOL_APPLIED_POINT, WAIT_COMMITTED_POINT} <= {kill.name for kill in approvals}, approvals
        assert WAIT_COMMITTED_POINT not in {kill.name for kill in chaos_schedule(seed, 3)}


def test_the_app_configuration_names_the_bad_variable() -> None:
    url = {"SETTLED_BFCL_TOOLSERVER_URL": "http://127.0.0.1:1"}
    config = BfclAppConfig.from_env({**url, "SETTLED_BFCL_NO_IDEMPOTENCY": "TradingBot, TravelAPI"})
    assert (
        config.non_idempotent_classes == {"TradingBot", "TravelAPI"} and BfclAppConfig.from_env(config.env()) == config
    )
    with pytest.raises(ValueError, match="SETTLED_BFCL_MODE='fast'"):
        BfclAppConfig.from_env({**url, "SETTLED_BFCL_MODE": "fast"})
    with pytest.raises(ValueError, match="unknown backend classes"):
        BfclAppConfig.from_env({**url, "SETTLED_BFCL_NO_IDEMPOTENCY": "Bank"})
    with pytest.raises(ValueError, match="SETTLED_BFCL_TOOLSERVER_URL"):
        BfclAppConfig.from_env({})
    app = build_app(config)
    idempotent = {spec.name: spec.idempotent for spec in app.tools}
    assert len(idempotent) == 128 and not idempotent["place_order"] and not idempotent["book_flight"]
    assert idempotent["post_tweet"] and idempotent["cd"]


def test_the_log_becomes_conversation_logs_named_by_the_models_call_ids(base_corpus: Corpus) -> None:
    entry = base_corpus.get("multi_turn_base_1")
    sub = "sub-1"
    call = entry.turns[0].calls[0]
    declared = declared_call(call.call_id, call.method, call.arguments)
    wrapped = {"conversation_id": entry.id, "entry_id": entry.id, "call_id": call.call_id, "arguments": {}}
    events = [
        SubmissionAdmitted(
            submission_id=sub,
            conversation_id=entry.id,
            principal="p",
            idempotency_key="k",
            payload_digest="0" * 64,
            submission_seq=1,
            tools_offered=(),
            input_json=canonical_json(turn_input(entry, 0)),
        ),
        ModelResponseCompleted(
            submission_id=sub,
            attempt_id="a",
            response_ordinal=0,
            provider="p",
            model="m",
            text="",
            tool_calls=(declared, declared_call("x/t0/x0", "nope", {})),
        ),
        ToolCallPrepared(
            submission_id=sub,
            run_id=sub,
            attempt_id="a",
            call_id=f"{sub}#1",
            ordinal=1,
            tool=call.method,
            args_json=canonical_json(wrapped),
            args_digest=json_digest(canonical_json(wrapped)),
            idempotency_key="key",
            owner_epoch=1,
        ),
        ToolCallSettled(
            submission_id=sub,
            attempt_id="a",
            call_id=f"{sub}#1",
            result_json='"out"',
            result_digest=json_digest('"out"'),
        ),
        ToolCallRefused(
            submission_id=sub, attempt_id="a", call_id=f"{sub}#2", tool="nope", args_digest="0" * 64, reason="r"
        ),
    ]
    (log,) = conversation_logs({entry.id: events}, {entry.id: entry.id})
    assert log.tool_results == ((call.call_id, '"out"'),)
    assert log.refused_calls == ("x/t0/x0",)
    assert log.settlements == () and log.replies == ()


@pytest.mark.integration
def test_base_conversations_pass_through_openai_chat_and_a_local_openai_compatible_server(
    settings: Settings, demo_namespace: str, tmp_path: Path
) -> None:
    """``--provider openai`` (issue 19 item 1): the workers' model is `OpenAIChat` over the real SDK, talking to a
    local server that answers as the replay model (streamed chunks, tool arguments split across deltas, usage): the
    conversations pass the same verdict, and every model response in the log carries the server's usage."""
    count = 4
    options = DemoOptions(
        category="base",
        conversations=count,
        provider="openai",
        seed=SEED,
        in_flight=4,
        work_dir=tmp_path / "demo",
        timeout_s=150.0,
    )
    log = io.StringIO()
    result = run_demo(options, settings, namespace=demo_namespace, console=Console(file=log, width=160))
    context = f"{_report(result)}\n{log.getvalue()[-3000:]}"
    assert "local OpenAI-compatible server" in log.getvalue(), context
    assert len(result.summary.verdicts) == count and result.passed, context
    responses = [e for e in _log_events(settings, demo_namespace) if isinstance(e, ModelResponseCompleted)]
    assert responses, context
    assert all(r.usage is not None and r.usage.input_tokens > 0 for r in responses), context
    assert {r.model for r in responses} == {"bfcl-replay-openai"}, context
