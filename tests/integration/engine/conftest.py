"""Fixtures of the engine tests: one-partition topics, the tool doubles' world database, child workers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from settled import _failpoints
from settled._settings import Settings
from tests.conftest import Provisioned
from tests.integration.engine.engine_app import WORLD_ENV

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def topics(provisioned: Provisioned) -> Settings:
    """The test's namespace with its topics provisioned, one partition (every conversation shares one owner)."""
    return provisioned(1)


@pytest.fixture
def world_db(tmp_path: Path) -> Path:
    """The tool doubles' world database (created by the first process that opens it)."""
    return tmp_path / "world.sqlite"


SpawnWorker = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def spawn_worker(topics: Settings, world_db: Path, tmp_path: Path) -> Iterator[SpawnWorker]:
    """Factory: ``spawn_worker("name", failpoints="engine.tool_returned=1*kill", app="...:app")`` starts a
    ``settled worker`` child on the test's namespace; every child still running is killed at teardown."""
    children: list[subprocess.Popen[bytes]] = []
    control = _failpoints.FailpointControl(tmp_path / "fp")

    def spawn(
        name: str, *, failpoints: str = "", app: str = "tests.integration.engine.engine_app:app"
    ) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SETTLED_FAILPOINT")}
        env.update(
            {
                "SETTLED_NAMESPACE": topics.namespace,
                "SETTLED_KAFKA_BOOTSTRAP": topics.kafka_bootstrap,
                WORLD_ENV: str(world_db),
            }
        )
        env.update(control.env(failpoints))
        log_path = tmp_path / f"{name}.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "settled.services", "worker", "--app", app, "--worker-id", name],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )
        children.append(proc)
        return proc

    yield spawn
    for proc in children:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
