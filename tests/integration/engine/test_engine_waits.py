"""Waits through real workers: issue 16's acceptance tests and scenarios 1, 3, 9 and 16 (docs/semantics.md).

A real ``settled worker`` child runs the engine test app (``tests/integration/engine/engine_app.py``): a plan op
``{"signal": name, "deadline_s": s}`` is ``ctx.signal(name, deadline=...)``, ``{"approve": title}`` is
``ctx.approve(title)``. Kills and revocations happen at named failpoints:

* ``engine.after_wait_commit``: the wait request is canonical, the attempt not ended;
* ``conductor.after_delivery_commit``: a delivery (or expiry) is canonical, the resumed attempt not started;
* ``engine.after_prepared_commit`` of the resumed attempt: the resumed run's next record is canonical;
* ``engine.run_returned``: the run returned, its settlement not staged;
* ``conductor.after_expiry_staged`` / ``appender.after_produce`` / ``appender.before_commit``: the sweeper decided an
  expiry, its commit not done (one of them chosen by a logged seed).

Deadline tests move the workers' clock with ``SETTLED_CLOCK_OFFSET_S`` instead of sleeping past their deadline.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.client import Client, SignalRejectedError
from settled.protocol import arguments_digest, is_retry_wait
from settled.schemas import (
    ApprovalDecided,
    AttemptStarted,
    DecideApproval,
    LogEvent,
    Receipt,
    ReceiptOutcome,
    SendSignal,
    SignalReceived,
    ToolCallPrepared,
    ToolCallSettled,
    WaitKind,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
    canonical_json,
)
from settled.testing import WorkerProcess
from tests.integration.engine._helpers import (
    KILLED,
    TIMEOUT_S,
    effects,
    events_of,
    invocations,
    log_events,
    plan,
    receipt,
    send,
    settled,
)
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import APPROVER_KEY_ID, RESOLVER_PRIVATE_KEY
from tests.integration.helpers import CODEC, read_topic, wait_for

pytestmark = [pytest.mark.integration]

_log = logging.getLogger(__name__)

#: Where an owner can be revoked between the sweeper's decision of an expiry and the commit of its `WaitResolved`.
#: The app whose ``refund`` tool needs approval (issue 16 item 5).
TOOL_APPROVAL_APP = "tests.integration.engine.tool_approval_app:app"

EXPIRY_WINDOW_FAILPOINTS = ("conductor.after_expiry_staged", "appender.after_produce", "appender.before_commit")


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


def _of(events: list[LogEvent], kind: type) -> list[LogEvent]:
    """The events of a kind; waits only the run's own (a death's retry backoff is the owner's wait, issue 22)."""
    return [e for e in events if isinstance(e, kind) and not _retry_wait(e)]


def _retry_wait(event: LogEvent) -> bool:
    return isinstance(event, (WaitRequested, WaitResolved)) and is_retry_wait(event.wait_id)


def _requests(s: Settings, sid: str) -> list[WaitRequested]:
    return [e for e in events_of(s, sid) if isinstance(e, WaitRequested) and not _retry_wait(e)]


def _asked(s: Settings, sid: str, count: int) -> bool:
    return len(_requests(s, sid)) >= count


def _resolved(s: Settings, sid: str) -> list[WaitResolved]:
    return [e for e in events_of(s, sid) if isinstance(e, WaitResolved) and not _retry_wait(e)]


def _results(done: object) -> list[object]:
    return list(json.loads(getattr(done, "reply_json", None) or "null")["results"])


def _approval(request: WaitRequested, conversation_id: str, command_id: str) -> DecideApproval:
    """A signed approval of ``request`` (the engine app's approver key)."""
    unsigned = DecideApproval(
        command_id=command_id,
        principal="supervisor",
        conversation_id=conversation_id,
        submission_id=request.submission_id,
        approval_id=request.wait_id,
        args_digest=_digest_of(request),
        approved=True,
        reason="within policy",
        key_id=APPROVER_KEY_ID,
        signature=b"",
        requested_at=datetime.now(UTC),
    )
    return unsigned.model_copy(update={"signature": RESOLVER_PRIVATE_KEY.sign(unsigned.signing_bytes())})


