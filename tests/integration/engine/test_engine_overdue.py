"""Overdue obligations (issue 22 item 5): the projection's ``obligations`` and ``overdue`` views and `settled doctor`.

A worker runs the engine app and a projector child projects its log. One run's tool call goes Unknown (its tool
server refuses connections), which holds its conversation's lane (a later submission waits behind it), and another
run waits for an approval. The ``obligations`` view lists the Unknown call, the pending approval and the unsettled
submissions with their ages; none is past the ``overdue`` view's thresholds yet; `settled doctor --only overdue`
passes with its default thresholds and fails, naming the kind, the count and the oldest item, with a threshold of 0 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from settled._settings import Settings
from settled.client import Client
from settled.projections import ProjectionNames, ProjectionReader
from tests.integration.engine._helpers import TIMEOUT_S, plan
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.engine.engine_app import flag, world
from tests.integration.helpers import fresh_projection, wait_for
from tests.integration.test_projections import spawn_projector

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def names(postgres_dsn: str) -> Iterator[ProjectionNames]:
    with fresh_projection(postgres_dsn) as n:
        yield n


def _doctor(s: Settings, names: ProjectionNames, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_")}
    env.update(
        s.timeouts_env(),
        SETTLED_NAMESPACE=s.namespace,
        SETTLED_KAFKA_BOOTSTRAP=s.kafka_bootstrap,
        SETTLED_POSTGRES_DSN=s.postgres_dsn,
    )
    argv = [sys.executable, "-m", "settled.services", "doctor", "--only", "overdue", "--schema", names.live, *args]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_open_obligations_are_listed_and_the_doctor_reports_the_overdue_ones(
    topics: Settings, spawn_worker: SpawnWorker, world_db: Path, tmp_path: Path, names: ProjectionNames
) -> None:
    s = topics
    with world(str(world_db)) as db:
        flag(db, "server_down", True)
    spawn_worker("w")
    projector = spawn_projector(s, names, tmp_path, "projector")
    reader = ProjectionReader(s.postgres_dsn, names)
    try:
        with Client(s, principal="ops", default_timeout_s=TIMEOUT_S) as client:
            stuck = client.submit("conv-unknown", plan({"tool": "remote_once"}))
            behind = client.submit("conv-unknown", plan())  # queued behind the Unknown
            asking = client.submit("conv-approval", plan({"approve": "refund", "description": "order o-1"}))

        def kinds() -> list[tuple[str, str]]:
            return sorted((str(r["kind"]), str(r["submission_id"])) for r in reader.obligations())

        expected = sorted(
            [
                ("unknown", stuck.request_id),
                ("approval", asking.request_id),
                ("submission", stuck.request_id),
                ("submission", behind.request_id),
                ("submission", asking.request_id),
            ]
        )
        wait_for(lambda: kinds() == expected, TIMEOUT_S, f"the obligations view to list {expected}")
        rows = reader.obligations()
        assert all(r["age"].total_seconds() >= 0 and r["since"] is not None for r in rows), rows
        with psycopg.connect(s.postgres_dsn) as conn:
            overdue = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(names.live, "overdue")))
            assert overdue.fetchone() == (0,)  # seconds old: within every default threshold

        fine = _doctor(s, names)
        assert fine.returncode == 0, fine.stdout + fine.stderr
        late = _doctor(s, names, "--overdue-unknown-s", "0")
        assert late.returncode == 1, late.stdout + late.stderr
        text = " ".join(late.stdout.split())
        assert "1 unknown obligation(s) older than 0 s" in text, text
        assert "failed checks: overdue" in late.stderr
        assert "approval obligation" not in text and "submission obligation" not in text, text
    finally:
        reader.close()
        projector.proc.terminate()
        projector.proc.wait(timeout=30)
