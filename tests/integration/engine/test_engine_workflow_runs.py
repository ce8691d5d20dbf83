"""Incomplete workflow runs from the projection (issue 17 item 4): ``Client.incomplete_runs`` and ``settled runs list``.

Real workers run `tests/integration/engine/workflow_app.py` while a live projector fills a projection of its own: a
``pay-cli`` run waits for its step's approval, a ``paused`` run is paused at its second step, a ``process-invoice``
run completes. ``Client.incomplete_runs`` lists the two unsettled ones with their workflow, task id, the step they
are at of how many and what they wait for; read-your-writes with ``after=`` sees a run the moment its receipt is
projected. ``settled runs list --incomplete`` shows the same columns.
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
from settled.client import Client, IncompleteRun
from settled.projections import ProjectionNames
from settled.protocol import RESUME_SIGNAL
from settled.schemas import WaitRequested
from tests.integration.engine._helpers import TIMEOUT_S, events_of, settled
from tests.integration.engine.conftest import ROOT, SpawnWorker
from tests.integration.engine.workflow_app import runs
from tests.integration.helpers import check_clean, fresh_projection, projecting, wait_for, wait_projected

pytestmark = [pytest.mark.integration]

APP = "tests.integration.engine.workflow_app:app"


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    with fresh_projection(postgres_dsn) as n:
        yield n


@pytest.fixture
def client(topics: Settings, names: ProjectionNames) -> Iterator[Client]:
    with Client(topics, principal="ops", default_timeout_s=TIMEOUT_S, projection_schema=names.base) as c:
        yield c


def _cli(s: Settings, names: ProjectionNames, *args: str) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
    env.update(
        SETTLED_NAMESPACE=s.namespace,
        SETTLED_KAFKA_BOOTSTRAP=s.kafka_bootstrap,
        SETTLED_POSTGRES_DSN=s.postgres_dsn,
        SETTLED_PROJECTION_SCHEMA=names.live,
    )
    done = subprocess.run([sys.executable, "-m", "settled.services", *args, "--json"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def _waits(s: Settings, sid: str, name: str | None = None) -> bool:
    return any(isinstance(e, WaitRequested) and name in (None, e.name) for e in events_of(s, sid))


def _shown(run: IncompleteRun) -> tuple[object, ...]:
    return (run.workflow, run.task_id, run.current_step, run.total_steps, run.step_name, run.waits_for)


def test_incomplete_runs_show_workflow_task_step_of_total_and_what_they_wait_for(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, client: Client, names: ProjectionNames
) -> None:
    s = topics
    with projecting(s, names) as live:
        spawn_worker("a", app=APP)
        done = client.run_workflow("process-invoice", {"file": "a.pdf"}, task_id="inv-done")
        wait_for(lambda: settled(s, done.request_id) is not None, TIMEOUT_S, "the invoice run to settle")
        paused = client.run_workflow("paused", None, task_id="t-paused")
        # Read-your-writes: once its receipt is projected the run is listed, before it did anything.
        listed = {r.run_id: r for r in client.incomplete_runs(after=paused)}
        assert paused.request_id in listed and done.request_id not in listed, listed
        assert (listed[paused.request_id].workflow, listed[paused.request_id].task_id) == ("paused", "t-paused")
        wait_for(lambda: [step for step, _ in runs(str(world_db), "t-paused")] == ["first"], TIMEOUT_S, "first")
        client.pause_run(paused.conversation_id, paused.request_id, reason="audit")
        Path(f"{world_db}.go-t-paused").touch()
        gated = client.run_workflow("pay-cli", None, task_id="t-gated")
        wait_for(lambda: _waits(s, paused.request_id, RESUME_SIGNAL), TIMEOUT_S, "the pause")
        wait_for(lambda: _waits(s, gated.request_id), TIMEOUT_S, "the approval request")
        wait_projected(s, names, TIMEOUT_S, live)

        found = client.incomplete_runs()
        assert [r.run_id for r in found] == [paused.request_id, gated.request_id]  # oldest first
        assert [_shown(r) for r in found] == [
            ("paused", "t-paused", 2, 3, "second", "pause"),
            ("pay-cli", "t-gated", 2, 2, "send-money", "approval"),
        ]
        assert all(r.status == "waiting" and r.waiting_since is not None for r in found), found
        assert (found[0].waiting_name, found[1].waiting_name) == (RESUME_SIGNAL, "send-money")
        assert [r.run_id for r in client.incomplete_runs(workflow="pay-cli")] == [gated.request_id]

        rows = {r["submission_id"]: r for r in _cli(s, names, "runs", "list", "--incomplete")}
        assert set(rows) == {paused.request_id, gated.request_id}
        shown = {
            sid: (r["workflow"], r["task_id"], r["step_number"], r["total_steps"], r["step_name"], r["waits_for"])
            for sid, r in rows.items()
        }
        assert shown == {r.run_id: _shown(r) for r in found}
        check_clean(s, names, "DUR-015.rebuild")


def test_incomplete_runs_without_a_projection_dsn_is_an_error_naming_it(topics: Settings) -> None:
    with Client(topics.model_copy(update={"postgres_dsn": ""}), principal="ops") as c:
        with pytest.raises(ValueError, match="projection_dsn"):
            c.incomplete_runs()
