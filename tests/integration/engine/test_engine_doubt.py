"""Calls in doubt in a live worker: aborts while a tool runs, a stopped tool server, hung tools (docs/design.md §5).

One real ``settled worker`` child per test; the tool doubles count invocations, returns and effects in the world
database (see ``engine_app``). The app gives a call in flight an abort grace of 1 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from settled._settings import Settings
from settled.schemas import (
    ReceiptOutcome,
    RecoveryDecisionKind,
    ResolutionKind,
    SettlementOutcome,
    ToolCallSettled,
    ToolCallUnknown,
    canonical_json,
)
from tests._promise import promise
from tests.harness.barriers import pass_barrier, settlements_before
from tests.integration.engine._helpers import (
    TIMEOUT_S,
    abort_command,
    count,
    decisions,
    effects,
    events_of,
    invocations,
    log_events,
    plan,
    receipt,
    returns,
    send,
    settled,
    sign_resolution,
)
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import flag, world
from tests.integration.helpers import proposal, wait_for

pytestmark = [pytest.mark.integration]


def test_abort_while_an_idempotent_tool_runs_settles_aborted_and_its_late_return_appends_nothing(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path
) -> None:
    s = topics
    sub = proposal("conv-a", value=plan({"tool": "slow_long_idem", "args": {"sleep_s": 8}}))
    spawn_worker("w")
    send(s, sub)
    wait_for(lambda: invocations(world_db, "slow_long_idem") == 1, TIMEOUT_S, "the slow tool to start")
    send(s, abort_command("conv-a", sub.submission_id))
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the aborted settlement")
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.ABORTED, result
    assert returns(world_db, "slow_long_idem") == 0, "settled aborted before the tool returned (bounded grace)"
    wait_for(lambda: returns(world_db, "slow_long_idem") == 1, TIMEOUT_S, "the tool's late return")
    # Barrier (the same conversation, after the aborted submission): a late append of the old attempt precedes it.
    barrier = pass_barrier(s, "conv-a", plan())
    late = [e for e in events_of(s, sub.submission_id) if isinstance(e, ToolCallSettled)]
    promise("DUR-006.attempt-token", late == [], f"the superseded attempt appended {late}")
    assert decisions(s, sub.submission_id) == [RecoveryDecisionKind.TERMINALIZE]
    assert [r.submission_id for r in settlements_before(s, barrier)] == [sub.submission_id]


def test_abort_while_a_non_idempotent_call_is_in_flight_is_unknown_then_aborted_once_resolved(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path
) -> None:
    s = topics
    sub = proposal("conv-b", value=plan({"tool": "slow_long", "args": {"sleep_s": 8}}))
    spawn_worker("w")
    send(s, sub)
    wait_for(lambda: invocations(world_db, "slow_long") == 1, TIMEOUT_S, "the slow tool to start")
    send(s, abort_command("conv-b", sub.submission_id))
    wait_for(lambda: bool(decisions(s, sub.submission_id)), TIMEOUT_S, "the recovery decision")
    assert decisions(s, sub.submission_id) == [RecoveryDecisionKind.UNKNOWN]
    wait_for(lambda: returns(world_db, "slow_long") == 1, TIMEOUT_S, "the tool's late return")
    # Barrier (another conversation: conv-b waits behind the Unknown): a settlement the late return wrongly caused
    # precedes the barrier's.
    pass_barrier(s, "conv-barrier", plan())
    assert settled(s, sub.submission_id) is None, "an abort does not settle a call in doubt (docs/design.md §5)"
    assert not [e for e in events_of(s, sub.submission_id) if isinstance(e, ToolCallSettled)]
    (unknown,) = [e for e in events_of(s, sub.submission_id) if isinstance(e, ToolCallUnknown)]
    send(s, sign_resolution("conv-b", sub.submission_id, unknown.call_id, {"slept": 8}))
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the aborted settlement")
    result = settled(s, sub.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.ABORTED, result
    assert invocations(world_db, "slow_long") == 1


def test_a_stopped_tool_server_retries_the_idempotent_call_and_makes_the_other_unknown(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path
) -> None:
    s = topics
    with world(str(world_db)) as db:
        flag(db, "server_down", True)
    idem = proposal("conv-r1", value=plan({"tool": "remote_idem"}))
    once = proposal("conv-r2", value=plan({"tool": "remote_once"}))
    spawn_worker("w")
    send(s, idem, once)
    wait_for(lambda: invocations(world_db, "remote_idem") >= 3, TIMEOUT_S, "retries of the idempotent call")
    wait_for(lambda: bool(decisions(s, once.submission_id)), TIMEOUT_S, "the non-idempotent call's decision")
    assert settled(s, idem.submission_id) is None
    with world(str(world_db)) as db:
        flag(db, "server_down", False)
    wait_for(lambda: settled(s, idem.submission_id) is not None, TIMEOUT_S, "the idempotent call to settle")
    result = settled(s, idem.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json({"results": [{"tool": "remote_idem"}]})
    keys = count(world_db, "SELECT count(DISTINCT key) FROM invocations WHERE tool = 'remote_idem'")
    assert keys == 1 and effects(world_db, "remote_idem") == 1
    assert decisions(s, once.submission_id) == [RecoveryDecisionKind.UNKNOWN]
    assert invocations(world_db, "remote_once") == 1 and settled(s, once.submission_id) is None
    recorded = [e for e in log_events(s) if isinstance(e, ToolCallSettled)]
    promise(
        "DESIGN-5.no-transport-error-result",
        all(e.error is None for e in recorded),
        f"a connection error was recorded as a tool result: {[e.error for e in recorded if e.error]}",
    )


def test_a_hung_tool_past_its_timeout_is_retried_when_idempotent_and_unknown_otherwise(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path
) -> None:
    s = topics
    idem = proposal("conv-h1", value=plan({"tool": "slow_idem", "args": {"sleep_s": 3, "first_only": True}}))
    once = proposal("conv-h2", value=plan({"tool": "slow_once", "args": {"sleep_s": 3}}))
    spawn_worker("w")
    send(s, idem, once)
    wait_for(lambda: settled(s, idem.submission_id) is not None, TIMEOUT_S, "the idempotent call to settle")
    result = settled(s, idem.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert invocations(world_db, "slow_idem") == 2
    assert count(world_db, "SELECT count(DISTINCT key) FROM invocations WHERE tool = 'slow_idem'") == 1
    wait_for(lambda: bool(decisions(s, once.submission_id)), TIMEOUT_S, "the hung call's decision")
    assert decisions(s, once.submission_id) == [RecoveryDecisionKind.UNKNOWN]
    (unknown,) = [e for e in events_of(s, once.submission_id) if isinstance(e, ToolCallUnknown)]
    assert "timeout_s=1" in unknown.reason
    wait_for(lambda: returns(world_db, "slow_idem") == 2, TIMEOUT_S, "the first, hung execution to return")
    assert effects(world_db, "slow_idem") == 1, "the key deduped the hung execution's late effect"
    assert invocations(world_db, "slow_once") == 1


def test_only_the_resolver_s_signature_moves_an_unknown_run_on(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path
) -> None:
    s = topics
    with world(str(world_db)) as db:
        flag(db, "server_down", True)
    failed = proposal("conv-x1", value=plan({"tool": "remote_once"}))
    retried = proposal("conv-x2", value=plan({"tool": "remote_once"}))
    queued = proposal("conv-x1", value=plan())
    spawn_worker("w")
    send(s, failed, retried, queued)
    wait_for(
        lambda: bool(decisions(s, failed.submission_id)) and bool(decisions(s, retried.submission_id)),
        TIMEOUT_S,
        "the Unknown decisions",
    )
    (call,) = [e for e in events_of(s, failed.submission_id) if isinstance(e, ToolCallUnknown)]
    forged = sign_resolution(
        "conv-x1",
        failed.submission_id,
        call.call_id,
        kind=ResolutionKind.OUTCOME_FOR_SUBMISSION,
        outcome=SettlementOutcome.COMPLETED,
        key=Ed25519PrivateKey.generate(),
    )
    unsigned = sign_resolution("conv-x1", failed.submission_id, call.call_id, "x", key=None)
    send(s, forged, unsigned)
    wait_for(
        lambda: receipt(s, forged.command_id) is not None and receipt(s, unsigned.command_id) is not None,
        TIMEOUT_S,
        "the commands' receipts",
    )
    for cmd, reason in ((forged, "bad_signature"), (unsigned, "unsigned")):
        reply = receipt(s, cmd.command_id)
        assert reply is not None and reply.outcome is ReceiptOutcome.REJECTED, reply
        assert (reply.reason or "").startswith(f"{reason}:"), reply
    # Barrier (another conversation: conv-x1 waits behind the Unknown): a move the rejected commands wrongly caused
    # precedes the barrier's settlement.
    pass_barrier(s, "conv-barrier", plan())
    assert settled(s, failed.submission_id) is None and settled(s, queued.submission_id) is None
    assert decisions(s, failed.submission_id) == [RecoveryDecisionKind.UNKNOWN]

    # The resolver decides the submission's outcome: Unknown -> Terminalizing -> failed; the lane moves on.
    decided = sign_resolution(
        "conv-x1",
        failed.submission_id,
        call.call_id,
        kind=ResolutionKind.OUTCOME_FOR_SUBMISSION,
        outcome=SettlementOutcome.FAILED,
    )
    # The resolver says the other call never took effect: it is prepared again under its key and runs.
    with world(str(world_db)) as db:
        flag(db, "server_down", False)
    (other,) = [e for e in events_of(s, retried.submission_id) if isinstance(e, ToolCallUnknown)]
    safe = sign_resolution("conv-x2", retried.submission_id, other.call_id, kind=ResolutionKind.SAFE_TO_RETRY)
    send(s, decided, safe)
    wait_for(lambda: settled(s, queued.submission_id) is not None, TIMEOUT_S, "the queued submission")
    wait_for(lambda: settled(s, retried.submission_id) is not None, TIMEOUT_S, "the retried call to settle")
    r1 = settled(s, failed.submission_id)
    assert r1 is not None and r1.outcome is SettlementOutcome.FAILED and "resolved by ops" in (r1.error_reason or "")
    r2 = settled(s, retried.submission_id)
    assert r2 is not None and r2.outcome is SettlementOutcome.COMPLETED, r2
    keys = count(world_db, "SELECT count(DISTINCT key) FROM invocations WHERE tool = 'remote_once'")
    assert invocations(world_db, "remote_once") == 3 and keys == 2 and effects(world_db, "remote_once") == 1
