"""Step workflows on the real broker with real ``settled worker`` processes (issue 17 item 1).

The seed's invoice workflow (`tests/integration/engine/workflow_app.py`) is killed inside each step, after that
step's checkpoint commits; a second worker resumes it at that step with ``previous``, ``last_checkpoint`` and
``get_state()`` right, and no step before it runs again. ``run_workflow`` with the same task id is the same run;
with another input it is a conflict naming the id. A step that fails twice then passes has two canonical
``StepRetryScheduled`` records and one result; exhausted retries settle the run failed once; a hung body hits
``step_timeout`` and its late return changes nothing (issue 17 item 3).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.client import Client, IdempotencyConflictError
from settled.schemas import (
    ReceiptOutcome,
    SettlementOutcome,
    SettlementRecord,
    StepRecorded,
    StepRetryScheduled,
    WaitRequested,
    WaitResolved,
    canonical_json,
)
from tests.integration.engine._helpers import TIMEOUT_S, events_of, killed, settled, settlements
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.workflow_app import RESULTS, runs
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = "tests.integration.engine.workflow_app:app"
STEPS = list(RESULTS)


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


@pytest.mark.parametrize("killed_in", STEPS)
def test_invoice_killed_in_a_step_resumes_there_with_previous_checkpoint_and_state(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, client: Client, killed_in: str
) -> None:
    s = topics
    task = f"inv-{killed_in}"
    a = spawn_worker("a", app=APP, failpoints=f"wftest.in_{killed_in}=1*kill")
    receipt = client.run_workflow("process-invoice", {"file": "inv.pdf"}, task_id=task)
    assert receipt.outcome is ReceiptOutcome.ADMITTED, receipt
    assert receipt.conversation_id == f"wf:process-invoice:{task}"
    killed(a, tmp_path / "a.log")
    spawn_worker("b", app=APP)
    wait_for(lambda: settled(s, receipt.request_id) is not None, TIMEOUT_S, "the workflow run to settle")
    result = settled(s, receipt.request_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json(RESULTS)

    done = runs(str(world_db), task)
    k = STEPS.index(killed_in)
    # Every step before the killed one ran once; the killed one twice; the ones after it once.
    assert [step for step, _ in done] == [*STEPS[: k + 1], *STEPS[k:]], done
    first, resumed = done[k], done[k + 1]
    before = {n: RESULTS[n] for n in STEPS[:k]}
    assert first[1] == {
        "previous": before,
        "last_checkpoint": None,
        "state": [killed_in, k + 1, len(STEPS), 1],
        "input": {"file": "inv.pdf"},
    }
    assert resumed[1] == {
        "previous": before,
        "last_checkpoint": {"at": killed_in},  # committed before the kill
        "state": [killed_in, k + 1, len(STEPS), 2],
        "input": {"file": "inv.pdf"},
    }
    recorded = [e.name for e in events_of(s, receipt.request_id) if isinstance(e, StepRecorded)]
    for n in STEPS:
        assert recorded.count(f"step:{n}") == 1, recorded  # one recorded result per step
    # The killed step's log line committed with its checkpoint in each attempt.
    assert recorded.count(f"log:{killed_in}") == 2, recorded
    assert [r.submission_id for r in settlements(s)] == [receipt.request_id]


def test_same_task_id_is_the_same_run_and_another_input_is_a_conflict_naming_it(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    spawn_worker("a", app=APP)
    first = client.run_workflow("process-invoice", {"file": "a.pdf"}, task_id="inv-42")
    again = client.run_workflow("process-invoice", {"file": "a.pdf"}, task_id="inv-42")
    assert first.outcome is ReceiptOutcome.ADMITTED, first
    assert again.outcome is ReceiptOutcome.DUPLICATE, again
    assert again.original_submission_id == first.request_id
    with pytest.raises(IdempotencyConflictError, match="'inv-42'") as conflict:
        client.run_workflow("process-invoice", {"file": "b.pdf"}, task_id="inv-42")
    assert conflict.value.field == "idempotency_key"
    wait_for(lambda: settled(s, first.request_id) is not None, TIMEOUT_S, "the run to settle")
    result = settled(s, first.request_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json(RESULTS)
    # One run: every step body ran once, and one settlement.
    assert [step for step, _ in runs(str(world_db), "inv-42")] == STEPS
    assert [r.submission_id for r in settlements(s)] == [first.request_id]


def _settle(s: Settings, client: Client, name: str, task: str) -> tuple[str, SettlementRecord | None]:
    receipt = client.run_workflow(name, None, task_id=task)
    wait_for(lambda: settled(s, receipt.request_id) is not None, TIMEOUT_S, f"the {name} run to settle")
    return receipt.request_id, settled(s, receipt.request_id)


def test_a_step_failing_twice_then_passing_has_two_canonical_retries_and_one_result(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    spawn_worker("a", app=APP)
    sid, result = _settle(s, client, "retries", "r-1")
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json({"flaky": {"flaky": "ok"}})
    # Three attempts within the app's max_attempts=2: a retry's wake-up is not charged, only a death is.
    assert result.attempt_count == 3, result
    assert [seen["retry"] for step, seen in runs(str(world_db), "r-1")] == [0, 1, 2]
    events = events_of(s, sid)
    retries = [e for e in events if isinstance(e, StepRetryScheduled)]
    assert [(r.step, r.retry, r.error_type) for r in retries] == [
        ("flaky", 1, "ValueError"),
        ("flaky", 2, "ValueError"),
    ]
    waits = {e.wait_id: e for e in events if isinstance(e, WaitRequested)}
    assert [waits[r.wait_id].deadline for r in retries] == [r.wake_at for r in retries]
    expired = [e for e in events if isinstance(e, WaitResolved)]
    assert [e.wait_id for e in expired] == [r.wait_id for r in retries]
    assert [e.name for e in events if isinstance(e, StepRecorded)] == ["workflow", "step:flaky"]  # plan, result


def test_exhausted_retries_settle_the_run_failed_once_with_the_last_error(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    spawn_worker("a", app=APP)
    sid, result = _settle(s, client, "exhausted", "x-1")
    assert result is not None and result.outcome is SettlementOutcome.FAILED, result
    assert result.error_type == "KeyError", result
    assert len(runs(str(world_db), "x-1")) == 2  # max_retries=1: two executions
    assert [r.retry for r in events_of(s, sid) if isinstance(r, StepRetryScheduled)] == [1]
    assert [r.submission_id for r in settlements(s)] == [sid]


def test_a_hung_step_hits_its_timeout_and_its_late_return_changes_nothing(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    spawn_worker("a", app=APP)
    sid, result = _settle(s, client, "timeouts", "h-1")
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert result.reply_json == canonical_json({"hung": "on time"})
    (retry,) = [e for e in events_of(s, sid) if isinstance(e, StepRetryScheduled)]
    assert retry.error_type == "StepTimeoutError", retry
    before = events_of(s, sid)
    Path(str(world_db) + ".release").touch()
    wait_for(lambda: any(step == "hung-late" for step, _ in runs(str(world_db), "h-1")), TIMEOUT_S, "the late body")
    (late,) = [seen for step, seen in runs(str(world_db), "h-1") if step == "hung-late"]
    assert "after its execution ended" in late["log"], late
    # Barrier: a later run on the same partition settles; nothing of the hung run was recorded before it.
    later, _ = _settle(s, client, "retries", "r-after")
    assert events_of(s, sid) == before
    assert [r.submission_id for r in settlements(s)] == [sid, later]


def test_a_worker_killed_after_a_retry_is_scheduled_resumes_it_on_another_worker(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, client: Client
) -> None:
    s = topics
    a = spawn_worker("a", app=APP, failpoints="engine.after_wait_commit=1*kill")  # retry 1 and its wait committed
    receipt = client.run_workflow("retries", None, task_id="r-kill")
    killed(a, tmp_path / "a.log")
    assert [seen["retry"] for _, seen in runs(str(world_db), "r-kill")] == [0]
    spawn_worker("b", app=APP)
    wait_for(lambda: settled(s, receipt.request_id) is not None, TIMEOUT_S, "the run to settle on worker b")
    result = settled(s, receipt.request_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    assert [seen["retry"] for _, seen in runs(str(world_db), "r-kill")] == [0, 1, 2]
    retries = [e.retry for e in events_of(s, receipt.request_id) if isinstance(e, StepRetryScheduled)]
    assert retries == [1, 2], retries
