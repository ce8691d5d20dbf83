"""The worker's turn watchdog without Kafka: phase stamps, deadlines, bounds, the thread and the exit path.

docs/architecture.md "Known limit: a worker can stall across a broker restart" (librdkafka#5456): a phase of a turn
running past its bound ends the process with `WATCHDOG_EXIT_CODE`, naming the phase and dumping every thread's stack.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from settled._settings import Settings
from settled.processors import WATCHDOG_EXIT_CODE, WorkerConfig, default_turn_watchdog_s
from settled.processors._watchdog import Phase, PhaseStamp, StallMeter, TurnWatchdog, turn_watchdog_s

ROOT = Path(__file__).resolve().parents[3]


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def test_a_phase_is_stamped_for_its_block_only() -> None:
    clock = FakeClock()
    stamp = PhaseStamp(clock=clock)
    assert stamp.current is None
    with stamp.phase("checkpoint of partition 3", 5.0):
        assert stamp.current == Phase("checkpoint of partition 3", 100.0, 5.0)
        clock.now_s = 200.0
    assert stamp.current is None


def _ticks(meter: StallMeter, stamp: PhaseStamp, clock: FakeClock, until_s: float) -> tuple[Phase, float] | None:
    """Check every 0.5 s up to ``until_s``; return the first firing."""
    while clock.now_s < until_s:
        clock.now_s += 0.5
        fired = meter.check(stamp.current, clock.now_s)
        if fired is not None:
            return fired
    return None


def test_a_phase_is_overdue_only_once_it_ran_past_its_bound() -> None:
    clock = FakeClock()
    stamp = PhaseStamp(clock=clock)
    meter = StallMeter(clock.now_s, max_credit_s=1.5)
    assert _ticks(meter, stamp, clock, 120.0) is None  # idle between phases: nothing to be late
    with stamp.phase("checkpoint of partition 3", 5.0):
        assert _ticks(meter, stamp, clock, 125.0) is None  # exactly at the bound: not yet
        fired = _ticks(meter, stamp, clock, 200.0)
    assert fired is not None
    phase, running_s = fired
    assert phase.name == "checkpoint of partition 3" and running_s == 5.5 and clock.now_s == 125.5


def test_a_phase_ended_and_a_new_one_started_between_two_checks_is_credited_only_since_its_start() -> None:
    clock = FakeClock()
    stamp = PhaseStamp(clock=clock)
    meter = StallMeter(clock.now_s, max_credit_s=3.0)
    with stamp.phase("checkpoint of partition 0", 2.0):
        clock.now_s += 1.9
    with stamp.phase("checkpoint of partition 1", 2.0):
        clock.now_s += 0.1  # the first check comes 2 s after the previous one, 0.1 s into this phase
        assert meter.check(stamp.current, clock.now_s) is None
        clock.now_s += 1.8
        assert meter.check(stamp.current, clock.now_s) is None  # 1.9 s
        clock.now_s += 0.2
        fired = meter.check(stamp.current, clock.now_s)
    assert fired is not None and fired[0].name == "checkpoint of partition 1"
    assert fired[1] == pytest.approx(2.1)


def test_a_stopped_process_is_not_charged_for_its_pause() -> None:
    """SIGSTOP, then SIGCONT 100 s later: the pause counts as one capped check, not as a stall of the phase."""
    clock = FakeClock()
    stamp = PhaseStamp(clock=clock)
    meter = StallMeter(clock.now_s, max_credit_s=1.5)
    with stamp.phase("staging the runs of partition 0", 10.0):
        assert _ticks(meter, stamp, clock, 104.0) is None  # 4 s
        clock.now_s += 100.0  # stopped: no check ran
        assert meter.check(stamp.current, clock.now_s) is None  # 5.5 s credited
        fired = _ticks(meter, stamp, clock, 300.0)
    assert fired is not None and fired[1] == 10.5  # 4 s + 1.5 s + 5 s of checks after the pause


def test_an_inner_phase_replaces_the_outer_one_which_is_stamped_afresh_when_it_ends() -> None:
    clock = FakeClock()
    stamp = PhaseStamp(clock=clock)
    with stamp.phase("graceful release of partitions [0, 1]", 15.0):
        clock.now_s = 110.0
        with stamp.phase("checkpoint of partition 0", 10.0):
            assert stamp.current == Phase("checkpoint of partition 0", 110.0, 10.0)
            clock.now_s = 119.0
        # The outer phase's clock restarts: time spent in the inner phase was the inner phase's to bound.
        assert stamp.current == Phase("graceful release of partitions [0, 1]", 119.0, 15.0)
    assert stamp.current is None


def test_a_phase_ended_by_an_exception_is_left() -> None:
    stamp = PhaseStamp(clock=FakeClock())
    with pytest.raises(RuntimeError, match="boom"), stamp.phase("checkpoint of partition 0", 1.0):
        raise RuntimeError("boom")
    assert stamp.current is None


def test_a_phase_needs_a_positive_bound() -> None:
    stamp = PhaseStamp(clock=FakeClock())
    with pytest.raises(ValueError, match=r"phase 'poll': bound_s must be > 0, got 0\.0"), stamp.phase("poll", 0.0):
        pass


def test_the_derived_bound_covers_a_checkpoints_bounded_calls_and_the_transaction_timeout() -> None:
    s = Settings()
    assert default_turn_watchdog_s(s) == 72.5  # 7 calls x 10 s + 2.5 s
    assert default_turn_watchdog_s(s) > s.transaction_timeout_ms / 1000 + 4 * s.kafka_call_timeout_s
    slow = s.model_copy(update={"kafka_call_timeout_s": 30.0, "transaction_timeout_ms": 60_000})
    assert default_turn_watchdog_s(slow) == 270.0
    fast = s.model_copy(update={"kafka_call_timeout_s": 1.0})
    assert default_turn_watchdog_s(fast) == 60.0  # never below the floor


def test_the_bound_comes_from_the_worker_config_then_the_settings_then_the_derivation() -> None:
    s = Settings()
    assert turn_watchdog_s(None, s) == default_turn_watchdog_s(s)
    assert turn_watchdog_s(None, s.model_copy(update={"worker_turn_watchdog_s": 7.0})) == 7.0
    assert turn_watchdog_s(3.0, s.model_copy(update={"worker_turn_watchdog_s": 7.0})) == 3.0
    assert turn_watchdog_s(0.0, s) == 0.0  # disabled
    assert WorkerConfig().turn_watchdog_s is None
    with pytest.raises(ValueError, match=r"turn_watchdog_s must be a finite number of seconds >= 0.*-1\.0"):
        turn_watchdog_s(-1.0, s)
    with pytest.raises(ValueError, match="turn_watchdog_s"):
        turn_watchdog_s(float("nan"), s)


def test_the_setting_is_read_from_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLED_WORKER_TURN_WATCHDOG_S", "3")
    assert Settings().worker_turn_watchdog_s == 3.0
    monkeypatch.setenv("SETTLED_WORKER_TURN_WATCHDOG_S", "0")
    assert Settings().worker_turn_watchdog_s == 0.0
    monkeypatch.setenv("SETTLED_WORKER_TURN_WATCHDOG_S", "-1")
    with pytest.raises(ValidationError, match="worker_turn_watchdog_s"):
        Settings()
    monkeypatch.delenv("SETTLED_WORKER_TURN_WATCHDOG_S")
    assert Settings().worker_turn_watchdog_s is None


def test_the_interval_is_a_tenth_of_the_bound_within_limits() -> None:
    assert TurnWatchdog.interval_for(3.0) == pytest.approx(0.3)
    assert TurnWatchdog.interval_for(62.5) == 1.0
    assert TurnWatchdog.interval_for(0.1) == 0.05


def test_the_watchdog_thread_reports_an_overdue_phase_once_and_ignores_phases_that_end_in_time() -> None:
    stamp = PhaseStamp()
    fired: list[tuple[Phase, float]] = []
    done = threading.Event()

    def record(phase: Phase, elapsed_s: float) -> None:
        fired.append((phase, elapsed_s))
        done.set()

    dog = TurnWatchdog(stamp, check_interval_s=0.02, on_expiry=record)
    dog.start()
    try:
        for _ in range(10):  # many short phases, each well within its bound
            with stamp.phase("polling the inbox", 0.3):
                time.sleep(0.02)
        time.sleep(0.4)  # idle between phases: nothing to be late
        assert fired == []
        with stamp.phase("checkpoint of partition 3", 0.2):
            assert done.wait(5.0), "the watchdog did not fire on a phase past its bound"
        time.sleep(0.1)
    finally:
        dog.stop()
    assert len(fired) == 1
    phase, elapsed_s = fired[0]
    assert phase.name == "checkpoint of partition 3"
    assert 0.2 < elapsed_s < 5.0


def test_the_watchdog_starts_once() -> None:
    dog = TurnWatchdog(PhaseStamp(), check_interval_s=0.05, on_expiry=lambda phase, elapsed_s: None)
    dog.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            dog.start()
    finally:
        dog.stop()


_STALLED_CHILD = textwrap.dedent(
    """
    import logging, sys, threading, time
    from settled.processors._watchdog import PhaseStamp, TurnWatchdog
    logging.basicConfig(level="INFO", stream=sys.stderr)
    stamp = PhaseStamp()
    threading.Thread(target=time.sleep, args=(60,), name="bystander", daemon=True).start()
    TurnWatchdog(stamp, check_interval_s=0.05).start()
    with stamp.phase("checkpoint of partition 7", 0.3):
        time.sleep(60)  # stands in for a C call that ignores its timeout
    sys.exit(0)
    """
)


def test_the_default_expiry_logs_the_phase_dumps_every_stack_and_exits_with_the_watchdog_code() -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", _STALLED_CHILD], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
    )
    took_s = time.monotonic() - started
    assert done.returncode == WATCHDOG_EXIT_CODE == 75, done.stderr
    assert took_s < 20, took_s
    assert "CRITICAL" in done.stderr and "checkpoint of partition 7 has not finished" in done.stderr, done.stderr
    # faulthandler's all-threads dump: the watchdog ("Current thread"), the bystander and the stalled main thread.
    assert "Current thread 0x" in done.stderr, done.stderr
    assert done.stderr.count("hread 0x") >= 3, done.stderr
    assert "<module>" in done.stderr, done.stderr  # the stalled main thread's frame
