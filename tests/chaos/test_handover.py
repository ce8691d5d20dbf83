"""SIGTERM during load: a graceful handover loses and duplicates nothing (issue 5 acceptance; docs/design.md §3).

Two real ``settled worker`` processes share a 3-partition namespace while the test sends a steady stream of
submissions (echo runs with small seeded delays) over conversations spread across every partition. One worker gets
SIGTERM mid-stream: it finishes its turn, checkpoints, leaves the group (its partitions are revoked, not lost) and
exits 0; the other claims its partitions with a higher epoch. Afterwards every submission was admitted once and
settled once, and each conversation settled in admission order (which is the order it was sent in).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.processors import partition_for_key
from settled.schemas import (
    LogEvent,
    OwnershipClaimed,
    Receipt,
    ReceiptOutcome,
    SettlementOutcome,
    SettlementRecord,
    SubmissionAdmitted,
    SubmissionProposed,
)
from settled.testing import WorkerProcess
from tests._promise import promise
from tests.harness.factories import proposal
from tests.integration.workerproc import Inbox, Tail, batches, spawn_worker

PARTITIONS = 3
pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.partitions(PARTITIONS)]
CONVERSATIONS_PER_PARTITION = 4
RATE_PER_S = 30.0
LOAD_BEFORE_SIGTERM_S = 4.0
LOAD_AFTER_SIGTERM_S = 5.0
SEED = 20261129


def _conversations() -> list[str]:
    """Conversation ids, ``CONVERSATIONS_PER_PARTITION`` on every partition (settled's murmur2 placement)."""
    by_partition: dict[int, list[str]] = defaultdict(list)
    i = 0
    while any(len(by_partition[p]) < CONVERSATIONS_PER_PARTITION for p in range(PARTITIONS)):
        conv = f"handover-{i}"
        p = partition_for_key(conv.encode(), PARTITIONS)
        if len(by_partition[p]) < CONVERSATIONS_PER_PARTITION:
            by_partition[p].append(conv)
        i += 1
    return [c for p in range(PARTITIONS) for c in by_partition[p]]


def _owners(log: Tail) -> dict[int, tuple[str, int]]:
    """The latest claim per partition: partition -> (worker id, epoch)."""
    out: dict[int, tuple[str, int]] = {}
    for _, _, b in batches(log):
        for e in b.events:
            if isinstance(e, OwnershipClaimed):
                out[e.partition] = (e.worker_id, e.owner_epoch)
    return out


class _Load:
    """Sends submissions at a steady rate from a thread until stopped; remembers them in send order."""

    def __init__(self, s: Settings, conversations: list[str]) -> None:
        self.inbox = Inbox(s)
        self.conversations = conversations
        self.sent: list[SubmissionProposed] = []
        self.rng = random.Random(SEED)
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            n = 0
            while not self._stop.wait(1.0 / RATE_PER_S):
                conv = self.conversations[n % len(self.conversations)]
                sub = proposal(conv, value={"n": n, "delay_s": round(self.rng.uniform(0.0, 0.15), 3)})
                self.inbox.send(sub)
                self.sent.append(sub)
                n += 1
        except BaseException as exc:  # noqa: BLE001 - re-raised by stop() in the test thread
            self._errors.append(exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._errors:
            raise self._errors[0]


def _sigterm_handover(s: Settings, tmp_path: Path, delay_s: float) -> tuple[list[LogEvent], SettlementRecord]:
    """Start one submission taking ``delay_s`` on a first worker, SIGTERM it once the attempt started (it must exit
    0), start a second worker, and return the log's events and the submission's one settlement."""
    sub = proposal(_conversations()[0], value={"delay_s": delay_s})
    log, settlements = Tail(s, "log"), Tail(s, "settlements")
    inbox = Inbox(s)
    workers: list[WorkerProcess] = []
    try:
        workers.append(spawn_worker(s, tmp_path, "first"))
        inbox.send(sub)
        log.wait(
            lambda: any(type(e).__name__ == "AttemptStarted" for _, _, b in batches(log) for e in b.events),
            60,
            "the attempt to start",
        )
        workers[0].send_signal(signal.SIGTERM)
        assert workers[0].proc.wait(60) == 0, workers[0].tail()
        workers.append(spawn_worker(s, tmp_path, "second"))
        settlements.wait(lambda: bool(settlements.values()), 60, "the settlement")
        log.catch_up()
    finally:
        for w in workers:
            w.kill_and_wait()
        for t in (log, settlements):
            t.close()
    events = [e for _, _, b in batches(log) for e in b.events]
    (record,) = [r for r in settlements.values() if isinstance(r, SettlementRecord)]
    return events, record


def test_sigterm_during_load_hands_partitions_over_gracefully(topics: Settings, tmp_path: Path) -> None:
    s = topics
    conversations = _conversations()
    log, receipts, settlements = Tail(s, "log"), Tail(s, "receipts"), Tail(s, "settlements")
    workers: dict[str, WorkerProcess] = {}
    load = _Load(s, conversations)
    try:
        workers["w1"] = spawn_worker(s, tmp_path, "w1")
        log.wait(lambda: set(_owners(log)) == set(range(PARTITIONS)), 60, "w1 to claim every partition")
        workers["w2"] = spawn_worker(s, tmp_path, "w2")
        log.wait(
            lambda: {w for w, _ in _owners(log).values()} == {"w1", "w2"}, 60, "the partitions to be shared by w1, w2"
        )
        load.start()
        time.sleep(LOAD_BEFORE_SIGTERM_S)

        log.poll(0.2)
        before = _owners(log)
        leaving = max(("w1", "w2"), key=lambda w: sum(1 for o, _ in before.values() if o == w))
        staying = "w2" if leaving == "w1" else "w1"
        moved = sorted(p for p, (o, _) in before.items() if o == leaving)
        sigterm_at, sigterm_ts = time.monotonic(), datetime.now(UTC).isoformat(timespec="milliseconds")
        workers[leaving].send_signal(signal.SIGTERM)
        log.wait(
            lambda: all(_owners(log)[p][0] == staying for p in moved), 60, f"{staying} to claim {leaving}'s {moved}"
        )
        handover_s = time.monotonic() - sigterm_at
        exit_code = workers[leaving].proc.wait(60)

        time.sleep(LOAD_AFTER_SIGTERM_S)
        load.stop()
        sent = load.sent
        settlements.wait(
            lambda: sum(isinstance(r, SettlementRecord) for r in settlements.values()) >= len(sent),
            90,
            f"{len(sent)} settlements",
        )
        # Barriers, one per partition on a conversation of the load: a duplicate settlement or receipt of the load
        # precedes its partition's barrier settlement.
        barriers = {
            partition_for_key(c.encode(), PARTITIONS): proposal(c, value="barrier") for c in reversed(conversations)
        }
        Inbox(s).send(*barriers.values())
        barrier_ids = {b.submission_id for b in barriers.values()}
        settlements.wait(
            lambda: barrier_ids <= {r.submission_id for r in settlements.values() if isinstance(r, SettlementRecord)},
            90,
            "the barriers' settlements",
        )
        for tail in (log, receipts, settlements):
            tail.catch_up()
    finally:
        load.stop()
        for w in workers.values():
            w.kill_and_wait()
        for t in (log, receipts, settlements):
            t.close()

    # The handover was graceful: SIGTERM, checkpoint, revoke (not lost), exit 0; the survivor claimed the rest.
    gone = workers[leaving]
    assert exit_code == 0, f"{leaving} exited {exit_code} after SIGTERM:\n{gone.tail()}"
    revoked = sorted(p for line in gone.logged("revoked") if line["ts"] >= sigterm_ts for p in line["partitions"])
    assert revoked == moved, f"{leaving} revoked {revoked}, owned {moved}:\n{gone.tail()}"
    assert not [line for line in gone.logged("lost") if line.get("partitions")], gone.tail()
    after = _owners(log)
    for p in moved:
        assert after[p][0] == staying and after[p][1] > before[p][1], (p, before[p], after[p])
    # Every batch after the survivor's claim of a moved partition carries the survivor's epoch.
    for p in moved:
        claim_at = max(o for part, o, b in batches(log) if part == p and isinstance(b.events[0], OwnershipClaimed))
        stale = [
            (o, b.batch_id) for part, o, b in batches(log) if part == p and o > claim_at and b.owner_epoch < after[p][1]
        ]
        assert not stale, f"partition {p}: batches of an older epoch after {staying}'s claim: {stale}"

    # Nothing lost, nothing duplicated.
    ids = [sub.submission_id for sub in sent]
    admitted = Counter(
        e.submission_id
        for _, _, b in batches(log)
        for e in b.events
        if isinstance(e, SubmissionAdmitted) and e.submission_id not in barrier_ids
    )
    promise("DUR-002.no-lost-input", set(admitted) == set(ids), f"{len(set(ids) - set(admitted))} never admitted")
    promise("DUR-007.once", all(n == 1 for n in admitted.values()), f"admitted twice: {admitted.most_common(3)}")
    admission_receipts = Counter(
        r.request_id
        for r in receipts.values()
        if isinstance(r, Receipt) and r.outcome is ReceiptOutcome.ADMITTED and r.request_id not in barrier_ids
    )
    promise("DUR-007.once", admission_receipts == Counter(ids), f"receipts: {admission_receipts.most_common(3)}")
    records = [
        r for r in settlements.values() if isinstance(r, SettlementRecord) and r.submission_id not in barrier_ids
    ]
    counts = Counter(r.submission_id for r in records)
    promise("DUR-002.one-settlement", counts == Counter(ids), f"settlements: {counts.most_common(3)} of {len(ids)}")
    assert all(r.outcome is SettlementOutcome.COMPLETED for r in records), [
        r for r in records if r.outcome.value != "completed"
    ][:3]

    # FIFO per conversation: settlement order = admission order = send order.
    sent_order: dict[str, list[str]] = defaultdict(list)
    for sub in sent:
        sent_order[sub.conversation_id].append(sub.submission_id)
    admitted_order: dict[str, list[str]] = defaultdict(list)
    for _, _, b in batches(log):
        for e in b.events:
            if isinstance(e, SubmissionAdmitted) and e.submission_id not in barrier_ids:
                admitted_order[e.conversation_id].append(e.submission_id)
    settled_order: dict[str, list[str]] = defaultdict(list)
    for r in records:
        settled_order[r.conversation_id].append(r.submission_id)
    promise("DUR-004.fifo", dict(admitted_order) == dict(sent_order), "admission order differs from send order")
    promise("DUR-004.fifo", dict(settled_order) == dict(sent_order), "settlement order differs from admission order")
    retried = sum(1 for r in records if r.attempt_count > 1)
    print(
        f"{len(ids)} submissions; {leaving} left with partitions {moved}; {staying} claimed them {handover_s:.1f} s "
        f"after SIGTERM; {retried} submissions needed a second attempt"
    )


class RevokeNotExplained(AssertionError):
    """The running attempt was neither settled before the worker left nor explained by ``AttemptInterrupted``."""


def test_sigterm_explains_the_running_attempt_in_the_log(topics: Settings, tmp_path: Path) -> None:
    """A SIGTERM is an ownership change the log explains, not a death (docs/design.md §5).

    The attempt running when the worker gets SIGTERM either finishes within the revoke bound and settles before the
    worker leaves (docs/design.md §3: running work finishes and commits), or the departing owner records
    ``AttemptInterrupted`` for it. Either way its successor records no recovery decision for it.
    """
    logged, record = _sigterm_handover(topics, tmp_path, 1.0)
    events = [type(e).__name__ for e in logged]
    settled_before_leaving = record.attempt_count == 1
    explained = "AttemptInterrupted" in events and "RecoveryDecision" not in events
    if not (settled_before_leaving or explained):
        raise RevokeNotExplained(f"attempts {record.attempt_count}; log events {events}")


def test_sigterm_past_the_grace_records_attempt_interrupted(
    topics: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt still running when the revoke bound runs out is recorded ``AttemptInterrupted("graceful_revoke")``.

    The successor sees the attempt in Ready, not Recovery: it records no recovery decision, runs attempt 2, and the
    revoked attempt is not charged to ``max_attempts`` (docs/design.md §3, §5).
    """
    monkeypatch.setenv("SETTLED_REVOKE_GRACE_S", "0.3")  # the children inherit it
    events, record = _sigterm_handover(topics, tmp_path, 3.0)
    names = [type(e).__name__ for e in events]
    interrupted = [e for e in events if type(e).__name__ == "AttemptInterrupted"]
    assert [getattr(e, "reason", None) for e in interrupted] == ["graceful_revoke"], names
    assert "RecoveryDecision" not in names, names
    assert record.outcome is SettlementOutcome.COMPLETED and record.attempt_count == 2, record
