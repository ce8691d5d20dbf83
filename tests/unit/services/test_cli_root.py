"""The CLI's composition root: one resolution of "empty means the dev stack", errors as exit codes (issue 14 item 3).

With no service configured and no dev stack running (a fresh state folder), every command that needs one exits 2
naming the variable to set, and an app that does not load exits 2 before anything is resolved.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from settled import ErrorCategory
from settled.services._cli_root import ServiceUnavailableError, resolve_settings
from settled.services.cli import app


@pytest.fixture
def no_services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"SETTLED_KAFKA_BOOTSTRAP": "", "SETTLED_POSTGRES_DSN": "", "SETTLED_STATE_DIR": str(tmp_path / "stack")}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.mark.usefixtures("no_services")
def test_an_empty_bootstrap_without_a_running_dev_stack_is_unavailable() -> None:
    with pytest.raises(ServiceUnavailableError, match="set SETTLED_KAFKA_BOOTSTRAP") as info:
        resolve_settings()
    assert info.value.category is ErrorCategory.UNAVAILABLE
    with pytest.raises(ServiceUnavailableError, match="set SETTLED_POSTGRES_DSN"):
        resolve_settings(kafka=False, postgres=True)
    assert resolve_settings(kafka=False).kafka_bootstrap == ""  # nothing needed, nothing resolved


def test_configured_services_are_used_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SETTLED_KAFKA_BOOTSTRAP", "kafka.example:9092")
    monkeypatch.setenv("SETTLED_POSTGRES_DSN", "postgresql://pg.example/db")
    s = resolve_settings(kafka=True, postgres=True)
    assert (s.kafka_bootstrap, s.postgres_dsn) == ("kafka.example:9092", "postgresql://pg.example/db")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["topics", "describe"], "SETTLED_KAFKA_BOOTSTRAP"),
        (["quarantine", "list"], "SETTLED_KAFKA_BOOTSTRAP"),
        (["submit", "conv-1", "{}"], "SETTLED_KAFKA_BOOTSTRAP"),
        (["abort", "conv-1", "sub-1"], "SETTLED_KAFKA_BOOTSTRAP"),
        (["settlements", "tail"], "SETTLED_KAFKA_BOOTSTRAP"),
        (["projections", "check"], "SETTLED_KAFKA_BOOTSTRAP"),
        (["runs", "list"], "SETTLED_KAFKA_BOOTSTRAP"),
    ],
)
def test_every_command_without_its_service_exits_2_naming_the_variable(
    no_services: dict[str, str], args: list[str], names: str
) -> None:
    result = CliRunner().invoke(app, args, env=no_services)
    assert result.exit_code == 2, (result.stdout, result.stderr, result.exception)
    assert names in result.stderr


def test_bad_input_exits_2_before_any_service_is_resolved(no_services: dict[str, str]) -> None:
    result = CliRunner().invoke(app, ["submit", "conv-1", "{not json"], env=no_services)
    assert result.exit_code == 2 and "INPUT_JSON is not JSON" in result.stderr
    worker = [sys.executable, "-m", "settled.services", "worker", "--app", "no_such_module_here:app"]
    loaded = subprocess.run(worker, env={**os.environ, **no_services}, capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 2, loaded.stderr
    assert "no_such_module_here" in loaded.stderr
