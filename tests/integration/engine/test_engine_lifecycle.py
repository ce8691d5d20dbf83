"""``durable.*`` lifecycle events through real workers killed at named failpoints (issue 17 item 5).

A subscriber (`settled.client.Client.lifecycle_events`, read_committed) runs from before the run is submitted until
it reads the run's terminal event: produced in the transaction of the ``Settlement``, it is the barrier that every
earlier event of the run (same partition, log order) was read. What it read must be exactly what
`settled.protocol.lifecycle_events` derives from the run's canonical batches in the log: each event once per
occurrence (one ``durable.started`` per attempt), in log order, nothing from an aborted transaction and nothing lost
to a kill right after a commit (fault switch ``lifecycle_outside_transaction``).

The kills are at named failpoints; which hit of ``appender.after_commit`` kills the workflow's second worker comes from
a seed printed at the start (``SETTLED_LIFECYCLE_SEED`` replays it).
"""

from __future__ import annotations

import json
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from settled._failpoints import FailpointControl
from settled._settings import Settings
from settled.client import Client
from settled.protocol import lifecycle_events
from settled.schemas import (
    AttemptStarted,
    LifecycleEvent,
    SettlementOutcome,
    SubmissionRetryScheduled,
    WaitKind,
    WaitRequested,
)
from tests._promise import promise
from tests.integration.engine._helpers import TIMEOUT_S, events_of, killed, plan, send, settled
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.test_engine_approvals import REFUND, _decision
from tests.integration.helpers import CODEC, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

WORKFLOW_APP = "tests.integration.engine.lifecycle_app:app"
TERMINAL = frozenset({"durable.completed", "durable.failed"})
SEED = int(os.environ.get("SETTLED_LIFECYCLE_SEED") or random.SystemRandom().randrange(1_000_000))


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


class Subscriber:
    """A ``durable.*`` subscriber in a thread, positioned before the run exists; stops at the run's terminal event."""

    def __init__(self, client: Client) -> None:
        self.seen: list[LifecycleEvent] = []
        self.submission_id: str | None = None
        self._stream = client.lifecycle_events("durable.*", idle_timeout_s=TIMEOUT_S)  # positioned now
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with self._stream:
            for event in self._stream:
                self.seen.append(event)
                if event.type in TERMINAL and event.submission_id == self.submission_id:
                    break
        self._done.set()

    def until_terminal(self) -> list[LifecycleEvent]:
        """Wait for the run's terminal event (the barrier) and return what the subscriber read for the run."""
        assert self._done.wait(TIMEOUT_S), f"no terminal lifecycle event read; seen: {[e.type for e in self.seen]}"
        return [e for e in self.seen if e.submission_id == self.submission_id]


def derived(s: Settings, submission_id: str) -> list[LifecycleEvent]:
    """The run's lifecycle events as the pure mapping derives them from its canonical batches in the log."""
    out: list[LifecycleEvent] = []
    for r in read_topic(s, "log"):
        assert r.value is not None
        out += [e for e in lifecycle_events(CODEC.decode_batch(r.value, offset=r.offset).batch)
                if e.submission_id == submission_id]  # fmt: skip
    return out


def check_exactly_once_in_order(s: Settings, sid: str, seen: list[LifecycleEvent]) -> list[str]:
    """Assert the subscriber read each derived event once, in log order; return the types read."""
    expected = derived(s, sid)
    ids = [e.event_id for e in seen]
    promise(
        "DUR-007.lifecycle-in-transaction",
        seen == expected,
        f"the subscriber read {[(e.type, e.event_id) for e in seen]}, the log explains "
        f"{[(e.type, e.event_id) for e in expected]}",
    )
    assert len(set(ids)) == len(ids), ids
    attempts = [e for e in events_of(s, sid) if isinstance(e, AttemptStarted)]
    started = [json.loads(e.data_json)["attempt"] for e in seen if e.type == "durable.started"]
    assert started == [a.attempt for a in attempts], (started, attempts)  # one durable.started per attempt
    return [e.type for e in seen]


