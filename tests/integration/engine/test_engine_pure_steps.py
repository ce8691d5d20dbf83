"""Pure steps across a kill (issue 24 item 2): a posted ``StepRecorded`` whose commit is lost runs again, once.

A ``settled worker`` child runs `tests/integration/engine/engine_app.py` (``app_held_posts``: posted records wait for
the run's next awaited record) on the plan: three pure steps, then the idempotent tool ``charge_idem``. The step
bodies count their runs in the world database (they outlive the killed worker).

* Killed at ``engine.step_returned`` of the third pure step (its body returned, nothing of it handed over; the two
  before it posted, not committed): the next attempt runs each step whose record was lost once more, the log holds
  one ``StepRecorded`` per step (one per ordinal), the tool's effect happens once and the turn settles once.
* Killed at ``engine.after_step_commit`` (in the worker's thread, right after the transaction holding the three
  posted records and the tool's prepared record commits, before the tool starts): the next attempt replays the three
  recorded values without running a body, and retries the idempotent call.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from settled._settings import Settings
from settled.schemas import AttemptStarted, SettlementOutcome, StepRecorded
from tests._promise import promise
from tests.integration.engine._helpers import (
    TIMEOUT_S,
    count,
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

APP = "tests.integration.engine.engine_app:app_held_posts"
STEPS = ("p1", "p2", "p3")


def pure_plan() -> dict[str, object]:
    return plan(*({"step": name, "pure": True} for name in STEPS), {"tool": "charge_idem", "args": {"amount": 5}})


def runs(world_db: Path, submission_id: str, name: str) -> int:
    return count(world_db, "SELECT count(*) FROM step_runs WHERE submission = ? AND name = ?", submission_id, name)


def settle_after_kill(s: Settings, spawn_worker: SpawnWorker, tmp_path: Path, failpoints: str, conv: str) -> str:
    """Worker ``a`` runs the plan and dies at ``failpoints``; worker ``b`` settles it. Returns the submission id."""
    sub = proposal(conv, value=pure_plan())
    a = spawn_worker("a", app=APP, failpoints=failpoints)
    send(s, sub)
    killed(a, tmp_path / "a.log")
    spawn_worker("b", app=APP)
    wait_for(lambda: settled(s, sub.submission_id) is not None, TIMEOUT_S, "the settlement")
    return sub.submission_id


def check_one_record_per_step(s: Settings, submission_id: str) -> dict[str, StepRecorded]:
    events = events_of(s, submission_id)
    steps = [e for e in events if isinstance(e, StepRecorded)]
    per_ordinal = Counter(e.ordinal for e in steps)
    promise(
        "DUR-010.one-step-record",
        sorted(e.name for e in steps) == list(STEPS) and set(per_ordinal.values()) == {1},
        f"StepRecorded per ordinal: {dict(per_ordinal)}, names {[e.name for e in steps]}",
    )
    assert [r.submission_id for r in settlements(s)].count(submission_id) == 1, "the turn settled more than once"
    result = settled(s, submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    return {e.name: e for e in steps}


def test_a_posted_pure_step_whose_commit_is_lost_runs_again_at_most_once_and_is_recorded_once(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    submission_id = settle_after_kill(s, spawn_worker, tmp_path, "engine.step_returned=3*kill", "conv-pure-lost")
    recorded = check_one_record_per_step(s, submission_id)
    first = next(e for e in events_of(s, submission_id) if isinstance(e, AttemptStarted) and e.attempt == 1)
    for name in STEPS:
        # Once more per lost commit: a record attempt 1 committed is replayed, a lost one is run again by attempt 2.
        lost = recorded[name].attempt_id != first.attempt_id
        promise(
            "DUR-010.pure-step-once-more",
            runs(world_db, submission_id, name) == (2 if lost else 1),
            f"step {name} ran {runs(world_db, submission_id, name)} times, its record lost: {lost}",
        )
    # The kill came right after p3's body: its record never left the worker (deterministically lost).
    assert recorded["p3"].attempt_id != first.attempt_id
    assert effects(world_db, "charge_idem") == 1


def test_pure_steps_committed_before_a_kill_replay_without_running_again(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path
) -> None:
    s = topics
    submission_id = settle_after_kill(s, spawn_worker, tmp_path, "engine.after_step_commit=1*kill", "conv-pure-kept")
    recorded = check_one_record_per_step(s, submission_id)
    first = next(e for e in events_of(s, submission_id) if isinstance(e, AttemptStarted) and e.attempt == 1)
    assert {e.attempt_id for e in recorded.values()} == {first.attempt_id}, "the pure steps were not recorded by a1"
    assert [runs(world_db, submission_id, name) for name in STEPS] == [1, 1, 1], "a recorded pure step ran again"
    assert effects(world_db, "charge_idem") == 1
