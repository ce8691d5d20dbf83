"""An unhandled error in a ``settled worker`` process ends it with exit 1 at once, never a hang (issue 25 item 5).

The error: the failpoint ``appender.before_replacement`` armed with ``raise`` (a `FailpointError` out of the worker
loop) where a record too large for the log is replaced: the shared settlement record of five parallel 250 KB tool
results, posted by a run that then ended and waits for that commit (where the issue saw ``ValueError: no typed
failure replaces ['ToolCallSettled']``). Before the fix the process logged the
traceback and then waited forever at interpreter exit on the run's pool thread (its commit never comes), so no
supervisor restarted it and its partitions had no working owner.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from settled import _failpoints
from settled._settings import Settings
from settled.schemas import SettlementOutcome
from tests.integration.engine._helpers import TIMEOUT_S, plan, send, settled
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.helpers import proposal, wait_for

pytestmark = [pytest.mark.integration]

FAILPOINT = "appender.before_replacement"
APP = "tests.integration.engine.engine_app:app_lingering"

#: Bound on the exit after the error, in seconds: the loop drops its partitions and the process exits.
EXIT_BOUND_S = 10.0


def test_an_unhandled_error_in_the_worker_loop_exits_1_at_once_while_a_run_waits_for_its_commit(
    topics: Settings, spawn_worker: SpawnWorker, tmp_path: Path
) -> None:
    s = topics
    control = _failpoints.FailpointControl(tmp_path / "fp")  # the control folder spawn_worker's children use
    # The shared settlement record of five parallel 250 KB results is over the size limit: its replacement raises.
    worker = spawn_worker("a", failpoints=f"{FAILPOINT}=1*raise", app=APP)
    blobs = [{"tool": "blob", "args": {"bytes": 250_000, "i": i}} for i in range(5)]
    stuck = proposal("conv-exit", value=plan({"parallel": blobs}))
    send(s, stuck)
    wait_for(lambda: control.hits(FAILPOINT) >= 1, TIMEOUT_S, "the replacement to raise")
    raised_at = time.monotonic()
    try:
        code = worker.wait(EXIT_BOUND_S)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"the worker did not exit within {EXIT_BOUND_S} s of an unhandled error:\n"
            f"{(tmp_path / 'a.log').read_text()[-3000:]}"
        ) from None
    log = (tmp_path / "a.log").read_text()
    assert code == 1, f"exit {code} after {time.monotonic() - raised_at:.1f} s:\n{log[-3000:]}"
    assert "FailpointError" in log, log[-3000:]
    # A restarted worker settles the submission (the calls without a committed settlement run again).
    spawn_worker("b", app=APP)
    wait_for(lambda: settled(s, stuck.submission_id) is not None, TIMEOUT_S, "the submission to settle")
    assert settled(s, stuck.submission_id).outcome is SettlementOutcome.COMPLETED