def test_a_workflow_with_retries_across_two_kills_publishes_each_event_once_in_order(
    topics: Settings, spawn_worker: SpawnWorker, tmp_path: Path, client: Client
) -> None:
    s = topics
    rng = random.Random(SEED)
    second = f"appender.after_commit={rng.randint(2, 3)}*kill"  # after its claim: a commit of the run
    print(f"SETTLED_LIFECYCLE_SEED={SEED}: worker b killed at {second}")
    sub = Subscriber(client)
    a = spawn_worker("a", app=WORKFLOW_APP, failpoints="engine.after_wait_commit=1*kill")  # retry 1 is canonical
    receipt = client.run_workflow("retries", None, task_id="life-1")
    sub.submission_id = receipt.request_id
    killed(a, tmp_path / "a.log")
    b = spawn_worker("b", app=WORKFLOW_APP, failpoints=second)
    killed(b, tmp_path / "b.log")
    spawn_worker("c", app=WORKFLOW_APP)
    wait_for(lambda: settled(s, receipt.request_id) is not None, TIMEOUT_S, "the workflow run to settle")
    result = settled(s, receipt.request_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result

    seen = sub.until_terminal()
    types = check_exactly_once_in_order(s, receipt.request_id, seen)
    # durable.retry of the step (named) twice; of the run itself (step null) once per charged death retried within its
    # budget (issue 22 item 4): b's kill is charged or not depending on the commit it lands after (the seed).
    retried = [json.loads(e.data_json)["step"] for e in seen if e.type == "durable.retry"]
    deaths = [e for e in events_of(s, receipt.request_id) if isinstance(e, SubmissionRetryScheduled)]
    assert [step for step in retried if step is not None] == ["flaky", "flaky"], retried
    assert retried.count(None) == len(deaths), (retried, deaths)
    assert types.count("durable.step_completed") == 1, types
    assert types[-1] == "durable.completed" and types.count("durable.completed") == 1, types
    assert types[0] == "durable.started", types


def test_an_agent_run_with_an_approval_across_two_kills_publishes_each_event_once_in_order(
    topics: Settings, spawn_worker: SpawnWorker, tmp_path: Path, client: Client
) -> None:
    s = topics
    sub = Subscriber(client)
    w1 = spawn_worker("w1", failpoints="engine.after_wait_commit=1*kill")  # the approval request is canonical
    receipt = client.submit("conv-life", plan(REFUND))
    sid = sub.submission_id = receipt.request_id
    killed(w1, tmp_path / "w1.log")
    (request,) = [e for e in events_of(s, sid) if isinstance(e, WaitRequested) and e.kind is WaitKind.APPROVAL]
    send(s, _decision(request, "conv-life", command_id="life-ok"))
    w2 = spawn_worker("w2", failpoints="engine.after_settled_commit=1*kill")  # the approved tool's result committed
    killed(w2, tmp_path / "w2.log")
    spawn_worker("w3")
    result = client.wait(receipt, TIMEOUT_S)
    assert result.outcome is SettlementOutcome.COMPLETED, result

    types = check_exactly_once_in_order(s, sid, sub.until_terminal())
    assert types.count("durable.approval_needed") == 1, types
    assert types.count("durable.approval_granted") == 1, types
    assert types.index("durable.approval_needed") < types.index("durable.approval_granted"), types
    assert types[-1] == "durable.completed" and types.count("durable.completed") == 1, types
    assert types.count("durable.started") >= 2, types  # killed twice: at least one resumed attempt
    # Each charged death retried within the budget is announced (issue 22 item 4): one durable.retry per record.
    retries = [e for e in events_of(s, sid) if isinstance(e, SubmissionRetryScheduled)]
    assert len(retries) == 1, retries  # w2's death (attempt 2); w1 died waiting for the approval: not charged
    assert types.count("durable.retry") == len(retries), (types, retries)


def test_a_kill_right_after_a_commit_loses_no_lifecycle_event(
    topics: Settings, spawn_worker: SpawnWorker, tmp_path: Path, world_db: Path, client: Client
) -> None:
    s = topics
    entered, gate = Path(f"{world_db}.entered"), Path(f"{world_db}.gate")
    sub = Subscriber(client)
    a = spawn_worker("a", app=WORKFLOW_APP)
    receipt = client.run_workflow("gated", None, task_id="life-kill")
    sub.submission_id = receipt.request_id
    wait_for(entered.exists, TIMEOUT_S, "the gated step to run")
    # Its attempt's start is committed and its step waits: the next commit of worker a holds the step's result
    # (durable.step_completed), and a kill follows it before the appender returns. With the events in that
    # transaction nothing is lost; published after it, they are.
    control = FailpointControl(tmp_path / "fp")
    control.arm("appender.after_commit", "1*kill")
    gate.touch()
    killed(a, tmp_path / "a.log")
    control.disarm("appender.after_commit")
    spawn_worker("b", app=WORKFLOW_APP)
    wait_for(lambda: settled(s, receipt.request_id) is not None, TIMEOUT_S, "the workflow run to settle")
    types = check_exactly_once_in_order(s, receipt.request_id, sub.until_terminal())
    assert types[0] == "durable.started" and types[-1] == "durable.completed", types
    assert types.count("durable.step_completed") == 1, types
