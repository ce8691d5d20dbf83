"""Fixtures of the failpoint and fault-switch tests: every test starts and ends with this process disarmed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from settled import _failpoints, _faults

CHILD = Path(__file__).with_name("_fp_child.py")


@pytest.fixture(autouse=True)
def _disarmed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in (_failpoints.FAILPOINTS_ENV_VAR, _failpoints.FAILPOINT_DIR_ENV_VAR, _failpoints.FAILPOINT_SEED_ENV_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(_faults.FAULT_ENV_VAR, raising=False)
    monkeypatch.setattr(_faults, "_enabled", None)
    _failpoints.reset()
    yield
    _failpoints.reset()


@pytest.fixture
def spawn_child(tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[str], Path]]]:
    """Start ``_fp_child.py`` with extra environment; returns the process and its pass-record file."""
    started: list[subprocess.Popen[str]] = []

    def spawn(env: dict[str, str], name: str, passes: int, pause_s: float = 0.0) -> tuple[subprocess.Popen[str], Path]:
        record = tmp_path / f"passes-{len(started)}.txt"
        process = subprocess.Popen(
            [sys.executable, str(CHILD), str(record), name, str(passes), str(pause_s)],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process, record

    yield spawn
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)