def _digest_of(request: WaitRequested) -> str:
    """The argument digest an approval of ``request`` must name (a tool call's details carry its arguments)."""
    details = json.loads(request.details_json or "null")
    return str(details["args_digest"]) if "args_digest" in details else arguments_digest(details["args_json"])


def _signal(conversation_id: str, sid: str, name: str, payload: object, signal_id: str) -> SendSignal:
    return SendSignal(
        command_id=signal_id,
        principal="ops",
        conversation_id=conversation_id,
        submission_id=sid,
        name=name,
        payload_json=canonical_json(payload),
        sent_at=datetime.now(UTC),
    )


def _receipt_of(s: Settings, command_id: str) -> Receipt:
    wait_for(lambda: receipt(s, command_id) is not None, TIMEOUT_S, f"the receipt of {command_id}")
    found = receipt(s, command_id)
    assert found is not None
    return found


def _stopped(proc: WorkerProcess) -> bool:
    """Whether the child is stopped (SIGSTOP): state ``T`` in ``/proc/<pid>/stat``."""
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


# -- attempts that waited are not charged -----------------------------------------------------------------------------


def test_five_approvals_with_max_attempts_3_and_a_kill_after_the_fifth_approval_complete(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    """Five approvals (each ends an attempt by waiting) and one death stay within ``max_attempts=3``."""
    s = topics
    w1 = spawn_worker("w1", failpoints="engine.run_returned=1*kill")  # the attempt after the fifth approval dies
    sub = client.submit(
        "conv-w5",
        plan(*({"approve": f"step {n}", "then": {"tool": "charge_idem", "args": {"amount": n + 1}}} for n in range(5))),
    )
    for n in range(5):
        wait_for(functools.partial(_asked, s, sub.request_id, n + 1), TIMEOUT_S, f"approval request {n + 1}")
        request = _requests(s, sub.request_id)[n]
        assert request.kind is WaitKind.APPROVAL
        r = client.approve(
            "conv-w5",
            sub.request_id,
            request.wait_id,
            args_digest=json.loads(request.details_json or "null")["args_digest"],
            signing_key=RESOLVER_PRIVATE_KEY,
            key_id=APPROVER_KEY_ID,
            reason=f"ok {n}",
        )
        assert r.outcome is ReceiptOutcome.APPLIED
    assert w1.wait(TIMEOUT_S) == KILLED  # the run returned after the fifth approval; killed before its settlement
    assert settled(s, sub.request_id) is None
    spawn_worker("w2")
    done = client.wait(sub, TIMEOUT_S)
    assert done.outcome.value == "completed", done
    assert [r["reason"] for r in _results(done)] == [f"ok {n}" for n in range(5)]  # type: ignore[index]
    events = events_of(s, sub.request_id)
    assert len(_of(events, ApprovalDecided)) == len(_resolved(s, sub.request_id)) == 5
    # 5 attempts that waited (not charged), the killed one, the last: 7 attempts, 2 charged.
    assert done.attempt_count == len(_of(events, AttemptStarted)) == 7
    assert invocations(world_db, "charge_idem") == 5  # each call ran once; the last attempt replayed them all
    assert effects(world_db, "charge_idem") == 5


# -- a deadline fires exactly once with two workers ----------------------------------------------------------------


def test_a_deadline_fires_exactly_once_with_two_workers_when_the_owner_is_revoked_between_decision_and_commit(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    """The owner whose sweeper decided an expiry is stopped (SIGSTOP) at a seeded failpoint before the commit; the
    group revokes it and the other worker takes the partition over and fires the expiry; the stopped one, continued,
    is fenced and adds nothing."""
    s = topics
    seed = int(os.environ.get("SETTLED_CHAOS_SEED", time.time_ns() % 1_000_000))
    where = random.Random(seed).choice(EXPIRY_WINDOW_FAILPOINTS)
    print(f"seed {seed} (SETTLED_CHAOS_SEED={seed} replays it): the owner is revoked at {where}")
    _log.info("deadline revoke seed", extra={"seed": seed, "failpoint": where})
    w0 = spawn_worker("w0")
    sub = client.submit("conv-wd", plan({"signal": "go", "deadline_s": 3600}))
    wait_for(lambda: bool(_requests(s, sub.request_id)), TIMEOUT_S, "the wait request")
    [request] = _requests(s, sub.request_id)
    assert request.deadline is not None
    assert w0.stop() == 0  # graceful: the wait is canonical, nothing else is open
    control = w0.control
    assert control is not None
    control.arm("conductor.after_expiry_staged", "1*pause(60s)")
    later = {"SETTLED_CLOCK_OFFSET_S": "7200"}  # two hours on: past the deadline for both workers
    workers = [spawn_worker("w1", env=later), spawn_worker("w2", env=later)]
    hit = control.wait_reached("conductor.after_expiry_staged", TIMEOUT_S)
    control.disarm("conductor.after_expiry_staged")  # the successor's sweeper runs through
    [owner] = [w for w in workers if w.pid == hit.pid]
    [successor] = [w for w in workers if w is not owner]
    if where == "conductor.after_expiry_staged":
        owner.send_signal(signal.SIGSTOP)
        wait_for(lambda: _stopped(owner), TIMEOUT_S, "the owner stopped")
        control.release("conductor.after_expiry_staged")
    else:
        control.arm(where, "1*stop")
        control.release("conductor.after_expiry_staged")
        wait_for(lambda: _stopped(owner), TIMEOUT_S, "the owner stopped")
        control.disarm(where)  # the successor's commits run through (it owns nothing before the owner is revoked)
    assert not _resolved(s, sub.request_id)  # decided, not committed
    # The group revokes the stopped owner after its session timeout; the successor claims and fires the expiry.
    done = client.wait(sub, TIMEOUT_S)
    assert _results(done) == [{"expired": "go"}]
    owner.send_signal(signal.SIGCONT)  # the revoked owner resumes with its staged expiry: fenced, it adds nothing
    # Barrier: a later submission of the conversation settles after the revoked owner went on (either worker may
    # own the partition by then).
    wait_for(lambda: owner.poll() is not None or not _stopped(owner), TIMEOUT_S, "the revoked owner continued")
    barrier = client.submit("conv-wd", plan({"sleep_s": 0.01}))
    # Read from the topic's start: `Client.wait` seeks to the receipt's `decided_at`, which is on the workers' clock,
    # two hours ahead of the records' timestamps here.
    wait_for(lambda: settled(s, barrier.request_id) is not None, TIMEOUT_S, "the barrier's settlement")
    assert (found := settled(s, barrier.request_id)) is not None and found.outcome.value == "completed"
    resolved = _resolved(s, sub.request_id)
    assert [(r.wait_id, r.outcome) for r in resolved] == [(request.wait_id, WaitOutcome.EXPIRED)], resolved
    assert resolved[0].decided_at >= request.deadline
    assert successor.poll() is None


# -- scenarios ---------------------------------------------------------------------------------------------------------


def test_scenario_1_a_signal_racing_its_runs_settlement_is_appended_once_or_rejected_never_taken_by_the_next_run(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    """Scenario 1 (SIG) in our words: a signal names its run, so the run that follows in the lane never takes it.

    R1 is at its end (paused at ``conductor.before_settle``, B queued behind it, waiting for a signal of the same
    name); a signal to R1 sent in that window is either accepted (one ``SignalReceived``, for R1) or rejected with
    ``already_terminal`` (no record but the rejection): never acknowledged and then taken by B, never lost silently.
    """
    s = topics
    w = spawn_worker("w")
    control = w.control
    assert control is not None
    control.arm("conductor.before_settle", "1*pause(60s)")
    r1 = client.submit("conv-s1", plan({"sleep_s": 0.01}))
    b = client.submit("conv-s1", plan({"signal": "go"}))
    control.wait_reached("conductor.before_settle", TIMEOUT_S)  # R1 returned; its settlement not staged
    control.disarm("conductor.before_settle")
    send(s, _signal("conv-s1", r1.request_id, "go", "for R1", "s1-r1"))  # in the window
    control.release("conductor.before_settle")
    decided = _receipt_of(s, "s1-r1")
    outcome = "applied" if decided.outcome is ReceiptOutcome.APPLIED else (decided.reason or "").split(":")[0]
    assert client.wait(r1, TIMEOUT_S).outcome.value == "completed"
    wait_for(lambda: bool(_requests(s, b.request_id)), TIMEOUT_S, "B's wait request")
    received = [e for e in events_of(s, r1.request_id) if isinstance(e, SignalReceived)]
    if outcome == "applied":
        assert [e.command_id for e in received] == ["s1-r1"]
    else:
        assert outcome == "already_terminal" and not received
    # B waits for its own signal: R1's is not delivered to it. A signal to R1 now is definitely rejected.
    with pytest.raises(SignalRejectedError) as late:
        client.signal("conv-s1", r1.request_id, "go", "late")
    assert late.value.reason_code == "already_terminal"
    client.signal("conv-s1", b.request_id, "go", "for B", signal_id="s1-b")
    done = client.wait(b, TIMEOUT_S)
    assert _results(done) == [{"signal": "for B"}]
    [resolved] = _resolved(s, b.request_id)
    assert resolved.source_id == "s1-b"
    signals = [e for e in log_events(s) if isinstance(e, SignalReceived)]
    assert [(e.submission_id, e.command_id) for e in signals] == (
        [(r1.request_id, "s1-r1"), (b.request_id, "s1-b")] if outcome == "applied" else [(b.request_id, "s1-b")]
    )


def test_scenario_3_a_wait_deadline_survives_a_kill_at_t20_and_a_restart_at_t25_and_fires_once_at_its_instant(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    """Scenario 3 (DL), with the deadline on a wait: 30 s from the request, on the offset clock.

    The worker is killed right after the request committed (t=0); a second one owns the partition at t=20 and is
    killed there after its sweeper ran; a third starts at t=25. The expiry is one ``WaitResolved`` at the stored
    instant (t=30), neither earlier nor recomputed from a restart.
    """
    s = topics
    w1 = spawn_worker("w1", failpoints="engine.after_wait_commit=1*kill")
    sub = client.submit("conv-s3", plan({"signal": "go", "deadline_s": 30}))
    assert w1.wait(TIMEOUT_S) == KILLED
    [request] = _requests(s, sub.request_id)
    assert request.deadline is not None
    t0 = request.deadline - timedelta(seconds=30)

    def at(t_s: float) -> dict[str, str]:
        """The environment that starts a worker whose clock reads ``t0 + t_s`` now."""
        return {"SETTLED_CLOCK_OFFSET_S": f"{(t0 + timedelta(seconds=t_s) - datetime.now(UTC)).total_seconds():.3f}"}

    claims = sum(1 for e in log_events(s) if type(e).__name__ == "OwnershipClaimed")
    w2 = spawn_worker("w2", env=at(20))
    wait_for(
        lambda: sum(1 for e in log_events(s) if type(e).__name__ == "OwnershipClaimed") > claims,
        TIMEOUT_S,
        "w2's claim",
    )
    assert w2.control is not None
    w2.kill_at("worker.before_checkpoint")  # the next turn: its sweeper ran at least twice by then
    assert w2.wait(TIMEOUT_S) == KILLED
    w2.control.disarm("worker.before_checkpoint")  # the arming is shared by every worker of the test
    assert not _resolved(s, sub.request_id)  # t=20: nothing fired
    spawn_worker("w3", env=at(25))
    done = client.wait(sub, TIMEOUT_S)
    assert _results(done) == [{"expired": "go"}]
    [expired] = _resolved(s, sub.request_id)
    assert expired.outcome is WaitOutcome.EXPIRED
    late_s = (expired.decided_at - request.deadline).total_seconds()
    assert 0 <= late_s < 2.0, f"the expiry was decided {late_s:.3f} s after its stored instant"


def test_scenario_9_an_approval_sent_twice_across_a_restart_runs_the_tool_once_and_the_second_is_a_duplicate(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    """Scenario 9 (TOOL/SIG), with the kill after the delivery commits (``conductor.after_delivery_commit``).

    T is the ``refund`` tool of ``tests/integration/engine/tool_approval_app.py`` (``needs_approval=True``, not
    idempotent). The approval is decided and committed, the worker killed before the resumed attempt starts; the
    same approval is sent again while no worker runs; the next worker answers it as a duplicate and the run goes on:
    one ``ToolCallPrepared`` and one ``ToolCallSettled`` for T, one invocation, one result in the reply.
    """
    s = topics
    w1 = spawn_worker("w1", app=TOOL_APPROVAL_APP, failpoints="conductor.after_delivery_commit=1*kill")
    sub = client.submit("conv-s9", plan({"tool": "refund", "args": {"amount": 120}}))
    wait_for(lambda: bool(_requests(s, sub.request_id)), TIMEOUT_S, "the approval request")
    [request] = _requests(s, sub.request_id)
    assert request.kind is WaitKind.APPROVAL
    approval = _approval(request, "conv-s9", "s9-approve")
    send(s, approval)
    assert w1.wait(TIMEOUT_S) == KILLED  # the approval is canonical; the resumed attempt never started
    assert _receipt_of(s, "s9-approve").outcome is ReceiptOutcome.APPLIED
    assert len(_resolved(s, sub.request_id)) == 1
    assert not _of(events_of(s, sub.request_id), ToolCallPrepared)
    assert invocations(world_db, "refund") == 0
    send(s, approval)  # the same approval again, while no worker runs
    spawn_worker("w2", app=TOOL_APPROVAL_APP)
    done = client.wait(sub, TIMEOUT_S)
    assert done.outcome.value == "completed", done
    assert _results(done) == [{"refunded": 120}]
    wait_for(lambda: len(_receipts(s, "s9-approve")) == 2, TIMEOUT_S, "the second approval's receipt")
    assert [r.outcome for r in _receipts(s, "s9-approve")] == [ReceiptOutcome.APPLIED, ReceiptOutcome.DUPLICATE]
    events = events_of(s, sub.request_id)
    # The duplicate's record only marks its input decided; one decision of the wait.
    assert [e.command_id for e in _of(events, ApprovalDecided)] == ["s9-approve"] * 2  # type: ignore[attr-defined]
    assert len(_resolved(s, sub.request_id)) == 1
    prepared = [e for e in events if isinstance(e, ToolCallPrepared)]
    settlements = [e for e in events if isinstance(e, ToolCallSettled)]
    assert len(prepared) == 1 and [e.call_id for e in settlements] == [prepared[0].call_id]
    assert prepared[0].tool == "refund"
    assert invocations(world_db, "refund") == 1


def test_scenario_16_signals_sent_before_the_wait_and_while_no_worker_runs_are_each_consumed_once_without_expiry(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    """Scenario 16 (SIG): one signal is sent while the run is queued (before it reaches its wait), the other while
    every worker is down (killed right after the second wait request committed). Both are durably buffered and
    consumed at their waits, neither wait expires; signals for a settled or unknown run are rejected."""
    s = topics
    w1 = spawn_worker("w1", failpoints="engine.after_wait_commit=2*kill")
    ahead = client.submit("conv-s16", plan({"sleep_s": 1.0}))
    run = client.submit("conv-s16", plan({"signal": "a", "deadline_s": 600}, {"signal": "b", "deadline_s": 600}))
    first = client.signal("conv-s16", run.request_id, "a", "A", signal_id="s16-a")  # the run is queued behind `ahead`
    assert first.outcome is ReceiptOutcome.APPLIED
    assert not _requests(s, run.request_id)
    assert client.wait(ahead, TIMEOUT_S).outcome.value == "completed"
    assert w1.wait(TIMEOUT_S) == KILLED  # wait b's request committed
    assert [r.name for r in _requests(s, run.request_id)] == ["a", "b"]
    send(s, _signal("conv-s16", run.request_id, "b", "B", "s16-b"))
    spawn_worker("w2")
    done = client.wait(run, TIMEOUT_S)
    assert _results(done) == [{"signal": "A"}, {"signal": "B"}]
    resolved = _resolved(s, run.request_id)
    assert [(r.outcome, r.source_id) for r in resolved] == [
        (WaitOutcome.DELIVERED, "s16-a"),
        (WaitOutcome.DELIVERED, "s16-b"),
    ]
    kinds = [type(e) for e in events_of(s, run.request_id)]
    assert kinds.index(SignalReceived) < kinds.index(WaitRequested)  # the first came before its wait
    for run_id, reason in ((run.request_id, "already_terminal"), ("no-such-run", "unknown_target")):
        with pytest.raises(SignalRejectedError) as rejected:
            client.signal("conv-s16", run_id, "a", "late")
        assert rejected.value.reason_code == reason
    assert len(_of(events_of(s, run.request_id), SignalReceived)) == 2


# -- kills at the new boundaries -----------------------------------------------------------------------------------


def test_a_kill_after_the_resumed_runs_next_record_commits_resumes_after_it_without_a_second_delivery(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    """The resumed attempt is killed right after its first record (the next call's ``ToolCallPrepared``)
    committed: the next attempt replays the delivered signal from the log (no new request, no second delivery),
    runs the idempotent call under its key once more (one effect) and completes."""
    s = topics
    w1 = spawn_worker("w1", failpoints="engine.after_prepared_commit=1*kill")
    sub = client.submit(
        "conv-wr",
        plan(
            {"signal": "go"},
            {"tool": "charge_idem", "args": {"amount": 1}},
            {"tool": "charge_other", "args": {"amount": 2}},
        ),
    )
    wait_for(lambda: bool(_requests(s, sub.request_id)), TIMEOUT_S, "the wait request")
    assert client.signal("conv-wr", sub.request_id, "go", 7, signal_id="wr-go").outcome is ReceiptOutcome.APPLIED
    assert w1.wait(TIMEOUT_S) == KILLED
    events = events_of(s, sub.request_id)
    assert [type(e) for e in events if isinstance(e, (ToolCallPrepared, ToolCallSettled))] == [ToolCallPrepared]
    spawn_worker("w2")
    done = client.wait(sub, TIMEOUT_S)
    assert done.outcome.value == "completed", done
    results = _results(done)
    assert results[0] == {"signal": 7} and len(results) == 3
    events = events_of(s, sub.request_id)
    assert len(_requests(s, sub.request_id)) == len(_resolved(s, sub.request_id)) == 1
    assert len(_of(events, SignalReceived)) == 1
    assert effects(world_db, "charge_idem") == 1
    assert invocations(world_db, "charge_other") == 1
    # The attempt that waited (not charged), the killed one, the last.
    assert done.attempt_count == len(_of(events, AttemptStarted)) == 3


def _receipts(s: Settings, command_id: str) -> list[Receipt]:
    out = []
    for r in read_topic(s, "receipts"):
        assert r.value is not None
        rec = CODEC.decode(r.value)
        if isinstance(rec, Receipt) and rec.request_id == command_id:
            out.append(rec)
    return out
