"""The lifecycle tests' app (issue 17 item 5): workflow_app's ``retries`` workflow with room for two worker deaths,
and ``gated``, whose one step waits for the test's gate file so the test knows which commit comes next."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from settled.runtime import App, Step, StepContext, Workflow
from tests.integration.engine.engine_app import WORLD_ENV
from tests.integration.engine.workflow_app import retries


def gate_files() -> tuple[Path, Path]:
    """``(entered, gate)``: the body creates the first when it runs, and returns once the test creates the second."""
    world = os.environ[WORLD_ENV]
    return Path(world + ".entered"), Path(world + ".gate")


def _gate(ctx: StepContext) -> Any:
    entered, gate = gate_files()
    entered.touch()
    while not gate.exists():  # the test's barrier
        time.sleep(0.05)
    return {"gate": "open"}


gated = Workflow("gated", steps=[Step("gate", _gate)])

#: Three attempts: the lifecycle test kills two workers while the run is unsettled (a death is charged).
app = App(agent=None, max_attempts=3)
app.workflow(retries)
app.workflow(gated)
