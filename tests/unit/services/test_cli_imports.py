"""``settled worker`` imports only what the worker uses (issue 24 item 4: a worker restarted in place starts sooner).

The command line used to import every command's module before running any: the worker's process spent about 0.7 s
importing the HTTP API, the client, the projections and the doctor it never uses (``python -X importtime``).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer.main
from typer.core import TyperGroup
from typer.testing import CliRunner

from settled.services.cli import build_app

#: Modules of other commands, or their dependencies, that a worker never uses.
NOT_FOR_THE_WORKER = (
    "fastapi",
    "uvicorn",
    "settled.api",
    "settled.client",
    "settled.projections",
    "settled.services._doctor",
    "settled.services._cli_client",
    "psycopg",
)

#: Runs the ``settled`` entry point as ``settled worker --app <a module that does not exist>``: the worker command's
#: own set-up runs (logging, settings, loading the app, which fails with exit 2 before any Kafka client is built),
#: then it prints its exit code and the modules the process imported.
_SCRIPT = """
import json, sys
sys.argv = ["settled", "worker", "--app", "settled_no_such_module_for_this_test:app"]
from settled.services.cli import main
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_the_worker_command_imports_no_other_commands_modules() -> None:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] == 2, out.stderr  # the app did not load: the worker command ran up to there
    assert "cannot import 'settled_no_such_module_for_this_test'" in out.stderr
    assert "settled.services._worker_service" in result["modules"]
    imported = [name for name in NOT_FOR_THE_WORKER if name in result["modules"]]
    assert imported == []


def test_a_command_alone_reads_as_in_the_whole_command_line() -> None:
    """`main` builds the command line with the named command alone: its help and its errors must not change."""
    runner = CliRunner()
    whole = build_app()
    group = typer.main.get_command(whole)
    assert isinstance(group, TyperGroup)
    names = list(group.commands)
    assert len(names) == 25 and names[0] == "worker"
    for name in names:
        for args in ([name, "--help"], [name, "--no-such-option"]):
            alone = runner.invoke(build_app({name}), args, prog_name="settled")
            expected = runner.invoke(whole, args, prog_name="settled")
            assert (alone.exit_code, alone.output) == (expected.exit_code, expected.output), args


def test_build_app_names_an_unknown_command() -> None:
    with pytest.raises(ValueError, match=r"names: not settled commands: \['wrker'\]"):
        build_app({"wrker"})
