"""Signals and deadlines through real workers (issue 16 items 1, 3, 6): runs that wait durably.

A real ``settled worker`` child runs the engine test app; a plan op ``{"signal": name}`` is ``ctx.signal(name)``.
Kills happen at named failpoints: ``engine.after_wait_commit`` (the request is canonical, the attempt not ended),
``conductor.after_expiry_staged`` (the sweeper decided an expiry, not committed). Deadline tests move the workers'
clock with ``SETTLED_CLOCK_OFFSET_S`` instead of sleeping.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.client import Client, SignalRejectedError
from settled.protocol import is_retry_wait
from settled.schemas import (
    AttemptStarted,
    LogEvent,
    ReceiptOutcome,
    SendSignal,
    SignalReceived,
    WaitOutcome,
    WaitRequested,
    WaitResolved,
    canonical_json,
)
from tests._promise import promise
from tests.integration.engine._helpers import KILLED, TIMEOUT_S, events_of, invocations, plan, send
from tests.integration.engine._helpers import settled as settled_record
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration]


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


def _of(events: list[LogEvent], kind: type) -> list[LogEvent]:
    """The events of a kind; waits only the run's own (a death's retry backoff is the owner's wait, issue 22)."""
    return [e for e in events if isinstance(e, kind) and not _retry_wait(e)]


def _retry_wait(event: LogEvent) -> bool:
    return isinstance(event, (WaitRequested, WaitResolved)) and is_retry_wait(event.wait_id)


def _requested(s: Settings, sid: str) -> bool:
    return bool(_of(events_of(s, sid), WaitRequested))


