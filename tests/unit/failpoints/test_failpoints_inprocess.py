"""Failpoints inside the test process: grammar, triggers, raise, seeded delay, run-time pickup, disarmed cost."""

from __future__ import annotations

import builtins
import os
import subprocess
import sys
import time

import pytest

from settled import _failpoints
from settled._failpoints import (
    FailpointControl,
    FailpointError,
    FailpointSpecError,
    ScheduledKill,
    choose_schedule,
    configure,
    failpoint,
    hit_counts,
    parse_spec,
)


def _raises_at(name: str, hits: int) -> list[int]:
    """Hit ``name`` ``hits`` times and return the process's hit numbers at which it raised."""
    raised = []
    for _ in range(hits):
        try:
            failpoint(name)
        except FailpointError as exc:
            if exc.name != name:
                raise
            raised.append(exc.hit)
    return raised


def test_grammar_canonical_forms():
    spec = " a.b = 3 * kill ;; c=2+*delay( 50ms , 20ms ) ; d=raise; e=1*exit(3); f=pause; g=pause(1.5s); h=4*stop "
    assert parse_spec(spec) == [
        "a.b=3*kill",
        "c=2+*delay(50ms,20ms)",
        "d=raise",
        "e=1*exit(3)",
        "f=pause(30s)",
        "g=pause(1.5s)",
        "h=4*stop",
    ]
    assert parse_spec("") == []


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("a.b", "has no '='"),
        ("A.b=kill", "name 'A.b'"),
        ("a..b=kill", "name 'a..b'"),
        ("a=0*kill", "trigger '0'"),
        ("a=x*kill", "trigger 'x'"),
        ("a=*kill", "trigger ''"),
        ("a=3*boom", "unknown action 'boom'"),
        ("a=kill(1)", "takes no arguments"),
        ("a=exit", "exit needs one code"),
        ("a=exit(256)", "exit needs one code"),
        ("a=delay(50)", "duration '50'"),
        ("a=delay()", "duration ''"),
        ("a=delay(1ms,2ms,3ms)", "optional jitter"),
        ("a=pause(1s,2s)", "one timeout"),
    ],
)
def test_grammar_rejects_with_the_offending_part(spec, problem):
    with pytest.raises(FailpointSpecError, match=f"bad failpoint spec .*{problem}") as info:
        parse_spec(spec)
    assert info.value.spec == spec


def test_triggers_nth_only_every_and_onwards():
    configure("a=3*raise;b=raise;c=2+*raise")
    assert _raises_at("a", 5) == [3]
    assert _raises_at("b", 3) == [1, 2, 3]
    assert _raises_at("c", 4) == [2, 3, 4]
    assert _raises_at("other", 2) == []
    assert hit_counts() == {"a": 5, "b": 3, "c": 4, "other": 2}


