"""Execution-engine scenarios in real workers (issue 6; docs/semantics.md, scenarios 7, 10, 17, 21).

* 10 (TOOL, revoke variant): a graceful stop while a non-idempotent call that applied its effect is in flight:
  the next owner marks it Unknown, nothing re-runs, nothing settles until a signed resolution.
* 7 (FIFO/REC): a run killed between two tool calls resumes at the next call after two restarts; the lane's queued
  submissions follow in order.
* 17 (STEP/parallel), one repetition as a smoke test: a declared batch of three parallel-safe calls killed with a
  call in doubt: one settlement per call, one effect per call, one more attempt (the scenario's 20 seeded
  repetitions are ``tests/chaos/test_scenario_17.py``).
* 21 (TOOL): two identical calls in one turn get distinct call ids and idempotency keys; a kill between them
  re-runs only the unsettled one; the next prompt pairs every result with its own call.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.schemas import (
    AttemptStarted,
    RecoveryDecisionKind,
    SettlementOutcome,
    ToolCallPrepared,
    ToolCallSettled,
    ToolCallUnknown,
    canonical_json,
)
from tests._promise import promise
from tests.harness.barriers import pass_barrier
from tests.integration.engine._helpers import (
    TIMEOUT_S,
    check_parallel_batch,
    count,
    decisions,
    effects,
    events_of,
    invocations,
    killed,
    log_events,
    plan,
    send,
    settled,
    settlements,
    sign_resolution,
)
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import world
from tests.integration.engine.model_app import prompts
from tests.integration.helpers import proposal, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

_log = logging.getLogger(__name__)
MODEL_APP = "tests.integration.engine.model_app:app"


def _per_key(db: Path, table: str, tool: str) -> dict[str, int]:
    with world(str(db)) as conn:
        rows = conn.execute(f"SELECT key, count(*) FROM {table} WHERE tool = ? GROUP BY key", (tool,)).fetchall()
    return {str(k): int(n) for k, n in rows}


def test_scenario_7_a_run_killed_between_steps_resumes_at_step_3_and_the_lane_follows_in_order(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    # Some agent work between steps 2 and 3: a settlement lingers a few milliseconds for the run's next record and
    # shares its commit with it (docs/architecture.md, "Commits per tool call"); without the work, step 3's prepared
    # record would commit with step 2's settlement and the boundary "settled, next not prepared" would not exist.
    a_sub = proposal(
        "conv-7",
        value=plan(
            {"tool": "charge_idem", "args": {"amount": 1}},
            {"tool": "charge_idem", "args": {"amount": 2}},
            {"sleep_s": 0.05},
            {"tool": "charge_idem", "args": {"amount": 3}},
        ),
    )
    b_sub = proposal("conv-7", value=plan({"tool": "charge_idem", "args": {"amount": 20}}))
    d_sub = proposal("conv-7", value=plan({"uuid": True}))
    # Worker 1 dies right after A's step-2 settlement commits (step 3 not prepared).
    w1 = spawn_worker("w1", failpoints="engine.after_settled_commit=2*kill")
    send(s, a_sub, b_sub, d_sub)
    killed(w1, tmp_path / "w1.log")
    prepared = [e for e in events_of(s, a_sub.submission_id) if isinstance(e, ToolCallPrepared)]
    assert [p.ordinal for p in prepared] == [0, 1], f"at the first kill: prepared ordinals {prepared}"
    started_b = [e for e in events_of(s, b_sub.submission_id) if isinstance(e, AttemptStarted)]
    assert settled(s, b_sub.submission_id) is None and not started_b, "B started while A was active"

    # Restart 1: the new owner's first prepared call is A's step 3 (ordinal 2); it dies right after that commit.
    w2 = spawn_worker("w2", failpoints="engine.after_prepared_commit=1*kill")
    killed(w2, tmp_path / "w2.log")
    prepared = [e for e in events_of(s, a_sub.submission_id) if isinstance(e, ToolCallPrepared)]
    promise(
        "DUR-013.resume-at-next-step",
        [p.ordinal for p in prepared] == [0, 1, 2],
        f"after restart 1, A's prepared ordinals {[p.ordinal for p in prepared]} (expected to resume at 2)",
    )
    # Restart 2: everything settles, in FIFO order.
    spawn_worker("w3")
    wait_for(lambda: settled(s, d_sub.submission_id) is not None, TIMEOUT_S, "D to settle (the lane not wedged)")
    order = [r.submission_id for r in settlements(s)]
    promise(
        "DUR-004.fifo",
        order == [a_sub.submission_id, b_sub.submission_id, d_sub.submission_id],
        f"settlement order {order}",
    )
    result = settled(s, a_sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    charged = [{"charged": n, "tool": "charge_idem"} for n in (1, 2, 3)]
    assert result.reply_json == canonical_json({"results": [*charged[:2], 0.05, charged[2]]})
    assert result.attempt_count == 3, result
    for sub in (b_sub, d_sub):
        r = settled(s, sub.submission_id)
        assert r is not None and r.outcome is SettlementOutcome.COMPLETED and r.attempt_count == 1, r
    # Steps 1 and 2 never ran again; step 3 ran at most twice (prepared-then-killed, retried) under one key.
    runs = [
        count(world_db, "SELECT count(*) FROM invocations WHERE submission = ? AND key = ?", a_sub.submission_id, k)
        for k in (p.idempotency_key for p in prepared)
    ]
    promise("DUR-009.not-replayed", runs == [1, 1, 1], f"invocations per step of A: {runs}")
    assert effects(world_db, "charge_idem") == 4  # A's three steps and B's one


def test_scenario_17_smoke_a_parallel_batch_killed_with_a_call_in_doubt_settles_each_call_once(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    """One repetition as a smoke test (the kill lands after the second call returned, before its settlement);
    ``tests/chaos/test_scenario_17.py`` runs the scenario's 20 repetitions at failpoints drawn from a seed."""
    boundary = "engine.tool_returned=2*kill"
    s = topics
    batch = [[f"p{i}", "sleep_par", {"sleep_s": ms / 1000}] for i, ms in enumerate((50, 100, 150))]
    sub = proposal("conv-17", value={"script": [[{"calls": batch}], [{"answer": "done"}]]})
    a = spawn_worker("a", app=MODEL_APP, failpoints=boundary)
    send(s, sub)
    killed(a, tmp_path / "a.log")
    settled_before = {e.call_id for e in events_of(s, sub.submission_id) if isinstance(e, ToolCallSettled)}
    spawn_worker("b", app=MODEL_APP)
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, f"the settlement ({boundary})")
    result = settled(s, sub.submission_id)
    check_parallel_batch(events_of(s, sub.submission_id), result, world_db, settled_before, f"({boundary})")


