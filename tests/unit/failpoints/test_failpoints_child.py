"""Failpoints in spawned child processes: spawn-time and run-time arming, kill, exit, stop, barrier, hit log."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from settled._failpoints import FailpointControl

NAME = "test.loop"
WAIT_S = 20.0


def _passes(record: Path) -> list[int]:
    return [int(line) for line in record.read_text().split()] if record.exists() else []


def test_armed_for_third_hit_kills_child_exactly_at_third_pass(tmp_path, spawn_child):
    control = FailpointControl(tmp_path / "fp")
    child, record = spawn_child(control.env(f"{NAME}=3*kill"), NAME, passes=10)
    _, stderr = child.communicate(timeout=WAIT_S)

    assert child.returncode == -signal.SIGKILL, stderr
    assert _passes(record) == [1, 2, 3]  # pass 3 was recorded before its hook; no 4th pass
    log = [(r.pid, r.name, r.hit, r.actions) for r in control.hit_log()]
    assert log == [(child.pid, NAME, 1, ()), (child.pid, NAME, 2, ()), (child.pid, NAME, 3, ("kill",))]
    assert control.hits(NAME) == 3


def test_every_hit_from_nth_on_and_exit_code(tmp_path, spawn_child):
    control = FailpointControl(tmp_path / "fp")
    spec = f"{NAME}=2+*delay(1ms);{NAME}=4*exit(7)"
    child, record = spawn_child(control.env(spec), NAME, passes=10)
    child.communicate(timeout=WAIT_S)

    assert child.returncode == 7
    assert _passes(record) == [1, 2, 3, 4]
    assert [r.actions for r in control.hit_log()] == [(), ("delay(1ms)",), ("delay(1ms)",), ("delay(1ms)", "exit(7)")]


def test_disarmed_child_runs_to_the_end_and_logs_every_hit(tmp_path, spawn_child):
    control = FailpointControl(tmp_path / "fp")
    child, record = spawn_child(control.env(), NAME, passes=5)
    stdout, stderr = child.communicate(timeout=WAIT_S)

    assert child.returncode == 0, stderr
    assert stdout.strip() == "done"
    assert _passes(record) == [1, 2, 3, 4, 5]
    assert [(r.hit, r.actions) for r in control.hit_log()] == [(i, ()) for i in range(1, 6)]


def test_barrier_holds_the_child_until_released(tmp_path, spawn_child):
    control = FailpointControl(tmp_path / "fp")
    child, record = spawn_child(control.env(f"{NAME}=2*pause(20s)"), NAME, passes=4)

    reached = control.wait_reached(NAME, timeout_s=WAIT_S)
    assert (reached.pid, reached.hit) == (child.pid, 2)
    time.sleep(0.3)  # give a child that ignored the barrier time to run on (it must not)
    assert _passes(record) == [1, 2]
    assert child.poll() is None

    assert control.release(NAME) == 1
    _, stderr = child.communicate(timeout=WAIT_S)
    assert child.returncode == 0, stderr
    assert _passes(record) == [1, 2, 3, 4]
    assert control.waiting(NAME) == []
    assert list((control.folder / "release").iterdir()) == []  # the child cleaned up its barrier files


def test_run_time_arming_of_a_live_child_counts_from_pickup(tmp_path, spawn_child):
    control = FailpointControl(tmp_path / "fp")
    child, record = spawn_child(control.env(f"{NAME}=2*pause(20s)"), NAME, passes=10)
    control.wait_reached(NAME, timeout_s=WAIT_S)  # the child is blocked inside hit 2

    control.arm(NAME, "2*kill")  # picked up at hit 3 (the next hit to begin), so it fires at hit 4
    control.release(NAME)
    child.communicate(timeout=WAIT_S)

    assert child.returncode == -signal.SIGKILL
    assert _passes(record) == [1, 2, 3, 4]
    assert [(r.hit, r.actions) for r in control.hit_log()] == [(1, ()), (2, ("pause(20s)",)), (3, ()), (4, ("kill",))]


def test_run_time_disarm_lets_the_child_finish(tmp_path, spawn_child):
    control = FailpointControl(tmp_path / "fp")
    child, record = spawn_child(control.env(f"{NAME}=1*pause(20s)"), NAME, passes=4)
    control.wait_reached(NAME, timeout_s=WAIT_S)
    control.arm(NAME, "1+*raise")
    control.disarm(NAME)
    control.release(NAME)
    _, stderr = child.communicate(timeout=WAIT_S)

    assert child.returncode == 0, stderr
    assert _passes(record) == [1, 2, 3, 4]


def test_stop_suspends_the_child_until_sigcont(tmp_path, spawn_child):
    control = FailpointControl(tmp_path / "fp")
    child, record = spawn_child(control.env(f"{NAME}=2*stop"), NAME, passes=3)

    _, status = os.waitpid(child.pid, os.WUNTRACED)  # returns when the child stops itself
    assert os.WIFSTOPPED(status)
    assert os.WSTOPSIG(status) == signal.SIGSTOP
    assert _passes(record) == [1, 2]
    assert control.hit_log()[-1].actions == ("stop",)

    os.kill(child.pid, signal.SIGCONT)
    _, stderr = child.communicate(timeout=WAIT_S)
    assert child.returncode == 0, stderr
    assert _passes(record) == [1, 2, 3]


def test_raise_in_child_surfaces_as_failpoint_error(tmp_path, spawn_child):
    control = FailpointControl(tmp_path / "fp")
    child, record = spawn_child(control.env(f"{NAME}=2*raise"), NAME, passes=5)
    _, stderr = child.communicate(timeout=WAIT_S)

    assert child.returncode == 1
    assert "FailpointError: failpoint 'test.loop' hit 2: armed to raise" in stderr
    assert _passes(record) == [1, 2]


def test_bad_spec_in_environment_fails_at_first_hit_not_at_import(tmp_path, spawn_child):
    child, record = spawn_child({"SETTLED_FAILPOINTS": "test.loop=3*explode"}, NAME, passes=3)
    _, stderr = child.communicate(timeout=WAIT_S)

    assert child.returncode == 1
    assert _passes(record) == [1]  # the import succeeded and pass 1 ran; its hook read the bad spec
    assert "FailpointSpecError: bad failpoint spec 'test.loop=3*explode': unknown action 'explode'" in stderr
