"""settled.testing's harness without a broker: ``settled worker`` needs ``--app``; the supervisor restarts an exit."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from settled._settings import Settings
from settled.services.cli import app
from settled.testing import FailpointControl, Supervisor, WorkerProcess

ROOT = Path(__file__).resolve().parents[3]


def test_settled_worker_without_app_exits_2_naming_the_option() -> None:
    result = CliRunner().invoke(app, ["worker", "--worker-id", "w1"])
    assert result.exit_code == 2, result.output
    assert "--app" in result.output, result.output


def _not_loading(tmp_path: Path, n: int) -> WorkerProcess:
    """A worker whose app does not load: it exits 2 at once, before any Kafka client is built."""
    settings = Settings(namespace="unused", kafka_bootstrap="127.0.0.1:1")
    return WorkerProcess.start(
        settings, app="tests.unit.testing.no_such_module:app", log_path=tmp_path / "w.log", worker_id=f"w{n}", cwd=ROOT
    )


def test_the_supervisor_restarts_a_worker_that_exited_and_records_its_code(tmp_path: Path) -> None:
    supervisor = Supervisor(lambda n: _not_loading(tmp_path, n))
    first = supervisor.start()
    assert first.wait(60) == 2, first.tail()
    assert "no_such_module" in first.tail()
    assert supervisor.check() == 2
    second = supervisor.worker
    assert second is not first and second.name == "w1"
    assert second.wait(60) == 2
    assert supervisor.exits == [2] and supervisor.restarts == 1
    assert supervisor.stop() == 2  # already ended: its code, and no restart
    assert supervisor.incarnations == 2


def test_kill_at_needs_a_control_folder(tmp_path: Path) -> None:
    worker = _not_loading(tmp_path, 0)
    worker.wait(60)
    with pytest.raises(ValueError, match="without a failpoint control folder"):
        worker.kill_at("engine.tool_returned")
    controlled = WorkerProcess(worker.name, worker.proc, worker.log_path, FailpointControl(tmp_path / "fp"))
    controlled.kill_at("engine.tool_returned", 2)
    assert [p.read_text().strip() for p in (tmp_path / "fp" / "arm").iterdir()] == ["2*kill"]
