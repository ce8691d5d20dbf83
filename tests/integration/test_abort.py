"""Abort (docs/semantics.md §13, DUR-012) against a real worker: queued, active, repeated, too late, unknown.

The race of an abort with the final append (scenario 6) is `test_abort_raced_against_the_final_append`; a live
projector follows it, and the projection must match the log afterwards (scenario 6's projection part, issue 7).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from settled import _failpoints
from settled._settings import Settings
from settled.processors import Worker
from settled.projections import ProjectionNames
from settled.protocol import PartitionState
from settled.runtime import App
from settled.schemas import (
    AbortRecorded,
    AttemptStarted,
    CommandRejected,
    CommandRejectReason,
    Receipt,
    ReceiptOutcome,
    Settlement,
    SettlementOutcome,
    SettlementRecord,
)
from settled.services._worker_service import build_worker
from settled.testing.echo import EchoAgent
from tests._promise import promise
from tests.harness.barriers import before_first, pass_barrier
from tests.harness.factories import abort_command, proposal
from tests.integration.helpers import (
    LiveProjector,
    check_clean,
    fresh_projection,
    projecting,
    projection_rows,
    running,
    wait_projected,
)
from tests.integration.workerproc import Inbox, Tail, batches, spawn_worker

pytestmark = pytest.mark.integration


@pytest.fixture
def projection(topics: Settings) -> Iterator[tuple[ProjectionNames, LiveProjector]]:
    """A live projector of the test's log into a projection of its own, for the test's duration."""
    with fresh_projection(topics.postgres_dsn) as names, projecting(topics, names) as live:
        yield names, live


def _receipts(tail: Tail, request_id: str) -> list[Receipt]:
    return [r for r in tail.values() if isinstance(r, Receipt) and r.request_id == request_id]


def _settlements(tail: Tail, submission_id: str) -> list[SettlementRecord]:
    return [r for r in tail.values() if isinstance(r, SettlementRecord) and r.submission_id == submission_id]


def _events(log: Tail, kind: type, submission_id: str) -> list[tuple[int, object]]:
    """``(offset, event)`` of every ``kind`` event about ``submission_id`` in the log read so far."""
    return [
        (o, e)
        for _, o, b in batches(log)
        for e in b.events
        if isinstance(e, kind) and getattr(e, "submission_id", None) == submission_id
    ]


def _all_events(log: Tail, submission_id: str) -> list[tuple[int, object]]:
    """``(offset, event)`` of every event of the batches about ``submission_id`` or naming it."""
    return [(o, e) for _, o, b in batches(log) for e in b.events if getattr(e, "submission_id", None) == submission_id]


def test_abort_queued_active_repeated_settled_and_unknown(topics: Settings) -> None:
    s = topics
    inbox = Inbox(s)
    log, receipts, settlements = Tail(s, "log"), Tail(s, "receipts"), Tail(s, "settlements")
    conv = "conv-abort"
    delay_s = 30.0
    s1 = proposal(conv, value={"delay_s": delay_s})  # runs, and is aborted while it runs
    s2 = proposal(conv, value={"n": 2})  # queued behind s1, aborted before its turn
    s3 = proposal(conv, value={"n": 3})  # runs after s1 and completes
    worker: Worker[PartitionState] = build_worker(s, App(agent=EchoAgent()))
    try:
        with running(worker):
            inbox.send(s1, s2, s3)
            log.wait(lambda: bool(_events(log, AttemptStarted, s1.submission_id)), 60, "s1's AttemptStarted")
            receipts.wait(lambda: len(_receipts(receipts, s3.submission_id)) == 1, 30, "s3's receipt")

            # 1. A queued, never-claimed submission settles aborted at once, before the one running ahead of it.
            a2 = abort_command(conv, s2.submission_id)
            inbox.send(a2)
            settlements.wait(lambda: bool(_settlements(settlements, s2.submission_id)), 30, "s2's settlement")
            receipts.wait(lambda: bool(_receipts(receipts, a2.command_id)), 30, "the queued abort's receipt")
            (r2,) = _receipts(receipts, a2.command_id)
            assert r2.outcome is ReceiptOutcome.APPLIED, r2
            (st2,) = _settlements(settlements, s2.submission_id)
            assert st2.outcome is SettlementOutcome.ABORTED and st2.attempt_count == 0, st2
            promise(
                "DUR-012.queued-abort-first",
                not _settlements(settlements, s1.submission_id),
                "the queued abort waited for the running submission ahead of it to settle",
            )

            # 2. An active one: AbortRecorded is canonical before its run is interrupted; it settles aborted.
            a1 = abort_command(conv, s1.submission_id)
            sent_at = time.monotonic()
            inbox.send(a1)
            settlements.wait(lambda: bool(_settlements(settlements, s1.submission_id)), 30, "s1's settlement")
            interrupted_after_s = time.monotonic() - sent_at
            (st1,) = _settlements(settlements, s1.submission_id)
            assert st1.outcome is SettlementOutcome.ABORTED and st1.reply_json is None, st1
            assert interrupted_after_s < delay_s / 2, f"s1's run was not interrupted ({interrupted_after_s:.1f} s)"
            settlements.wait(lambda: bool(_settlements(settlements, s3.submission_id)), 30, "s3's settlement")
            (st3,) = _settlements(settlements, s3.submission_id)
            assert st3.outcome is SettlementOutcome.COMPLETED, st3
            order = [r.submission_id for r in settlements.values() if isinstance(r, SettlementRecord)]
            assert order == [s2.submission_id, s1.submission_id, s3.submission_id], order

            # 3. The same abort again: acknowledged as a duplicate, nothing settles again.
            inbox.send(a1)
            receipts.wait(lambda: len(_receipts(receipts, a1.command_id)) == 2, 30, "the repeated abort's receipt")
            first, again = _receipts(receipts, a1.command_id)
            assert first.outcome is ReceiptOutcome.APPLIED, first
            promise("DUR-012.abort-duplicate", again.outcome is ReceiptOutcome.DUPLICATE, f"{again}")

            # 4. An abort of a settled submission is rejected; the reply names the outcome that won.
            a3 = abort_command(conv, s3.submission_id)
            inbox.send(a3)
            receipts.wait(lambda: bool(_receipts(receipts, a3.command_id)), 30, "the late abort's receipt")
            (r3,) = _receipts(receipts, a3.command_id)
            assert r3.outcome is ReceiptOutcome.REJECTED, r3
            promise(
                "DUR-012.abort-names-winner",
                (r3.reason or "").startswith("already_terminal") and "completed" in (r3.reason or ""),
                f"the rejection of an abort of a completed submission does not name the winner: {r3.reason!r}",
            )

            # 5. An abort aimed at an unknown submission: rejected unknown_target, nothing else appended.
            log.wait(lambda: bool(_events(log, CommandRejected, s3.submission_id)), 30, "a3's CommandRejected")
            settlements.poll(0.5)
            log_before, settled_before = len(log.records), len(settlements.records)
            receipts_before = len(receipts.records)
            ghost = abort_command(conv, "no-such-submission")
            elsewhere = abort_command("conv-never-seen", "no-such-submission-either")
            inbox.send(ghost, elsewhere)
            receipts.wait(lambda: len(receipts.records) >= receipts_before + 2, 30, "the unknown targets' receipts")
            log.wait(lambda: len(log.records) >= log_before + 2, 30, "the unknown targets' decisions")
            # Barrier: anything else the worker might (wrongly) append for them precedes the barrier's records.
            barrier = pass_barrier(s, "conv-abort-barrier").proposal.submission_id
            log.catch_up(30), receipts.catch_up(30), settlements.catch_up(30)
    finally:
        for t in (log, receipts, settlements):
            t.close()

    for cmd in (ghost, elsewhere):
        (r,) = _receipts(receipts, cmd.command_id)
        assert r.outcome is ReceiptOutcome.REJECTED and (r.reason or "").startswith("unknown_target"), r
    new_batches = [
        b
        for _, _, b in before_first(
            log.records, lambda r: any(getattr(e, "submission_id", None) == barrier for e in r[2].events)
        )[log_before:]
    ]
    new_events = [e for b in new_batches for e in b.events]
    new_receipts = [r for _, _, r in before_first(receipts.records, lambda r: r[2].request_id == barrier)]
    new_settlements = [r for _, _, r in before_first(settlements.records, lambda r: r[2].submission_id == barrier)]
    promise(
        "DUR-012.unknown-target-nothing-else",
        len(new_batches) == 2
        and all(isinstance(e, CommandRejected) and e.reason is CommandRejectReason.UNKNOWN_TARGET for e in new_events)
        and len(new_events) == 2
        and len(new_receipts) == receipts_before + 2
        and len(new_settlements) == settled_before,
        f"an abort of an unknown target appended more than its rejection: {new_events}, "
        f"{new_receipts[receipts_before:]}, {new_settlements[settled_before:]}",
    )

    # The log, read after the fact.
    promise(
        "DUR-012.queued-never-attempted",
        _events(log, AttemptStarted, s2.submission_id) == [],
        "an aborted queued submission got an attempt",
    )
    (abort_at, _), *_ = _events(log, AbortRecorded, s1.submission_id)
    ((settled_at, settlement),) = _events(log, Settlement, s1.submission_id)
    promise(
        "DUR-012.abort-canonical-first",
        abort_at < settled_at,
        f"s1's AbortRecorded at {abort_at} is not before its Settlement at {settled_at}",
    )
    abort_batch = next(b for _, o, b in batches(log) if o == abort_at)
    assert not any(isinstance(e, Settlement) for e in abort_batch.events), "an active abort settled in its own batch"
    assert isinstance(settlement, Settlement) and settlement.outcome is SettlementOutcome.ABORTED
    (rejected,) = [e for _, e in _events(log, CommandRejected, s3.submission_id)]
    assert isinstance(rejected, CommandRejected)
    assert rejected.reason is CommandRejectReason.ALREADY_TERMINAL
    assert rejected.winning_outcome is SettlementOutcome.COMPLETED
    for sid in (s1.submission_id, s2.submission_id, s3.submission_id):
        assert len(_events(log, Settlement, sid)) == 1, f"{sid} settled more than once"


RACE_ITERATIONS = 200
RACE_MAX_DELAY_MS = 50


def test_abort_raced_against_the_final_append(
    topics: Settings, tmp_path: Path, projection: tuple[ProjectionNames, LiveProjector]
) -> None:
    """Scenario 6: an abort against a run committing its final batch, 200 times in one worker's life.

    A barrier armed for one hit holds the submission at its end, in one of three modes (by iteration, in turn):

    * ``settle``: the worker loop waits at ``conductor.before_settle`` (the settlement is about to be staged); the
      abort is sent, then the barrier released: the abort is read after the settlement commits, so completed wins;
    * ``abort-first``: the run's own thread waits at ``echo.before_reply`` (its reply is ready, the worker has not
      seen it); the abort is sent, then the barrier released;
    * ``race``: the same barrier is released first and the abort sent after the delay, as the worker picks up the
      reply and commits the settlement: either may win.

    The delay between the two steps is swept from 0 to 50 ms. Each time: exactly one terminal outcome, and the
    abort's reply names the one that won (applied for aborted; rejected ``already_terminal`` naming the other).
    A live projector runs throughout: afterwards the projection matches the log (`check` clean) with one
    settlement row and one terminal attempt per submission, in the outcome that won, and the abort's receipt row.
    """
    s = topics
    control = _failpoints.FailpointControl(tmp_path / "fp")
    inbox = Inbox(s)
    receipts, settlements = Tail(s, "receipts"), Tail(s, "settlements")
    worker = spawn_worker(s, tmp_path, "race-worker", control=control, log_level="WARNING")
    seen: dict[str, tuple[str, int, str]] = {}  # submission -> (mode, delay_ms, winner)
    aborts: dict[str, str] = {}  # submission -> abort command id
    started = time.monotonic()
    try:
        for i in range(RACE_ITERATIONS):
            mode = ("settle", "abort-first", "race")[i % 3]
            point = "conductor.before_settle" if mode == "settle" else "echo.before_reply"
            delay_ms = round(RACE_MAX_DELAY_MS * i / (RACE_ITERATIONS - 1))
            sub = proposal(f"race-{i}", value={"i": i})
            cmd = abort_command(sub.conversation_id, sub.submission_id)
            control.arm(point, "1*pause(30s)")
            inbox.send(sub)
            try:
                control.wait_reached(point, 30)
            except TimeoutError:
                raise AssertionError(f"iteration {i}: {point} not reached\n{worker.tail()}") from None
            if mode == "race":
                assert control.release(point) == 1
                time.sleep(delay_ms / 1000)
                inbox.send(cmd)
            else:
                inbox.send(cmd)
                time.sleep(delay_ms / 1000)
                assert control.release(point) == 1
            control.disarm(point)
            receipts.wait(lambda c=cmd: bool(_receipts(receipts, c.command_id)), 30, f"iteration {i}'s abort reply")
            settlements.wait(lambda s=sub: bool(_settlements(settlements, s.submission_id)), 30, f"iteration {i}")
            (reply,) = _receipts(receipts, cmd.command_id)
            (settled,) = _settlements(settlements, sub.submission_id)
            winner = settled.outcome
            if reply.outcome is ReceiptOutcome.APPLIED:
                names_winner = winner is SettlementOutcome.ABORTED
            else:
                names_winner = (
                    reply.outcome is ReceiptOutcome.REJECTED
                    and (reply.reason or "").startswith(f"already_terminal: {winner.value} won")
                    and winner is not SettlementOutcome.ABORTED
                )
            promise(
                "DUR-012.abort-names-winner",
                names_winner,
                f"iteration {i} ({mode}, {delay_ms} ms): settled {winner.value}, abort reply {reply}",
            )
            if mode == "settle":
                assert winner is SettlementOutcome.COMPLETED, f"iteration {i}: the staged settlement lost: {settled}"
            seen[sub.submission_id] = (mode, delay_ms, winner.value)
            aborts[sub.submission_id] = cmd.command_id
        elapsed_s = time.monotonic() - started
        # Barrier: late, wrong writes for the raced submissions precede the barrier's settlement.
        barrier = pass_barrier(s, "race-barrier").proposal.submission_id
        receipts.catch_up(30), settlements.catch_up(30)
    finally:
        worker.kill_and_wait()
        for t in (receipts, settlements):
            t.close()

    log = Tail(s, "log")
    try:
        log.catch_up(60)
    finally:
        log.close()
    counts = Counter(
        r.submission_id
        for _, _, r in before_first(settlements.records, lambda r: r[2].submission_id == barrier)
        if isinstance(r, SettlementRecord)
    )
    promise(
        "DUR-012.race-one-outcome",
        counts == Counter(dict.fromkeys(seen, 1)),
        f"settlement records per submission: {[(k, n) for k, n in counts.items() if n != 1]}",
    )
    for sid, (mode, delay_ms, winner) in seen.items():
        settled_events = _events(log, Settlement, sid)
        promise(
            "DUR-012.race-one-outcome",
            len(settled_events) == 1,
            f"{sid} ({mode}, {delay_ms} ms) has {len(settled_events)} Settlement events",
        )
        ((settled_at, _),) = settled_events
        later = [type(e).__name__ for o, e in _all_events(log, sid) if o > settled_at]
        assert set(later) <= {"CommandRejected"}, f"{sid}: events after its settlement: {later}"
        rejected = [e for _, e in _events(log, CommandRejected, sid)]
        for e in rejected:
            assert isinstance(e, CommandRejected) and e.command_id == aborts[sid]
            assert e.winning_outcome is not None and e.winning_outcome.value == winner, (sid, e, winner)
    by_mode = Counter((mode, winner) for mode, _, winner in seen.values())
    print(f"{RACE_ITERATIONS} abort races in {elapsed_s:.1f} s: {dict(sorted(by_mode.items()))}")
    # Both sides of the race must have been exercised: the abort winning (applied) and the run winning (rejected).
    # The "race" mode's split depends on timing (the worker picks up a finished run at its next turn, after a poll
    # of up to poll_timeout_s), so only its sum with the deterministic modes is asserted.
    winners = {winner for _, _, winner in seen.values()}
    assert winners == {"aborted", "completed"}, f"only {winners} won: {dict(by_mode)}"

    # The projection part (issue 7): the live projector followed the races; it matches the log.
    names, live = projection
    wait_projected(s, names, 60, live)
    check_clean(s, names, "DUR-015.scenario-6")
    # The barrier submission is no part of the races.
    rows = {r["submission_id"]: r for r in projection_rows(s, names, "settlements") if r["submission_id"] != barrier}
    promise(
        "DUR-015.scenario-6",
        {sid: r["outcome"] for sid, r in rows.items()} == {sid: w for sid, (_, _, w) in seen.items()},
        "the projection's settlements differ from the log's outcomes: "
        f"{[(sid, rows.get(sid, {}).get('outcome'), w) for sid, (_, _, w) in seen.items() if sid in rows][:5]}",
    )
    terminal = Counter(
        (a["submission_id"], a["status"])
        for a in projection_rows(s, names, "attempts")
        if a["status"] in ("completed", "failed", "aborted") and a["submission_id"] != barrier
    )
    promise(
        "DUR-015.scenario-6",
        terminal == Counter({(sid, w): 1 for sid, (_, _, w) in seen.items()}),
        f"terminal attempt rows that are not one per submission in its outcome: "
        f"{[(k, n) for k, n in terminal.items() if n != 1 or seen[k[0]][2] != k[1]][:5]}",
    )
    states = {
        r["submission_id"]: r["state"]
        for r in projection_rows(s, names, "submissions")
        if r["submission_id"] != barrier
    }
    assert states == {sid: w for sid, (_, _, w) in seen.items()}, "a submission's state is not its outcome"
    replies = {r["request_id"]: r["outcome"] for r in projection_rows(s, names, "receipts")}
    for sid, (_, _, won) in seen.items():
        want = "applied" if won == "aborted" else "rejected"
        assert replies.get(aborts[sid]) == want, (sid, won, replies.get(aborts[sid]))
