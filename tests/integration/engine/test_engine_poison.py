"""A submission that kills its worker: attempts resume one at a time after a death (docs/design.md §5).

Real workers are restarted by the test after every death, like a supervisor would. The poison submission's agent
calls ``os._exit(1)`` outside any tool call; healthy submissions of other conversations run beside it on the same
partition. After the first death the new owner resumes the interrupted attempts one at a time, so the poison one
dies alone, is charged, and settles failed after ``max_attempts``; the healthy ones all complete; the poison
conversation's next submission runs. The same death inside a non-idempotent tool call makes the call Unknown
(docs/semantics.md §16).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.schemas import RecoveryDecisionKind, SettlementOutcome
from tests._promise import promise
from tests.harness.barriers import pass_barrier
from tests.integration.engine._helpers import (
    decisions,
    invocations,
    plan,
    send,
    settled,
    settlements,
    supervise_until_settled,
)
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.helpers import proposal

pytestmark = [pytest.mark.integration, pytest.mark.chaos]


def test_a_poison_submission_fails_after_max_attempts_and_its_neighbours_complete(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path
) -> None:
    s = topics
    healthy = [
        proposal(f"conv-h{i}", value=plan({"sleep_s": 1.5}, {"tool": "charge_idem", "args": {"amount": i}}))
        for i in range(3)
    ]
    poison = proposal("conv-p", value=plan({"sleep_s": 0.3}, {"exit": 1}))
    after_poison = proposal("conv-p", value=plan())
    in_tool = proposal("conv-t", value=plan({"tool": "exit_inside"}))
    send(s, *healthy, poison, after_poison)
    everyone = [*healthy, poison, after_poison]
    deaths, worker = supervise_until_settled(s, everyone, spawn_worker, max_deaths=6, timeout_s=240, poll_s=0.5)
    result = settled(s, poison.submission_id)
    assert result is not None
    promise(
        "DUR-014.poison-fails",
        result.outcome is SettlementOutcome.FAILED and result.attempt_count == 3,
        f"the poison submission: {result}",
    )
    for p in healthy:
        r = settled(s, p.submission_id)
        promise(
            "DUR-014.neighbours-complete",
            r is not None and r.outcome is SettlementOutcome.COMPLETED,
            f"a healthy neighbour of the poison submission: {r}",
        )
    nxt = settled(s, after_poison.submission_id)
    assert nxt is not None and nxt.outcome is SettlementOutcome.COMPLETED, nxt
    assert deaths == 3, f"{deaths} deaths: one per poison attempt"
    counts = Counter(r.submission_id for r in settlements(s))
    assert counts == Counter({p.submission_id: 1 for p in everyone}), counts

    # The same death inside a non-idempotent tool call: the call is Unknown, never re-run.
    assert worker is not None
    send(s, in_tool)
    assert worker.wait(60) == 1
    worker = spawn_worker("after-tool-death")
    deadline = time.monotonic() + 90
    while not decisions(s, in_tool.submission_id) and time.monotonic() < deadline:
        time.sleep(0.5)  # polling the log until the decision is in it
    # Barrier (another conversation): a re-run of the call would kill the worker before it settles the barrier.
    pass_barrier(s, "conv-barrier", plan())
    assert decisions(s, in_tool.submission_id) == [RecoveryDecisionKind.UNKNOWN]
    assert invocations(world_db, "exit_inside") == 1 and settled(s, in_tool.submission_id) is None
    assert worker.poll() is None, "the worker died again: the call was re-run"
