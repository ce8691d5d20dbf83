"""Fencing with an offset-free write (scenario 8; DUR-006, docs/design.md §3; issue 5 acceptance).

Worker A admits a submission and runs its echo; a failpoint barrier holds A where the finished run's settlement is
about to be staged, and the test SIGSTOPs it there. Worker B joins, is given the partition once A's session times
out, fences A's transactional producer (``init_transactions``), restores, claims the next epoch, runs the submission
again and settles it. Then A is resumed and released: it really attempts its settlement append — a write that
carries no consumer offsets of its own, which KIP-447 group fencing alone would not stop — and must get the fenced
error, write nothing visible, and drop the partition. A live projector follows the log throughout: the projection
shows only the new owner's work after the takeover (scenario 8's projection part, issue 7).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from settled import _failpoints
from settled._settings import Settings
from settled.producers import reader_config
from settled.projections import ProjectionNames
from settled.schemas import LogBatch, OwnershipClaimed, Settlement, SettlementOutcome, SettlementRecord
from tests._promise import promise
from tests.harness.factories import proposal
from tests.integration.helpers import (
    CODEC,
    LiveProjector,
    check_clean,
    fresh_projection,
    projecting,
    projection_rows,
    wait_for,
    wait_projected,
)
from tests.integration.workerproc import Inbox, Tail, batches, spawn_worker

pytestmark = pytest.mark.integration

BARRIER = "conductor.before_settle"


@pytest.fixture
def projection(topics: Settings) -> Iterator[tuple[ProjectionNames, LiveProjector]]:
    """A live projector of the test's log into a projection of its own, for the test's duration."""
    with fresh_projection(topics.postgres_dsn) as names, projecting(topics, names) as live:
        yield names, live


def _all_log_batches(s: Settings, isolation: str) -> list[tuple[int, LogBatch]]:
    """Every batch record on the log partition, read with ``isolation`` (read_uncommitted shows aborted ones too)."""
    c = Consumer(reader_config(s, "fencing-reader", isolation_level=isolation))
    tp = TopicPartition(s.topic("log"), 0)
    end = c.get_watermark_offsets(tp, timeout=10, cached=False)[1]
    c.assign([TopicPartition(s.topic("log"), 0, 0)])
    out: list[tuple[int, LogBatch]] = []
    deadline = time.monotonic() + 30
    while c.position([tp])[0].offset < end and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None or m.error() is not None:
            continue
        value = m.value()
        assert isinstance(value, bytes)
        out.append((m.offset() or 0, CODEC.decode_batch(value, offset=m.offset() or 0).batch))
    c.close()
    return out


def test_a_resumed_owner_is_fenced_on_its_offset_free_settlement(
    topics: Settings, tmp_path: Path, projection: tuple[ProjectionNames, LiveProjector]
) -> None:
    s = topics
    control = _failpoints.FailpointControl(tmp_path / "fp")
    inbox = Inbox(s)
    log, settlements = Tail(s, "log"), Tail(s, "settlements")
    sub = proposal("conv-fence", value={"delay_s": 0.5})
    a = spawn_worker(s, tmp_path, "worker-a", control=control, failpoints=f"{BARRIER}=1*pause(180s)")
    b = None
    try:
        inbox.send(sub)
        control.wait_reached(BARRIER, 60)  # admitted, attempt committed, echo finished; settlement not yet staged
        a.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()

        b = spawn_worker(s, tmp_path, "worker-b", control=control)
        settlements.wait(
            lambda: any(isinstance(r, SettlementRecord) for r in settlements.values()), 90, "B's settlement"
        )
        takeover_s = time.monotonic() - stopped_at
        log.poll(0.5)
        claims = [(o, e) for _, o, bt in batches(log) for e in bt.events if isinstance(e, OwnershipClaimed)]
        assert [e.worker_id for _, e in claims] == ["worker-a", "worker-b"], claims

        a.send_signal(signal.SIGCONT)
        assert control.release(BARRIER) == 1
        try:  # until A reports the fence, or (fencing broken) its late settlement shows up; the checks come below
            wait_for(
                lambda: (
                    bool(a.logged("fenced: dropping the partition"))
                    or settlements.poll(0.05) + sum(isinstance(r, SettlementRecord) for r in settlements.values()) > 1
                ),
                60,
                "A to report that it was fenced",
            )
        except AssertionError:
            pass
        time.sleep(2.0)  # give a wrongly unfenced A time to commit something
        log.poll(0.5), settlements.poll(0.5)
        # The settlement's records were handed to A's producer and failed (the broker refused the old epoch).
        attempted = [line for line in a.logged("delivery failed") if line.get("batch_id", "").startswith("conv-fence:")]
    finally:
        a.kill_and_wait()
        if b is not None:
            b.kill_and_wait()
        for t in (log, settlements):
            t.close()

    (_, claim_a), (claim_b_at, claim_b) = claims
    assert isinstance(claim_a, OwnershipClaimed) and isinstance(claim_b, OwnershipClaimed)
    assert claim_b.owner_epoch > claim_a.owner_epoch, (claim_a, claim_b)
    for isolation in ("read_committed", "read_uncommitted"):
        after = [(o, bt) for o, bt in _all_log_batches(s, isolation) if o > claim_b_at]
        stale = [(o, bt.batch_id, bt.owner_epoch) for o, bt in after if bt.owner_epoch != claim_b.owner_epoch]
        promise(
            "DUR-006.offset-free-fenced",
            not stale,
            f"{isolation}: batches after B's claim (epoch {claim_b.owner_epoch}) with another epoch: {stale}",
        )
    records = [r for r in settlements.values() if isinstance(r, SettlementRecord)]
    events = [e for _, _, bt in batches(log) for e in bt.events if isinstance(e, Settlement)]
    promise(
        "DUR-006.offset-free-fenced",
        len(records) == 1 and len(events) == 1,
        f"the submission has {len(records)} settlement records and {len(events)} Settlement events",
    )
    assert a.logged("fenced: dropping the partition"), f"A did not report the fence:\n{a.tail()}"
    assert attempted, f"A never attempted its settlement append after it was resumed:\n{a.tail()}"
    assert not a.logged("fatal producer error: claiming the partition again"), a.tail()
    (record,) = records
    assert record.submission_id == sub.submission_id
    assert record.outcome is SettlementOutcome.COMPLETED and record.attempt_count == 2, record
    settled_by = next(bt for _, _, bt in batches(log) if any(isinstance(e, Settlement) for e in bt.events))
    assert settled_by.owner_epoch == claim_b.owner_epoch, settled_by
    print(f"takeover after SIGSTOP: {takeover_s:.1f} s; A's refused deliveries: {len(attempted)}")

    # The projection part (issue 7): only the new owner's work after the takeover, and it matches the log.
    names, live = projection
    wait_projected(s, names, 60, live)
    check_clean(s, names, "DUR-015.scenario-8")
    epoch_a, epoch_b = claim_a.owner_epoch, claim_b.owner_epoch
    attempts = sorted(
        (a["attempt"], a["owner_epoch"], a["status"])
        for a in projection_rows(s, names, "attempts")
        if a["submission_id"] == sub.submission_id
    )
    promise(
        "DUR-015.scenario-8",
        len(attempts) == 2
        and attempts[0][:2] == (1, epoch_a)
        and attempts[0][2] not in ("running", "completed")
        and attempts[1] == (2, epoch_b, "completed"),
        f"attempt rows (attempt, owner epoch, status) {attempts}: expected A's interrupted attempt 1 under epoch "
        f"{epoch_a} and B's completed attempt 2 under epoch {epoch_b}",
    )
    (conv,) = [c for c in projection_rows(s, names, "conversations") if c["conversation_id"] == "conv-fence"]
    promise(
        "DUR-015.scenario-8",
        (conv["owner_epoch"], conv["active_submission_id"], conv["queue_depth"]) == (epoch_b, None, 0),
        f"conversation row {conv}: expected owner epoch {epoch_b}, nothing active or queued",
    )
    (part,) = projection_rows(s, names, "partitions")
    assert (part["claim_epoch"], part["claimed_by"]) == (epoch_b, "worker-b"), part
    (row,) = projection_rows(s, names, "settlements")
    promise(
        "DUR-015.scenario-8",
        (row["submission_id"], row["outcome"], row["attempt_count"]) == (sub.submission_id, "completed", 2)
        and row["log_offset"] > claim_b_at,
        f"settlement row {row}: expected B's settlement (attempt 2, after B's claim at offset {claim_b_at})",
    )
    (state,) = [r["state"] for r in projection_rows(s, names, "submissions") if r["submission_id"] == sub.submission_id]
    assert state == "completed", state