def test_a_signal_sent_while_no_worker_runs_is_consumed_after_the_restart_once(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    w1 = spawn_worker("w1", failpoints="engine.after_wait_commit=1*kill")
    receipt = client.submit(
        "conv-g1", plan({"tool": "charge_idem", "args": {"n": 1}}, {"signal": "go"}, {"tool": "charge_other"})
    )
    assert w1.wait(TIMEOUT_S) == KILLED  # killed right after the wait request committed
    assert _requested(s, receipt.request_id)
    # No worker runs: the signal waits in the inbox.
    signal = SendSignal(
        command_id="sig-1",
        principal="ops",
        conversation_id="conv-g1",
        submission_id=receipt.request_id,
        name="go",
        payload_json=canonical_json({"cents": 250}),
        sent_at=datetime.now(UTC),
    )
    send(s, signal)
    spawn_worker("w2")
    settled = client.wait(receipt, TIMEOUT_S)
    assert settled.outcome.value == "completed", settled
    assert json.loads(settled.reply_json or "null")["results"][1] == {"signal": {"cents": 250}}
    assert invocations(world_db, "charge_idem") == 1  # ran before the wait; replayed after it
    assert invocations(world_db, "charge_other") == 1
    events = events_of(s, receipt.request_id)
    [resolved] = _of(events, WaitResolved)
    assert (resolved.outcome, resolved.source_id) == (WaitOutcome.DELIVERED, "sig-1")  # type: ignore[union-attr]
    assert len(_of(events, SignalReceived)) == 1
    # Three attempts: the killed one (charged), the one that waited (not charged), the one that completed.
    assert settled.attempt_count == len(_of(events, AttemptStarted))
    # The same signal again: a duplicate receipt; a new one for the settled run or for no run: rejected.
    again = client.signal("conv-g1", receipt.request_id, "go", {"cents": 250}, signal_id="sig-1")
    assert again.outcome is ReceiptOutcome.DUPLICATE
    with pytest.raises(SignalRejectedError) as late:
        client.signal("conv-g1", receipt.request_id, "go", 1)
    assert late.value.reason_code == "already_terminal"
    with pytest.raises(SignalRejectedError) as nobody:
        client.signal("conv-g1", "no-such-run", "go", 1)
    assert nobody.value.reason_code == "unknown_target"
    assert len(_of(events_of(s, receipt.request_id), SignalReceived)) == 2  # the duplicate's record, nothing else


def test_a_signal_delivered_before_the_run_reaches_its_wait_is_consumed_there(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    s = topics
    spawn_worker("w")
    receipt = client.submit("conv-g2", plan({"sleep_s": 1.5}, {"signal": "go"}))
    client.signal("conv-g2", receipt.request_id, "go", "early")
    settled = client.wait(receipt, TIMEOUT_S)
    assert json.loads(settled.reply_json or "null")["results"][1] == {"signal": "early"}
    kinds = [type(e) for e in events_of(s, receipt.request_id)]
    assert kinds.index(SignalReceived) < kinds.index(WaitRequested)


def test_a_deadline_fires_once_on_the_offset_clock_when_the_owner_dies_between_decision_and_commit(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    s = topics
    w1 = spawn_worker("w1")
    receipt = client.submit("conv-g3", plan({"signal": "go", "deadline_s": 3600}))
    wait_for(lambda: _requested(s, receipt.request_id), TIMEOUT_S, "the wait request")
    [request] = _of(events_of(s, receipt.request_id), WaitRequested)
    assert request.deadline is not None  # type: ignore[union-attr]
    assert w1.kill_and_wait() == KILLED
    # Two hours later (offset clock): the first owner dies after its sweeper staged the expiry, before the commit;
    # the second takes the partition over and fires it.
    later = {"SETTLED_CLOCK_OFFSET_S": "7200"}
    w2 = spawn_worker("w2", failpoints="conductor.after_expiry_staged=1*kill", env=later)
    assert w2.wait(TIMEOUT_S) == KILLED
    assert not _of(events_of(s, receipt.request_id), WaitResolved)  # nothing committed
    spawn_worker("w3", env=later)
    settled = client.wait(receipt, TIMEOUT_S)
    assert json.loads(settled.reply_json or "null")["results"] == [{"expired": "go"}]
    [expired] = _of(events_of(s, receipt.request_id), WaitResolved)
    assert expired.outcome is WaitOutcome.EXPIRED  # type: ignore[union-attr]
    assert expired.decided_at >= request.deadline  # type: ignore[union-attr,operator]


def test_each_signal_is_consumed_once_by_a_canonical_delivery(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    """A signal sent while its run is queued reaches the run's first wait through a canonical delivery, never two.

    Fault switch ``signal_honoured_before_canonical`` (the run takes a signal from its journal without a canonical
    request and delivery) makes both waits take the one signal.
    """
    s = topics
    spawn_worker("w")
    ahead = client.submit("conv-g4", plan({"sleep_s": 1.0}))
    run = client.submit("conv-g4", plan({"signal": "go"}, {"signal": "go"}))
    client.signal("conv-g4", run.request_id, "go", "early")  # accepted while the run is queued behind `ahead`
    client.wait(ahead, TIMEOUT_S)

    def second_wait_or_settled() -> bool:
        waits = _of(events_of(s, run.request_id), WaitRequested)
        return len(waits) == 2 or settled_record(s, run.request_id) is not None

    wait_for(second_wait_or_settled, TIMEOUT_S, "the run's second wait (or its settlement)")
    if settled_record(s, run.request_id) is None:
        client.signal("conv-g4", run.request_id, "go", "late")
    done = client.wait(run, TIMEOUT_S)
    results = json.loads(done.reply_json or "null")["results"]
    promise(
        "WAIT-001.delivery-canonical",
        results == [{"signal": "early"}, {"signal": "late"}],
        f"each wait takes its own signal through a canonical delivery; got {results}",
    )
    resolved = _of(events_of(s, run.request_id), WaitResolved)
    assert len(resolved) == 2 and all(r.source_id is not None for r in resolved)  # type: ignore[union-attr]


def test_five_waits_with_max_attempts_3_and_a_kill_after_the_fifth_delivery_complete(
    topics: Settings, spawn_worker: SpawnWorker, client: Client
) -> None:
    """Attempts that ended by waiting are not charged: 5 waits + 1 death stay within ``max_attempts=3``."""
    s = topics
    w1 = spawn_worker("w1", failpoints="engine.run_returned=1*kill")  # the attempt after the fifth delivery dies
    receipt = client.submit("conv-g5", plan(*({"signal": "go"} for _ in range(5))))
    for n in range(1, 6):
        client.signal("conv-g5", receipt.request_id, "go", n, signal_id=f"go-{n}")
    assert w1.wait(TIMEOUT_S) == KILLED
    spawn_worker("w2")
    done = client.wait(receipt, TIMEOUT_S)
    assert done.outcome.value == "completed", done
    assert json.loads(done.reply_json or "null")["results"] == [{"signal": n} for n in range(1, 6)]
    events = events_of(s, receipt.request_id)
    assert len(_of(events, WaitResolved)) == 5
    assert done.attempt_count == len(_of(events, AttemptStarted)) == 7  # 5 that waited, the killed one, the last
