"""Fixtures of the engine tests: the tool doubles' world database, child workers (``topics`` is tests/conftest.py's:
one partition unless a module marks ``partitions``, so every conversation shares one owner)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from settled import _failpoints
from settled._settings import Settings
from settled.testing import WorkerProcess
from tests.harness.workers import ROOT, start_worker  # noqa: F401 - ROOT: test_engine_projections imports it here
from tests.integration.engine.engine_app import WORLD_ENV


@pytest.fixture
def world_db(tmp_path: Path) -> Path:
    """The tool doubles' world database (created by the first process that opens it)."""
    return tmp_path / "world.sqlite"


SpawnWorker = Callable[..., WorkerProcess]


@pytest.fixture
def spawn_worker(topics: Settings, world_db: Path, tmp_path: Path) -> Iterator[SpawnWorker]:
    """Factory: ``spawn_worker("name", failpoints="engine.tool_returned=1*kill", app="...:app")`` starts a
    ``settled worker`` child (`WorkerProcess`) on the test's namespace; every child still running is killed at
    teardown."""
    children: list[WorkerProcess] = []
    control = _failpoints.FailpointControl(tmp_path / "fp")

    def spawn(
        name: str,
        *,
        failpoints: str = "",
        app: str = "tests.integration.engine.engine_app:app",
        env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        proc = start_worker(
            topics,
            tmp_path / f"{name}.log",
            name=name,
            app=app,
            control=control,
            failpoints=failpoints,
            env={WORLD_ENV: str(world_db), **(env or {})},
            append_log=False,
        )
        children.append(proc)
        return proc

    yield spawn
    for proc in children:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
