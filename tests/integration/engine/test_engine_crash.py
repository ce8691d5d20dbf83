"""The execution engine under SIGKILL at the crash-matrix boundaries of a tool call (docs/semantics.md §10, §15).

Real broker, real ``settled worker`` child processes. Worker A is killed at a named failpoint; worker B takes the
partition over, restores the log, classifies the interrupted run (DUR-013) and continues. The tool doubles count
invocations and effects in a SQLite file that outlives the processes ("the outside world"):

* idempotent tool → exactly one effect, the call settles, the conversation moves on;
* non-idempotent tool → the call is Unknown, zero re-executions, the conversation's next submission waits — until
  a signed ``ResolveUnknown`` supplies the call's outcome, and then everything settles once.

Boundaries: ``engine.after_prepared_commit`` (prepared, not invoked), ``testtool.mid_invocation`` (inside the
tool, before its effect), ``engine.tool_returned`` (effect applied, result not committed).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.schemas import (
    AttemptStarted,
    RecoveryDecision,
    RecoveryDecisionKind,
    SettlementOutcome,
    StepRecorded,
    ToolCallPrepared,
    ToolCallSettled,
    ToolCallUnknown,
    canonical_json,
)
from tests._promise import promise
from tests.harness.barriers import pass_barrier
from tests.integration.engine._helpers import (
    TIMEOUT_S,
    count,
    effects,
    events_of,
    invocations,
    killed,
    plan,
    send,
    settled,
    settlements,
    sign_resolution,
)
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import world
from tests.integration.helpers import proposal, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

BOUNDARIES = ["engine.after_prepared_commit", "testtool.mid_invocation", "engine.tool_returned"]
#: Invocations / effects of the tool when the worker dies at each boundary.
AT_KILL = {
    "engine.after_prepared_commit": (0, 0),
    "testtool.mid_invocation": (1, 0),
    "engine.tool_returned": (1, 1),
}


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_idempotent_tool_killed_at_a_boundary_has_exactly_one_effect_and_settles(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, boundary: str
) -> None:
    s = topics
    first = proposal("conv-i", value=plan({"tool": "charge_idem", "args": {"amount": 5}}))
    second = proposal("conv-i", value=plan())
    a = spawn_worker("a", failpoints=f"{boundary}=1*kill")
    send(s, first, second)
    killed(a, tmp_path / "a.log")
    promise(
        "DUR-009.prepared-before-invocation",
        (invocations(world_db, "charge_idem"), effects(world_db, "charge_idem")) == AT_KILL[boundary],
        f"at {boundary}: {invocations(world_db, 'charge_idem')} invocations, {effects(world_db, 'charge_idem')} "
        f"effects; expected {AT_KILL[boundary]}",
    )
    spawn_worker("b")
    wait_for(lambda: settled(s, second.submission_id) is not None, TIMEOUT_S, "both submissions to settle")
    result = settled(s, first.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json({"results": [{"charged": 5, "tool": "charge_idem"}]})
    promise("DUR-010.one-effect", effects(world_db, "charge_idem") == 1, f"{effects(world_db, 'charge_idem')} effects")
    keys = count(world_db, "SELECT count(DISTINCT key) FROM invocations WHERE tool = 'charge_idem'")
    assert keys == 1, "every execution of the call used the same idempotency key"
    events = events_of(s, first.submission_id)
    decisions = [e for e in events if isinstance(e, RecoveryDecision)]
    assert [d.decision for d in decisions] == [RecoveryDecisionKind.SAFE_RETRY], decisions
    (call_id,) = decisions[0].call_ids
    kinds = [type(e).__name__ for e in events if getattr(e, "call_id", None) == call_id or e is decisions[0]]
    # The decision is canonical before the call is prepared again (DUR-013: recorded before acted on).
    assert kinds == ["ToolCallPrepared", "RecoveryDecision", "ToolCallPrepared", "ToolCallSettled"], kinds
    counts = Counter(r.submission_id for r in settlements(s))
    promise("DUR-002.one-settlement", counts == Counter({first.submission_id: 1, second.submission_id: 1}), f"{counts}")


def test_non_idempotent_tool_killed_after_prepared_commit_is_unknown_and_never_executed(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    """Row "after tool prepared, before invocation". Catches the fault switch ``tool_before_prepared_commit``."""
    _non_idempotent_case(topics, spawn_worker, world_db, tmp_path, "engine.after_prepared_commit")


def test_non_idempotent_tool_killed_mid_invocation_is_unknown_and_never_re_executed(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    """Row "during ordinary tool invocation"."""
    _non_idempotent_case(topics, spawn_worker, world_db, tmp_path, "testtool.mid_invocation")


def test_non_idempotent_tool_killed_after_it_returned_is_unknown_and_never_re_executed(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    """Row "after tool returns, before result commit". Catches the fault switch ``classifier_prepared_as_settled``."""
    _non_idempotent_case(topics, spawn_worker, world_db, tmp_path, "engine.tool_returned")


def _non_idempotent_case(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, boundary: str
) -> None:
    s = topics
    first = proposal("conv-u", value=plan({"tool": "charge_once", "args": {"amount": 7}}))
    second = proposal("conv-u", value=plan())
    a = spawn_worker("a", failpoints=f"{boundary}=1*kill")
    send(s, first, second)
    killed(a, tmp_path / "a.log")
    at_kill = (invocations(world_db, "charge_once"), effects(world_db, "charge_once"))
    promise(
        "DUR-009.prepared-before-invocation",
        at_kill == AT_KILL[boundary],
        f"at {boundary}: (invocations, effects) = {at_kill}; expected {AT_KILL[boundary]}",
    )
    spawn_worker("b")

    def decided() -> list[RecoveryDecision]:
        return [e for e in events_of(s, first.submission_id) if isinstance(e, RecoveryDecision)]

    wait_for(lambda: bool(decided()) or settled(s, first.submission_id) is not None, TIMEOUT_S, "a recovery decision")
    # Barrier (another conversation of the one partition: conv-u waits behind the Unknown): a wrong re-execution or
    # a wrong start of the next submission precedes the barrier's settlement.
    barrier = pass_barrier(s, "conv-barrier", plan()).proposal
    kinds = [d.decision for d in decided()]
    promise(
        "DUR-009.unknown",
        kinds == [RecoveryDecisionKind.UNKNOWN] and settled(s, first.submission_id) is None,
        f"decisions {kinds}, settlement {settled(s, first.submission_id)}",
    )
    promise(
        "DUR-009.not-replayed",
        (invocations(world_db, "charge_once"), effects(world_db, "charge_once")) == at_kill,
        f"after recovery: {invocations(world_db, 'charge_once')} invocations (at kill {at_kill[0]})",
    )
    unknown = [e for e in events_of(s, first.submission_id) if isinstance(e, ToolCallUnknown)]
    assert len(unknown) == 1 and "neither idempotent nor reconcilable" in unknown[0].reason
    next_events = events_of(s, second.submission_id)
    assert not any(isinstance(e, AttemptStarted) for e in next_events), "the next submission ran past an Unknown"
    assert settled(s, second.submission_id) is None

    # A signed resolution supplies the call's outcome: the run continues with it, and the lane moves on.
    resolution = sign_resolution("conv-u", first.submission_id, unknown[0].call_id, {"charged": 7, "by": "ops"})
    send(s, resolution)
    wait_for(lambda: settled(s, second.submission_id) is not None, TIMEOUT_S, "the lane to move on")
    result = settled(s, first.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json({"results": [{"by": "ops", "charged": 7}]})
    promise(
        "DUR-009.not-replayed",
        invocations(world_db, "charge_once") == at_kill[0],
        f"the resolved call ran again: {invocations(world_db, 'charge_once')} invocations",
    )
    counts = Counter(r.submission_id for r in settlements(s))
    assert counts == Counter({first.submission_id: 1, second.submission_id: 1, barrier.submission_id: 1}), counts


def test_a_tool_error_recorded_before_a_kill_is_re_raised_without_running_the_tool(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    sub = proposal("conv-e", value=plan({"tool": "flaky"}, {"tool": "charge_idem", "args": {"amount": 1}}))
    # Killed once the next call is prepared: flaky's error is committed and attempt 1 has seen it.
    a = spawn_worker("a", failpoints="engine.after_prepared_commit=2*kill")
    send(s, sub)
    killed(a, tmp_path / "a.log")
    spawn_worker("b")
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    error = ["ValueError", "boom on the first invocation"]
    assert result.reply_json == canonical_json({"results": [{"error": error}, {"charged": 1, "tool": "charge_idem"}]})
    assert invocations(world_db, "flaky") == 1, "the failing tool ran again instead of replaying its error"
    with world(str(world_db)) as db:
        seen = db.execute("SELECT attempt, value FROM observations WHERE op = 0 ORDER BY attempt").fetchall()
    assert [a for a, _ in seen] == [1, 2] and seen[0][1] == seen[1][1] == canonical_json({"error": error})


def test_now_and_uuid_are_identical_after_a_kill(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    sub = proposal("conv-t", value=plan({"now": True}, {"uuid": True}, {"tool": "charge_idem", "args": {"amount": 2}}))
    a = spawn_worker("a", failpoints="engine.after_prepared_commit=1*kill")
    send(s, sub)
    killed(a, tmp_path / "a.log")
    with world(str(world_db)) as db:
        before = db.execute("SELECT op, value FROM observations WHERE attempt = 1 ORDER BY op").fetchall()
    assert [op for op, _ in before] == [0, 1]
    spawn_worker("b")
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
    with world(str(world_db)) as db:
        after = db.execute("SELECT op, value FROM observations WHERE attempt = 2 ORDER BY op").fetchall()
    assert after[:2] == before, f"attempt 2 saw {after[:2]}, attempt 1 saw {before}"
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED
    assert result.reply_json is not None and all(v in result.reply_json for _, v in before)


def test_a_step_failing_on_attempt_1_and_succeeding_on_2_is_recorded_once(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    sub = proposal("conv-s", value=plan({"step": "prepare", "fail_first": True}))
    # Attempt 1's body fails (nothing recorded); attempt 2's succeeds, its StepRecorded commits, and the worker is
    # killed right then; attempt 3 (another worker) replays the step without running the body.
    a = spawn_worker("a", failpoints="engine.after_step_commit=1*kill")
    send(s, sub)
    killed(a, tmp_path / "a.log")
    spawn_worker("b")
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.attempt_count == 3
    steps = [e for e in events_of(s, sub.submission_id) if isinstance(e, StepRecorded)]
    promise("DUR-010.one-step-record", len(steps) == 1, f"{len(steps)} StepRecorded events")
    assert steps[0].name == "prepare" and steps[0].result_json == canonical_json(
        {"runs_when_recorded": 2, "step": "prepare"}
    )
    assert count(world_db, "SELECT count(*) FROM step_runs") == 2, "the body ran again after its success was recorded"


def test_changed_agent_code_raises_replay_divergence_on_resume(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    sub = proposal("conv-d", value=plan({"tool": "charge_idem", "args": {"amount": 3}}, {"now": True}))
    a = spawn_worker("a", failpoints="engine.after_settled_commit=1*kill")
    send(s, sub)
    killed(a, tmp_path / "a.log")
    spawn_worker("b", app="tests.integration.engine.engine_app:app_changed")
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.FAILED, result
    assert result.error_type == "ReplayDivergenceError"
    reason = result.error_reason or ""
    assert "ordinal 0" in reason and "'charge_idem'" in reason and "'charge_other'" in reason, reason
    assert invocations(world_db, "charge_other") == 0 and effects(world_db, "charge_idem") == 1
    assert not [
        e for e in events_of(s, sub.submission_id) if isinstance(e, ToolCallPrepared) and e.tool == "charge_other"
    ]
    assert len([e for e in events_of(s, sub.submission_id) if isinstance(e, ToolCallSettled)]) == 1


@pytest.mark.parametrize("boundary", ["engine.run_returned", "conductor.before_settle"])
def test_killed_after_deciding_to_finish_the_reply_is_recomputed_from_the_record(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, boundary: str
) -> None:
    """Row "after decision to finish, before terminalizing": nothing of the reply is canonical; the next attempt
    recomputes it by replaying the record — the non-idempotent call settled before the kill is not run again."""
    s = topics
    sub = proposal("conv-f", value=plan({"tool": "charge_once", "args": {"amount": 4}}, {"uuid": True}))
    a = spawn_worker("a", failpoints=f"{boundary}=1*kill")
    send(s, sub)
    killed(a, tmp_path / "a.log")
    assert settled(s, sub.submission_id) is None
    with world(str(world_db)) as db:
        (seen,) = db.execute("SELECT value FROM observations WHERE attempt = 1 AND op = 1").fetchone()
    spawn_worker("b")
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED and result.attempt_count == 2
    assert result.reply_json == canonical_json({"results": [{"charged": 4, "tool": "charge_once"}, json.loads(seen)]})
    promise("DUR-009.not-replayed", invocations(world_db, "charge_once") == 1, "the settled call ran again")
    assert [r.submission_id for r in settlements(s)] == [sub.submission_id]
