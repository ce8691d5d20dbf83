"""Restart in place (issue 24 item 4): static membership, the fence at claim, and two workers with one instance id.

Real broker, real ``settled worker`` children. A worker slot's ``SETTLED_WORKER_INSTANCE_ID`` (Kafka
``group.instance.id``) makes a worker killed with -9 and started again in its slot a returning static member: it gets
its partitions back at once instead of after the dead member's session (docs/architecture.md, "Restart in place").
The workers here run with a 30 s session and a 25 s transaction timeout, so that a restart waiting out either is
told apart from one that does not by far more than the machine's load can blur.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.processors import INSTANCE_FENCED_EXIT_CODE
from settled.producers import end_offsets
from settled.schemas import RecoveryDecision, RecoveryDecisionKind, SettlementOutcome
from tests.harness.barriers import pass_barrier
from tests.integration.engine._helpers import (
    TIMEOUT_S,
    effects,
    events_of,
    killed,
    plan,
    send,
    settled,
    settlements,
)
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.helpers import proposal, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

#: Long timeouts: a restart that waits out the dead member's session (30 s) or its open transaction (25 s) is slower
#: than `IN_PLACE_BOUND_S` by a margin no load on this machine closes.
LONG_TIMEOUTS = {
    "SETTLED_SESSION_TIMEOUT_MS": "30000",
    "SETTLED_HEARTBEAT_INTERVAL_MS": "1000",
    "SETTLED_TRANSACTION_TIMEOUT_MS": "25000",
}
#: Kill to settlement of the interrupted submission, restarted in place: a process start, a claim and the run's
#: remaining work (measured a few seconds on a loaded 2-core machine), well below the 25 s and 30 s it must not wait.
IN_PLACE_BOUND_S = 20.0


def _slot(instance_id: str) -> dict[str, str]:
    return {"SETTLED_WORKER_INSTANCE_ID": instance_id, **LONG_TIMEOUTS}


def test_a_worker_killed_in_an_open_transaction_and_restarted_in_its_slot_resumes_at_once_and_settles_once(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    first = proposal("conv-restart", value=plan({"tool": "charge_idem", "args": {"amount": 3}}))
    second = proposal("conv-restart", value=plan())
    a = spawn_worker("a", failpoints="engine.tool_returned=1*pause(60s)", env=_slot("slot-0"))
    send(s, first, second)
    assert a.control is not None
    a.control.wait_reached("engine.tool_returned", TIMEOUT_S)  # the tool's effect applied, its result not committed
    a.kill_at("appender.after_produce")  # the next transaction dies with its records on the broker, uncommitted
    a.control.release("engine.tool_returned")
    killed(a, tmp_path / "a.log")
    killed_at_s = time.monotonic()
    a.control.disarm("appender.after_produce")  # the restarted worker shares the folder
    assert end_offsets(s, s.topic("log"), 0, 10).has_open_transaction, "the kill left no open transaction"

    b = spawn_worker("b", env=_slot("slot-0"))
    wait_for(lambda: settled(s, second.submission_id) is not None, TIMEOUT_S, "both submissions to settle")
    elapsed_s = time.monotonic() - killed_at_s
    assert elapsed_s < IN_PLACE_BOUND_S, (
        f"restarted in its slot, the worker took {elapsed_s:.1f} s from the kill to the settlement: it waited out the "
        f"dead member's session or its open transaction\n{b.tail()}"
    )
    # The fence at claim: the new producer's init_transactions aborted the dead one's transaction before it returned,
    # so the claim found none open (it did not wait for the transaction timeout to end it).
    claims = b.logged("partition claimed")
    assert claims and claims[0]["saw_open_transaction"] is False, claims
    assert [line["partitions"] for line in b.logged("assigned")] == [[0]], b.tail()

    result = settled(s, first.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert effects(world_db, "charge_idem") == 1, "the idempotent tool's effect ran twice"
    decisions = [e.decision for e in events_of(s, first.submission_id) if isinstance(e, RecoveryDecision)]
    assert decisions == [RecoveryDecisionKind.SAFE_RETRY], decisions
    pass_barrier(s, "conv-restart", plan())
    counts = Counter(r.submission_id for r in settlements(s))
    assert counts[first.submission_id] == 1 and counts[second.submission_id] == 1, counts


def test_a_worker_with_another_instance_id_takes_a_dead_workers_partitions_over_after_its_session(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    first = proposal("conv-takeover", value=plan({"tool": "charge_idem", "args": {"amount": 4}}))
    a = spawn_worker("a", failpoints="engine.tool_returned=1*kill", env={"SETTLED_WORKER_INSTANCE_ID": "slot-0"})
    send(s, first)
    killed(a, tmp_path / "a.log")
    killed_at_s = time.monotonic()
    b = spawn_worker("b", env={"SETTLED_WORKER_INSTANCE_ID": "slot-1"})
    wait_for(lambda: settled(s, first.submission_id) is not None, TIMEOUT_S, "the submission to settle")
    elapsed_s = time.monotonic() - killed_at_s
    # The dead static member keeps its partitions for its session (dev timeouts: 3 s); then the group gives them to
    # the live member. The bound for a takeover is 10 s.
    assert elapsed_s < s.session_timeout_ms / 1000 + 10, f"takeover took {elapsed_s:.1f} s\n{b.tail()}"
    result = settled(s, first.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert effects(world_db, "charge_idem") == 1
    pass_barrier(s, "conv-takeover", plan())
    assert Counter(r.submission_id for r in settlements(s))[first.submission_id] == 1


def test_two_workers_with_one_instance_id_the_fenced_one_exits_78_naming_the_id_and_the_other_works_on(
    topics: Settings, spawn_worker: SpawnWorker
) -> None:
    s = topics
    a = spawn_worker("a", env={"SETTLED_WORKER_INSTANCE_ID": "slot-dup"})
    wait_for(lambda: bool(a.logged("partition claimed")), TIMEOUT_S, "the first worker's claim")
    b = spawn_worker("b", env={"SETTLED_WORKER_INSTANCE_ID": "slot-dup"})
    try:
        code = a.wait(TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the fenced worker did not exit:\n{a.tail()}") from None
    assert code == INSTANCE_FENCED_EXIT_CODE, f"exit {code}\n{a.tail()}"
    fenced = [line for line in a.log_lines() if line.get("level") == "CRITICAL"]
    assert fenced and fenced[0]["instance_id"] == "slot-dup", a.tail()
    assert "SETTLED_WORKER_INSTANCE_ID='slot-dup'" in fenced[0]["error"], fenced
    # The worker that fenced it owns the partition and decides on.
    pass_barrier(s, "conv-dup", plan())
    assert b.poll() is None, b.tail()