def test_delay_jitter_is_seeded_per_name(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(_failpoints.time, "sleep", slept.append)

    def run(seed: int) -> list[float]:
        slept.clear()
        configure("a=delay(50ms,20ms);b=2*delay(1s)", seed=seed)
        for _ in range(5):
            failpoint("a")
            failpoint("b")
        return list(slept)

    first = run(seed=7)
    assert len(first) == 6
    assert first[2] == 1.0  # b's single delay, at its 2nd hit, after a's 2nd
    jittered = first[:2] + first[3:]
    assert all(0.05 <= s < 0.07 for s in jittered)
    assert len(set(jittered)) == 5
    assert run(seed=7) == first
    assert run(seed=8) != first


def test_delay_really_sleeps():
    configure("a=1*delay(30ms)")
    started = time.monotonic()
    failpoint("a")
    assert time.monotonic() - started >= 0.03


def test_run_time_arm_applies_at_the_next_hit_and_disarm_removes_it(tmp_path):
    configure(control_dir=tmp_path)
    control = FailpointControl(tmp_path)
    failpoint("a")
    control.arm("a", "1*raise")
    assert _raises_at("a", 2) == [2]  # armed before hit 2 began: hit 2 is the arming's 1st
    control.arm("a", "2+*raise")  # replaces the earlier arming; counts from its own pickup (hit 4)
    assert _raises_at("a", 3) == [5, 6]
    control.disarm("a")
    assert _raises_at("a", 2) == []
    control.arm("a", "raise")
    control.disarm("a")
    control.arm("a", "2*raise")  # three changes within one timestamp tick are all seen
    assert _raises_at("a", 2) == [10]
    assert hit_counts() == {"a": 10}
    assert [r.hit for r in control.hit_log()] == list(range(1, 11))


def test_settled_arm_folder_costs_one_stat_per_hit(tmp_path, monkeypatch):
    configure(control_dir=tmp_path)
    control = FailpointControl(tmp_path)
    control.arm("b", "raise")
    old_ns = time.time_ns() - 10_000_000_000
    os.utime(tmp_path / "arm", ns=(old_ns, old_ns))
    failpoint("a")  # lists arm/ once; its mtime is old enough to trust from now on

    listings = []
    real_listdir = os.listdir
    monkeypatch.setattr(_failpoints.os, "listdir", lambda path: listings.append(path) or real_listdir(path))
    for _ in range(100):
        failpoint("a")
    assert listings == []

    control.arm("a", "1*raise")  # moves the folder's mtime: the next hit re-lists and sees it
    assert _raises_at("a", 1) == [102]
    assert len(listings) == 1


def test_disarmed_failpoint_reads_environment_once_and_touches_no_file(monkeypatch):
    reads = []

    class CountingEnviron(dict[str, str]):
        def get(self, key, default=None):
            reads.append(key)
            return super().get(key, default)

    monkeypatch.setattr(_failpoints.os, "environ", CountingEnviron(os.environ))
    failpoint("a")
    assert set(reads) == {"SETTLED_FAILPOINTS", "SETTLED_FAILPOINT_DIR", "SETTLED_FAILPOINT_SEED"}
    reads.clear()

    def forbidden(*args, **kwargs):
        raise AssertionError("a disarmed failpoint touched the file system or the clock")

    for module, attr in [(os, "stat"), (os, "listdir"), (os, "open"), (os, "write"), (builtins, "open")]:
        monkeypatch.setattr(module, attr, forbidden)
    monkeypatch.setattr(_failpoints.time, "time_ns", forbidden)
    for _ in range(10_000):
        failpoint("a")
    assert reads == []
    assert hit_counts() == {}


def test_import_reads_nothing():
    code = "import settled._failpoints as f; print(f._off, f._runtime)"
    env = {**os.environ, "SETTLED_FAILPOINTS": "not a spec", "SETTLED_FAILPOINT_DIR": "/nonexistent/fp"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "None"]


def test_pause_without_release_times_out_and_cleans_up(tmp_path):
    configure("a=pause(50ms)", control_dir=tmp_path)
    with pytest.raises(FailpointError, match=r"hit 1: barrier not released within 0.05 s"):
        failpoint("a")
    assert list((tmp_path / "reached").iterdir()) == []


def test_pause_without_control_folder_is_an_error():
    configure("a=pause(1s)")
    with pytest.raises(FailpointError, match="SETTLED_FAILPOINT_DIR"):
        failpoint("a")


def test_control_rejects_bad_arming_before_writing(tmp_path):
    control = FailpointControl(tmp_path)
    with pytest.raises(FailpointSpecError, match="unknown action 'explode'"):
        control.arm("a", "1*explode")
    with pytest.raises(FailpointSpecError, match="name 'A'"):
        control.arm("A", "kill")
    assert list((tmp_path / "arm").iterdir()) == []


def test_wait_helpers_time_out_with_a_clear_error(tmp_path):
    control = FailpointControl(tmp_path)
    with pytest.raises(TimeoutError, match="no process reached failpoint barrier 'a'"):
        control.wait_reached("a", timeout_s=0.05)
    with pytest.raises(TimeoutError, match="failpoint 'a' hit 0 times, not 1"):
        control.wait_hits("a", 1, timeout_s=0.05)


def test_choose_schedule_is_a_function_of_its_seed(caplog):
    names = ["appender.after_produce", "worker.before_settle", "worker.after_commit"]
    with caplog.at_level("INFO", logger="settled._failpoints"):
        schedule = choose_schedule(42, names, kills=4, max_hit=5)
    assert "seed=42" in caplog.text
    assert len(schedule) == 4
    assert all(kill.name in names and 1 <= kill.hit <= 5 for kill in schedule)
    assert choose_schedule(42, list(reversed(names)), kills=4, max_hit=5) == schedule
    assert len({choose_schedule(seed, names, kills=4, max_hit=5) for seed in range(20)}) > 1
    assert ScheduledKill("a.b", 2).spec == "a.b=2*kill"
    assert parse_spec(";".join(kill.spec for kill in schedule))
    assert choose_schedule(1, names, kills=0) == ()


@pytest.mark.parametrize(
    ("names", "kills", "max_hit", "problem"),
    [([], 1, 3, "names is empty"), (["Bad"], 1, 3, "name 'Bad'"), (["a"], -1, 3, "kills"), (["a"], 1, 0, "max_hit")],
)
def test_choose_schedule_rejects_bad_input(names, kills, max_hit, problem):
    with pytest.raises(ValueError, match=problem):
        choose_schedule(0, names, kills, max_hit=max_hit)
