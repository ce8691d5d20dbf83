"""The digest pin of flow runs on the real broker with ``settled worker`` processes (issue 18 item 3).

A run of `tests/integration/engine/flow_app.py`'s ``refund`` flow parks at its collect. Redeployed with only its
description changed, and again unchanged, its next turns resume. Redeployed changed (``issue_refund``'s version
raised), its next turn settles failed with ``FlowDriftError`` naming both digests and runs no node. ``settled flows
abandon`` ends one such run (the same command id again is a duplicate; a later turn fails ``flow_run_ended``);
``settled flows restart`` ends another and opens a new run of the deployed flow with the same opening input, which
the next turn completes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from settled._settings import Settings
from settled.client import Client
from settled.schemas import ReceiptOutcome, SettlementOutcome, SettlementRecord, StepRecorded, ToolCallPrepared
from settled.testing import WorkerProcess
from tests.integration.engine._helpers import TIMEOUT_S, effects, events_of, settled
from tests.integration.engine.conftest import ROOT, SpawnWorker
from tests.integration.engine.flow_app import flows
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration]

APP = "tests.integration.engine.flow_app:app"


@pytest.fixture
def client(topics: Settings) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S) as c:
        yield c


def _settlement(s: Settings, submission_id: str) -> SettlementRecord:
    wait_for(lambda: settled(s, submission_id) is not None, TIMEOUT_S, f"turn {submission_id} to settle")
    result = settled(s, submission_id)
    assert result is not None
    return result


def _reply(s: Settings, submission_id: str) -> Any:
    result = _settlement(s, submission_id)
    assert result.outcome is SettlementOutcome.COMPLETED and result.reply_json is not None, result
    return json.loads(result.reply_json)


def _cli(s: Settings, *args: str) -> list[dict[str, Any]]:
    env = {**os.environ, "SETTLED_NAMESPACE": s.namespace, "SETTLED_KAFKA_BOOTSTRAP": s.kafka_bootstrap}
    done = subprocess.run(
        [sys.executable, "-m", "settled.services", *args], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _redeploy(spawn_worker: SpawnWorker, worker: WorkerProcess, name: str, variant: str) -> WorkerProcess:
    assert worker.stop() == 0
    return spawn_worker(name, app=APP, env={"FLOW_VARIANT": variant})


def test_a_changed_flow_fails_the_parked_runs_turn_until_abandoned_or_restarted_and_same_digests_resume(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client
) -> None:
    s = topics
    old, changed = flows("")[0].digest, flows("changed")[0].digest
    assert flows("described")[0].digest == old and changed != old
    worker = spawn_worker("a", app=APP)
    runs = {}
    for conv in ("drift-abandon", "drift-restart"):
        first = client.submit(conv, "hello", kind="flow", flow_name="refund")
        assert _reply(s, first.request_id)["status"] == "waiting"
        runs[conv] = (first.run_id, first.request_id)
    run_a, _ = runs["drift-abandon"]
    assert run_a is not None

    for name, variant in (("described", "described"), ("unchanged", "")):
        worker = _redeploy(spawn_worker, worker, name, variant)
        turn = client.submit("drift-abandon", "still thinking", run_id=run_a)
        resumed = _reply(s, turn.request_id)
        assert (resumed["status"], resumed["node"], resumed["run_id"]) == ("waiting", "collect_amount", run_a), name

    worker = _redeploy(spawn_worker, worker, "changed", "changed")
    for conv, (run_id, _) in runs.items():
        assert run_id is not None
        refused = client.submit(conv, {"amount": 9}, run_id=run_id)
        result = _settlement(s, refused.request_id)
        assert (result.outcome, result.error_type) == (SettlementOutcome.FAILED, "FlowDriftError"), result
        assert result.error_reason is not None and old in result.error_reason and changed in result.error_reason
        assert "restart or abandon" in result.error_reason
        ran = [e for e in events_of(s, refused.request_id) if isinstance(e, StepRecorded | ToolCallPrepared)]
        assert ran == [], "no node ran"
    assert effects(world_db, "charge_idem") == 0

    # abandon: ends the run once; the same command id again is a duplicate; a later turn fails flow_run_ended.
    lines = _cli(s, "flows", "abandon", run_a, "--conversation", "drift-abandon", "--command-id", "abandon-1")
    assert lines[0]["outcome"] == "admitted" and json.loads(lines[1]["reply_json"])["status"] == "abandoned"
    again = _cli(s, "flows", "abandon", run_a, "--conversation", "drift-abandon", "--command-id", "abandon-1")
    assert again[0]["outcome"] == "duplicate" and again[0]["original_submission_id"] == lines[0]["request_id"]
    late = client.submit("drift-abandon", {"amount": 9}, run_id=run_a)
    ended = _settlement(s, late.request_id)
    assert (ended.outcome, ended.error_type) == (SettlementOutcome.FAILED, "flow_run_ended"), ended

    # restart: ends the run and opens a new one of the deployed flow with the opening input; a repeat is a duplicate.
    run_b, _ = runs["drift-restart"]
    assert run_b is not None
    restart = client.restart_flow_run("drift-restart", run_b, command_id="restart-1")
    duplicate = client.restart_flow_run("drift-restart", run_b, command_id="restart-1")
    assert restart.outcome is ReceiptOutcome.ADMITTED and duplicate.outcome is ReceiptOutcome.DUPLICATE
    new_run = restart.run_id
    assert new_run is not None and new_run != run_b and duplicate.run_id == new_run
    opened = _reply(s, restart.request_id)
    assert (opened["run_id"], opened["restarted_from"], opened["status"]) == (new_run, run_b, "waiting")
    done = _reply(s, client.submit("drift-restart", {"amount": 9}, run_id=new_run).request_id)
    assert (done["run_id"], done["status"], done["outcome"]) == (new_run, "completed", "refunded")
    assert effects(world_db, "charge_idem") == 1, "the restarted run refunded once"
    stale = client.submit("drift-restart", {"amount": 9}, run_id=run_b)
    assert _settlement(s, stale.request_id).error_type == "flow_run_ended"