def test_scenario_21_two_identical_calls_in_one_turn_are_two_calls_and_only_the_unsettled_one_re_runs(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    calls = [
        ["c1", "charge_idem", {"amount": 5}],
        ["c2", "charge_idem", {"amount": 5}],
        ["c3", "charge_idem", {"amount": 9}],
    ]
    value = {"script": [[{"calls": calls}], [{"answer": "added twice"}]]}
    sub = proposal("conv-21", value=value)
    # The calls run in declaration order (charge_idem is not parallel-safe). The second hit of tool_returned is the
    # second identical call: its effect applied, its settlement not committed; the first identical call is settled.
    a = spawn_worker("a", app=MODEL_APP, failpoints="engine.tool_returned=2*kill")
    send(s, sub)
    killed(a, tmp_path / "a.log")
    before = events_of(s, sub.submission_id)
    assert len([e for e in before if isinstance(e, ToolCallSettled)]) == 1
    spawn_worker("b", app=MODEL_APP)
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == '"added twice"'
    events = events_of(s, sub.submission_id)
    prepared = [e for e in events if isinstance(e, ToolCallPrepared)]
    by_call = {p.call_id: p for p in prepared}
    ids = sorted(by_call, key=lambda c: by_call[c].ordinal)
    assert len(ids) == 3, ids
    pair = [by_call[c] for c in ids[:2]]
    promise(
        "DUR-010.identical-calls-distinct",
        pair[0].args_json == pair[1].args_json
        and pair[0].call_id != pair[1].call_id
        and pair[0].idempotency_key != pair[1].idempotency_key,
        f"the identical pair: {[(p.call_id, p.idempotency_key, p.args_json) for p in pair]}",
    )
    settled_ = Counter(e.call_id for e in events if isinstance(e, ToolCallSettled))
    assert settled_ == Counter(dict.fromkeys(ids, 1)), settled_
    assert Counter(p.call_id for p in prepared) == Counter({ids[0]: 1, ids[1]: 2, ids[2]: 1})
    assert decisions(s, sub.submission_id) == [RecoveryDecisionKind.SAFE_RETRY]
    keys = [by_call[c].idempotency_key for c in ids]
    invoked = _per_key(world_db, "invocations", "charge_idem")
    promise(
        "DUR-009.not-replayed",
        [invoked[k] for k in keys] == [1, 2, 1],
        f"invocations per call (first, second identical, third): {[invoked[k] for k in keys]}",
    )
    with_amounts = count(world_db, "SELECT sum(amount) FROM effects WHERE tool = 'charge_idem'")
    promise(
        "DUR-010.one-effect",
        _per_key(world_db, "effects", "charge_idem") == dict.fromkeys(keys, 1) and with_amounts == 19,
        f"effects per key {_per_key(world_db, 'effects', 'charge_idem')}, total amount {with_amounts}",
    )
    seen = prompts(str(world_db))
    assert [pos for _, pos, _ in seen] == [0, 1], f"the committed response was asked for again: {seen}"
    tool_messages = [m for m in seen[-1][2] if m["role"] == "tool"]
    five = canonical_json({"charged": 5, "tool": "charge_idem"})
    nine = canonical_json({"charged": 9, "tool": "charge_idem"})
    expected = [
        {"role": "tool", "text": five, "call_id": "c1", "is_error": False},
        {"role": "tool", "text": five, "call_id": "c2", "is_error": False},
        {"role": "tool", "text": nine, "call_id": "c3", "is_error": False},
    ]
    promise("DUR-008.results-paired", tool_messages == expected, f"tool results shown: {json.dumps(tool_messages)}")


def test_scenario_10_revoke_variant_a_call_in_flight_past_a_graceful_revoke_is_unknown_with_its_one_effect(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kill variant is ``test_engine_crash.py``'s non-idempotent cases; here the partition moves by a graceful
    stop (SIGTERM): the call has applied its effect and is still in flight when the revoke's bound runs out."""
    s = topics
    monkeypatch.setenv("SETTLED_REVOKE_GRACE_S", "1.0")  # inherited by the workers spawned below
    first = proposal("conv-10", value=plan({"tool": "charge_then_hang", "args": {"hang_s": 20}}))
    second = proposal("conv-10", value=plan())
    a = spawn_worker("a")
    send(s, first, second)
    wait_for(lambda: effects(world_db, "charge_then_hang") == 1, TIMEOUT_S, "the tool's effect")
    a.send_signal(signal.SIGTERM)
    try:
        code = a.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"the worker did not stop on SIGTERM:\n{(tmp_path / 'a.log').read_text()[-3000:]}"
        ) from None
    assert code == 0, f"worker exited {code}:\n{(tmp_path / 'a.log').read_text()[-3000:]}"
    events = events_of(s, first.submission_id)
    assert [type(e).__name__ for e in events if isinstance(e, (ToolCallPrepared, ToolCallSettled))] == [
        "ToolCallPrepared"
    ], "the graceful stop committed the in-flight call's outcome"
    interrupted = [e for e in events if type(e).__name__ == "AttemptInterrupted"]
    assert interrupted and "graceful_revoke" in str(interrupted[-1]), interrupted
    spawn_worker("b")
    wait_for(lambda: bool(decisions(s, first.submission_id)), TIMEOUT_S, "a recovery decision")
    # Barrier (another conversation of the one partition: conv-10 waits behind the Unknown): a wrong re-execution or
    # a wrong start of the next submission precedes the barrier's settlement.
    pass_barrier(s, "conv-barrier", plan())
    promise(
        "DUR-009.unknown",
        decisions(s, first.submission_id) == [RecoveryDecisionKind.UNKNOWN] and settled(s, first.submission_id) is None,
        f"decisions {decisions(s, first.submission_id)}, settlement {settled(s, first.submission_id)}",
    )
    counted = (invocations(world_db, "charge_then_hang"), effects(world_db, "charge_then_hang"))
    promise("DUR-009.not-replayed", counted == (1, 1), f"(invocations, effects) after recovery: {counted}")
    events = events_of(s, first.submission_id)
    unknown = [e for e in events if isinstance(e, ToolCallUnknown)]
    assert len(unknown) == 1 and not [e for e in events if isinstance(e, ToolCallSettled)], events
    # Neither success nor failure assumed: no settlement, and the next submission waits behind the Unknown.
    assert not [e for e in events_of(s, second.submission_id) if isinstance(e, AttemptStarted)]
    assert settled(s, second.submission_id) is None
    send(s, sign_resolution("conv-10", first.submission_id, unknown[0].call_id, {"tool": "charge_then_hang"}))
    wait_for(lambda: settled(s, second.submission_id) is not None, TIMEOUT_S, "the lane to move on")
    result = settled(s, first.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json({"results": [{"tool": "charge_then_hang"}]})
    assert (invocations(world_db, "charge_then_hang"), effects(world_db, "charge_then_hang")) == (1, 1)


def test_scenario_4_worker_part_50_active_runs_killed_all_resume_or_settle_under_the_new_epoch(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    """Scenario 4 without its broker restart (the broker is shared): 50 runs in flight when their worker dies."""
    s = topics
    op = plan(
        {"tool": "charge_idem", "args": {"amount": 1}}, {"sleep_s": 1.0}, {"tool": "charge_idem", "args": {"amount": 2}}
    )
    subs = [proposal(f"conv-4-{i}", value=op) for i in range(50)]
    # Killed once 50 calls have settled: most runs are active (between their two calls), a few may have settled.
    a = spawn_worker("a", failpoints="engine.after_settled_commit=50*kill")
    t0 = time.monotonic()
    send(s, *subs)
    killed(a, tmp_path / "a.log")
    t_kill = time.monotonic() - t0
    done_at_kill = {r.submission_id for r in settlements(s)}
    assert len(done_at_kill) < 40, f"{len(done_at_kill)} runs settled before the kill: too few were active"
    spawn_worker("b")
    wait_for(lambda: len(settlements(s)) >= 50, TIMEOUT_S, "all 50 runs to settle")
    _log.warning(
        "scenario 4: killed after %.1f s with %d settled; all settled after %.1f s",
        t_kill,
        len(done_at_kill),
        time.monotonic() - t0,
    )
    final = settlements(s)
    by_sub = {r.submission_id: r for r in final}
    counts = Counter(r.submission_id for r in final)
    promise("DUR-002.one-settlement", counts == Counter({x.submission_id: 1 for x in subs}), f"{counts}")
    expected = canonical_json(
        {"results": [{"charged": 1, "tool": "charge_idem"}, 1.0, {"charged": 2, "tool": "charge_idem"}]}
    )
    all_events = log_events(s)
    started = [e for e in all_events if isinstance(e, AttemptStarted)]
    epochs = sorted({e.owner_epoch for e in started})
    assert len(epochs) == 2, f"owner epochs {epochs}: one before the kill, one after"
    for x in subs:
        r = by_sub[x.submission_id]
        assert r.outcome is SettlementOutcome.COMPLETED and r.reply_json == expected, r
        last = [e for e in started if e.submission_id == x.submission_id][-1]
        if x.submission_id in done_at_kill:
            continue  # settled by the first owner before it died
        promise(
            "DUR-006.no-dead-epoch-owner",
            last.owner_epoch == epochs[-1],
            f"{x.submission_id} last ran under epoch {last.owner_epoch}; live epoch {epochs[-1]}",
        )
    per_key = _per_key(world_db, "effects", "charge_idem")
    promise(
        "DUR-010.one-effect",
        len(per_key) == 100 and set(per_key.values()) == {1},
        f"{len(per_key)} keys; {len(done_at_kill)} runs settled before the kill",
    )
