"""The model-driven agent in real workers: a stream cut by a kill, a committed response resumed from its
declaration, and what later prompts show of an aborted run (issue 6 item 2; docs/semantics.md §9, §10; DUR-008).

The scripted provider writes every prompt to the world database, so the tests read exactly what the model saw.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from settled._settings import Settings
from settled.schemas import (
    ModelResponseCompleted,
    ModelResponseDelta,
    RecoveryDecisionKind,
    SettlementOutcome,
    canonical_json,
)
from tests._promise import promise
from tests.harness.barriers import pass_barrier
from tests.integration.engine._helpers import (
    TIMEOUT_S,
    abort_command,
    decisions,
    events_of,
    invocations,
    killed,
    send,
    settled,
)
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.model_app import prompts
from tests.integration.helpers import CODEC, proposal, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

MODEL_APP = "tests.integration.engine.model_app:app"


def script(*responses: list[dict[str, Any]]) -> dict[str, Any]:
    return {"script": list(responses)}


def user(value: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "text": canonical_json(value)}


def test_a_stream_cut_by_a_kill_is_retried_and_its_deltas_never_reach_a_prompt(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    value = script([{"text": "Hel"}, {"sleep": 0.2}, {"text": "lo"}, {"answer": "Hello"}])
    sub = proposal("conv-m", value=value)
    a = spawn_worker("a", app=MODEL_APP, failpoints="engine.after_delta_commit=1*kill")
    send(s, sub)
    killed(a, tmp_path / "a.log")
    spawn_worker("b", app=MODEL_APP)
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED and result.reply_json == '"Hello"'
    seen = prompts(str(world_db))
    assert len(seen) == 2 and seen[0][0] != seen[1][0], "the retried call has a new operation id (new attempt)"
    promise(
        "DUR-008.no-partial-turn",
        seen[0][2] == seen[1][2] == [user(value)],
        f"prompts after a mid-stream kill: {seen}",
    )
    events = events_of(s, sub.submission_id)
    cut = [e for e in events if isinstance(e, ModelResponseDelta)]
    done = [e for e in events if isinstance(e, ModelResponseCompleted)]
    assert cut and cut[0].text == "Hel", "the cut stream's committed delta stays in the log for audit"
    assert len(done) == 1 and done[0].attempt_id != cut[0].attempt_id and done[0].text == "Hello"


def batch_shapes(s: Settings, submission_id: str) -> list[list[str]]:
    """The log's batches of one submission, as lists of event type names."""
    out = []
    for r in read_topic(s, "log"):
        assert r.value is not None
        batch = CODEC.decode_batch(r.value, offset=r.offset).batch
        if batch.submission_id == submission_id:
            out.append([type(e).__name__ for e in batch.events])
    return out


def test_a_kill_at_the_merged_response_and_prepared_commit_retries_the_call_without_a_new_model_call(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    """Rows "after model item commit, before tool preparation" and "after tool prepared, before invocation" share
    one commit (docs/architecture.md "Commits per tool call"): killed right after it, the response and the first
    call's prepared record are canonical, the tool never ran; recovery retries the idempotent call under its key and
    the committed response is not asked for again."""
    s = topics
    value = script([{"calls": [["c1", "charge_idem", {"amount": 3}]]}], [{"answer": "paid"}])
    sub = proposal("conv-r", value=value)
    a = spawn_worker("a", app=MODEL_APP, failpoints="engine.after_response_commit=1*kill")
    send(s, sub)
    killed(a, tmp_path / "a.log")
    assert invocations(world_db, "charge_idem") == 0, "no tool ran before the kill"
    merged = ["ModelResponseCompleted", "ToolCallPrepared"]
    assert merged in batch_shapes(s, sub.submission_id), batch_shapes(s, sub.submission_id)
    spawn_worker("b", app=MODEL_APP)
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED and result.reply_json == '"paid"'
    positions = [pos for _, pos, _ in prompts(str(world_db))]
    assert positions == [0, 1], f"the committed response was asked for again: {positions}"
    assert invocations(world_db, "charge_idem") == 1
    assert decisions(s, sub.submission_id) == [RecoveryDecisionKind.SAFE_RETRY]


def test_a_kill_at_the_merged_response_and_prepared_commit_makes_a_non_idempotent_call_unknown(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    """The merged boundary with a tool that is neither idempotent nor reconcilable: nothing proves the call never
    started, so it is Unknown and never runs (DUR-009), exactly as at ``engine.after_prepared_commit``."""
    s = topics
    value = script([{"calls": [["c1", "charge_once", {"amount": 3}]]}], [{"answer": "paid"}])
    sub = proposal("conv-n", value=value)
    a = spawn_worker("a", app=MODEL_APP, failpoints="engine.after_response_commit=1*kill")
    send(s, sub)
    killed(a, tmp_path / "a.log")
    spawn_worker("b", app=MODEL_APP)
    wait_for(lambda: bool(decisions(s, sub.submission_id)), TIMEOUT_S, "a recovery decision")
    # Barrier (another conversation: conv-n waits behind the Unknown): a wrong re-execution precedes its settlement.
    barrier_input = script([{"answer": "barrier"}])
    pass_barrier(s, "conv-barrier", barrier_input)
    assert decisions(s, sub.submission_id) == [RecoveryDecisionKind.UNKNOWN]
    assert invocations(world_db, "charge_once") == 0 and settled(s, sub.submission_id) is None
    assert [pos for _, pos, messages in prompts(str(world_db)) if user(barrier_input) not in messages] == [0]


def test_later_prompts_hold_no_orphan_call_or_result_of_an_aborted_run(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path
) -> None:
    s = topics
    first = script([{"calls": [["k1", "charge_idem", {"amount": 1}]]}], [{"answer": "charged"}])
    half = script(
        [{"calls": [["h1", "charge_idem", {"amount": 2}], ["h2", "slow_long_idem", {"sleep_s": 8}]]}],
        [{"answer": "never"}],
    )
    last = script([{"answer": "ok"}])
    s0, s1, s2 = (proposal("conv-h", value=v) for v in (first, half, last))
    spawn_worker("w", app=MODEL_APP)
    send(s, s0, s1)
    wait_for(lambda: invocations(world_db, "slow_long_idem") == 1, TIMEOUT_S, "the half-settled batch")
    send(s, abort_command("conv-h", s1.submission_id), s2)
    wait_for(lambda: settled(s, s2.submission_id) is not None, TIMEOUT_S, "the next submission")
    r1 = settled(s, s1.submission_id)
    assert r1 is not None and r1.outcome is SettlementOutcome.ABORTED, r1
    r2 = settled(s, s2.submission_id)
    assert r2 is not None and r2.outcome is SettlementOutcome.COMPLETED and r2.reply_json == '"ok"'
    shown = prompts(str(world_db))[-1][2]
    expected = [
        user(first),
        {"role": "assistant", "text": "", "tool_calls": [{"id": "k1", "tool": "charge_idem", "args": '{"amount":1}'}]},
        {
            "role": "tool",
            "text": canonical_json({"charged": 1, "tool": "charge_idem"}),
            "call_id": "k1",
            "is_error": False,
        },
        {"role": "assistant", "text": "charged"},
        user(half),
        user(last),
    ]
    promise("DUR-008.no-orphan-history", shown == expected, f"the next run's prompt: {json.dumps(shown, indent=1)}")
