"""``settled dev up|down|status`` on a private state folder and private ports (issue 3)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from settled.services._devstack import PostgresServer, free_port

pytestmark = pytest.mark.integration


def _settled(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "settled.services", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def test_up_twice_is_a_noop_and_down_leaves_no_process(tmp_path: Path, kafka_lib_dir: Path) -> None:
    state = tmp_path / "stack"
    env = {
        **os.environ,
        "SETTLED_STATE_DIR": str(state),
        "SETTLED_JAR_CACHE_DIR": str(kafka_lib_dir.parent.parent),
        "SETTLED_KAFKA_PORT": str(free_port()),
        "SETTLED_KAFKA_CONTROLLER_PORT": str(free_port()),
        "SETTLED_POSTGRES_PORT": str(free_port()),
    }
    first = _settled(env, "dev", "up")
    assert first.returncode == 0, first.stderr
    assert "kafka: started" in first.stderr and "postgres: started" in first.stderr
    assert f"SETTLED_KAFKA_BOOTSTRAP=127.0.0.1:{env['SETTLED_KAFKA_PORT']}" in first.stdout
    for line in ("SESSION_TIMEOUT_MS=3000", "HEARTBEAT_INTERVAL_MS=500", "TRANSACTION_TIMEOUT_MS=2500"):
        assert f"export SETTLED_{line}\n" in first.stdout  # the short timeouts the dev broker allows
    kafka_pid = (state / "kafka" / "kafka.pid").read_text()
    try:
        second = _settled(env, "dev", "up")
        assert second.returncode == 0, second.stderr
        assert "kafka: already running" in second.stderr and "postgres: already running" in second.stderr
        assert (state / "kafka" / "kafka.pid").read_text() == kafka_pid  # same process, nothing restarted
        assert _settled(env, "dev", "status").returncode == 0
    finally:
        down = _settled(env, "dev", "down")
    assert down.returncode == 0, down.stderr
    assert _settled(env, "dev", "status").returncode == 1
    assert _processes_mentioning(str(state)) == []
    assert _processes_mentioning(f"-p {env['SETTLED_POSTGRES_PORT']}") == []
    pg = PostgresServer(state / "postgres", int(env["SETTLED_POSTGRES_PORT"]))
    assert (state / "kafka" / "data" / "meta.properties").exists() and pg.data_dir.exists()  # down keeps the data
    wipe = _settled(env, "dev", "down", "--wipe")
    assert wipe.returncode == 0, wipe.stderr
    assert not (state / "kafka" / "data").exists() and not pg.data_dir.exists()
