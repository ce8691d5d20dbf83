"""``settled demo`` finds the BFCL example through the ``settled.demo`` entry point, else says how to install it."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from settled.services._cli_demo import _run_demo
from settled.services.cli import app


def test_settled_demo_bfcl_runs_the_installed_examples_command() -> None:
    result = CliRunner().invoke(app, ["demo", "bfcl", "--help"])
    assert result.exit_code == 0, result.output
    assert "--conversations" in result.output and "--chaos" in result.output, result.output


def test_the_examples_own_option_errors_come_back_as_exit_2() -> None:
    result = CliRunner().invoke(app, ["demo", "bfcl", "--mode", "sometimes"])
    assert result.exit_code == 2, result.output
    assert "--mode 'sometimes'" in result.output, result.output


def test_a_demo_no_distribution_provides_exits_2_saying_how_to_install_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exited:
        _run_demo("no-such-demo", [])
    assert exited.value.exit_code == 2
    out = capsys.readouterr().out
    assert "not installed" in out and "pip install -e examples/bfcl" in out, out
