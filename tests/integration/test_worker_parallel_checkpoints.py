"""A turn's checkpoints of several partitions run side by side (issue 24 item 3; docs/architecture.md, "Records per
transaction").

Each partition has its own producer and transaction (docs/design.md §3), so the worker no longer waits for one
partition's commit before it begins the next one's. Shown with barriers, no timing: a worker owns two partitions;
every commit is made to fail with an abortable error that blames no record (``appender.abortable_commit_error``), so
both partitions' admissions stay pending, deferred turn after turn. With the loop parked at
``worker.before_checkpoint`` (staged, no checkpoint begun), ``appender.before_commit`` is armed to pause and the
abort disarmed; released, the loop checkpoints both partitions, and both transactions must wait at the commit barrier
at once: one after the other, the second could not begin while the first waits. Released, both submissions settle
once each.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from settled import _failpoints
from settled._settings import Settings
from settled.producers import partition_for_key
from settled.schemas import OwnershipClaimed, SettlementOutcome, SettlementRecord
from tests.harness.factories import proposal
from tests.integration.helpers import wait_for
from tests.integration.workerproc import Inbox, Tail, batches, spawn_worker

pytestmark = [pytest.mark.integration, pytest.mark.partitions(2)]

PARKED = "worker.before_checkpoint"
COMMIT = "appender.before_commit"
ABORT = "appender.abortable_commit_error"


def _conversation_on(partition: int, partitions: int) -> str:
    return next(
        c for c in (f"conv-par-{i}" for i in range(1000)) if partition_for_key(c.encode(), partitions) == partition
    )


def test_a_turns_checkpoints_of_two_partitions_wait_at_the_commit_at_once(topics: Settings, tmp_path: Path) -> None:
    s = topics
    control = _failpoints.FailpointControl(tmp_path / "fp")
    inbox = Inbox(s)
    log, settlements = Tail(s, "log"), Tail(s, "settlements")
    subs = [proposal(_conversation_on(p, s.partitions), value={"delay_s": 0.0}) for p in (0, 1)]
    worker = spawn_worker(s, tmp_path, "worker-par", control=control)
    try:
        log.wait(
            lambda: sum(isinstance(e, OwnershipClaimed) for _, _, b in batches(log) for e in b.events) == 2,
            60,
            "both partitions claimed",
        )
        control.arm(ABORT, "raise")  # every commit from now on aborts, blaming no record: the batches stay pending
        inbox.send(*subs)
        wait_for(
            lambda: {line.get("partition") for line in worker.logged("transaction aborted")} >= {0, 1},
            60,
            "a deferred transaction on each partition",
        )
        control.arm(PARKED, "1*pause(60s)")
        control.wait_reached(PARKED, 60)  # both partitions' admissions pending, no checkpoint of this turn begun
        control.arm(COMMIT, "pause(60s)")
        control.disarm(ABORT)
        control.disarm(PARKED)
        assert control.release(PARKED) == 1
        wait_for(
            lambda: len(control.waiting(COMMIT)) >= 2 or worker.poll() is not None,
            60,
            "both partitions' transactions to wait at the commit barrier at once",
        )
        waiting = control.waiting(COMMIT)
        assert len(waiting) == 2, f"{len(waiting)} transactions waited at once:\n{worker.tail()}"
        control.disarm(COMMIT)
        assert control.release(COMMIT) == 2
        settlements.wait(
            lambda: sum(isinstance(r, SettlementRecord) for r in settlements.values()) >= 2, 60, "both settlements"
        )
        assert worker.poll() is None, worker.tail()
    finally:
        worker.kill_and_wait()
        for t in (log, settlements):
            t.close()
    records = [r for r in settlements.values() if isinstance(r, SettlementRecord)]
    assert Counter(r.submission_id for r in records) == Counter(p.submission_id for p in subs), records
    assert all(r.outcome is SettlementOutcome.COMPLETED for r in records), records
