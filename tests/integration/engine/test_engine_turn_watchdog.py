"""The worker's turn watchdog against the real broker, with real ``settled worker`` child processes.

docs/architecture.md "Known limit: a worker can stall across a broker restart": librdkafka's
``send_offsets_to_transaction`` can block past its timeout (librdkafka#5456). A worker whose checkpoint stalls must
end itself with exit code 75 (`WATCHDOG_EXIT_CODE`), naming the stalled phase and dumping its threads' stacks, so a
supervisor restarts it; the restarted worker fences the stuck transaction and the submission still settles once. A
healthy worker with the same short bound must keep running through admissions, runs, idle polls and checkpoints.

The stall: the failpoint ``appender.after_produce`` (inside the checkpoint's transaction, between the flush and
``send_offsets_to_transaction``, where the real stall happens) armed at run time with ``delay(60s)``.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from settled import _failpoints
from settled._settings import Settings
from settled.processors import WATCHDOG_EXIT_CODE
from settled.schemas import SettlementOutcome
from settled.testing import WorkerProcess
from tests.integration.engine._helpers import TIMEOUT_S, plan, send, settled, settlements
from tests.integration.engine.conftest import SpawnWorker
from tests.integration.helpers import proposal, wait_for

pytestmark = [pytest.mark.integration]

WATCHDOG_S = 3.0
STALL = "appender.after_produce"


@pytest.fixture
def short_watchdog(monkeypatch: pytest.MonkeyPatch) -> float:
    """Workers spawned by the test get a 3 s turn watchdog (``spawn_worker`` passes the environment on)."""
    monkeypatch.setenv("SETTLED_WORKER_TURN_WATCHDOG_S", str(WATCHDOG_S))
    return WATCHDOG_S


def _log(tmp_path: Path, name: str) -> str:
    return (tmp_path / f"{name}.log").read_text(errors="replace")


def _exit_code(proc: WorkerProcess, timeout_s: float, log: Path) -> int:
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the worker did not exit within {timeout_s} s:\n{log.read_text()[-3000:]}") from None


def test_a_worker_whose_checkpoint_stalls_exits_75_naming_the_phase_and_a_restarted_one_settles_the_submission(
    topics: Settings, spawn_worker: SpawnWorker, tmp_path: Path, short_watchdog: float
) -> None:
    s = topics
    control = _failpoints.FailpointControl(tmp_path / "fp")  # the control folder spawn_worker's children use
    a = spawn_worker("a")
    warmup = proposal("conv-w", value=plan())
    send(s, warmup)
    # The claim (its own, longer bound) and the warm-up's checkpoints passed under the 3 s watchdog.
    wait_for(lambda: settled(s, warmup.submission_id) is not None, TIMEOUT_S, "the warm-up submission to settle")
    assert a.poll() is None, _log(tmp_path, "a")

    control.arm(STALL, "1*delay(60s)")  # the next checkpoint's transaction blocks after its flush for 60 s
    stalled = proposal("conv-w", value=plan({"sleep_s": 0.1}))
    armed_at = time.monotonic()
    send(s, stalled)
    code = _exit_code(a, 45.0, tmp_path / "a.log")
    took_s = time.monotonic() - armed_at
    log = _log(tmp_path, "a")
    assert code == WATCHDOG_EXIT_CODE == 75, f"exit {code}:\n{log[-3000:]}"
    assert control.hits(STALL) >= 1 and any(r.actions == ("delay(60000ms)",) for r in control.hit_log()), (
        control.hit_log()
    )
    assert took_s < 30.0, f"the watchdog took {took_s:.1f} s to end a worker stalled past a {WATCHDOG_S} s bound"
    # The CRITICAL line names the stalled phase; the stack dump shows where the loop thread is stuck.
    critical = [line for line in log.splitlines() if '"level": "CRITICAL"' in line]
    assert len(critical) == 1, log[-3000:]
    assert '"phase": "checkpoint of partition 0"' in critical[0], critical[0]
    assert "checkpoint of partition 0 has not finished" in critical[0], critical[0]
    assert "Current thread 0x" in log and "in _transaction" in log and "in checkpoint" in log, log[-3000:]

    # A supervisor restarts the worker: its claim fences the stuck transaction, and the submission settles once.
    control.disarm(STALL)
    b = spawn_worker("b")
    wait_for(lambda: settled(s, stalled.submission_id) is not None, TIMEOUT_S, "the stalled submission to settle")
    result = settled(s, stalled.submission_id)
    assert result is not None and result.outcome is SettlementOutcome.COMPLETED, result
    counts = Counter(r.submission_id for r in settlements(s))
    assert counts == Counter({warmup.submission_id: 1, stalled.submission_id: 1}), counts
    assert b.poll() is None, _log(tmp_path, "b")


def test_a_healthy_worker_with_a_short_watchdog_keeps_running_through_admissions_runs_and_idle_polls(
    topics: Settings, spawn_worker: SpawnWorker, tmp_path: Path, short_watchdog: float
) -> None:
    s = topics
    a = spawn_worker("a")
    first = [proposal(f"conv-{i}", value=plan({"sleep_s": 0.2}, {"now": True})) for i in range(6)]
    send(s, *first)
    wait_for(lambda: all(settled(s, p.submission_id) for p in first), TIMEOUT_S, "the first submissions to settle")
    time.sleep(2.5 * short_watchdog)  # idle: only empty polls, each within its bound
    assert a.poll() is None, f"the worker exited {a.returncode} while idle:\n{_log(tmp_path, 'a')[-3000:]}"
    second = [proposal(f"conv-{i}", value=plan({"sleep_s": 0.5})) for i in range(6)]
    send(s, *second)
    wait_for(lambda: all(settled(s, p.submission_id) for p in second), TIMEOUT_S, "the second submissions to settle")
    assert a.poll() is None, f"the worker exited {a.returncode}:\n{_log(tmp_path, 'a')[-3000:]}"
    outcomes = {p.submission_id: getattr(settled(s, p.submission_id), "outcome", None) for p in [*first, *second]}
    assert set(outcomes.values()) == {SettlementOutcome.COMPLETED}, outcomes
    # A graceful stop (its release has the revoke grace on top of the bound) exits 0, not the watchdog's code.
    a.send_signal(signal.SIGTERM)
    code = _exit_code(a, 60.0, tmp_path / "a.log")
    log = _log(tmp_path, "a")
    assert code == 0, f"exit {code}:\n{log[-3000:]}"
    assert "CRITICAL" not in log, log[-3000:]
