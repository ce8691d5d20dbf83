"""The ``settled`` command line (typer). Each command group lives in its own private module.

A command's module is imported only when that command runs: ``settled worker`` loads the worker's modules, not the
HTTP API's, the client's or the doctor's (a worker restarted in place starts that much sooner: docs/architecture.md
"Restart in place"). `main` builds the command line with the command its first argument names alone; anything else
(no argument, ``--help``, an option, an unknown or misspelt name, shell completion) gets every command, so the root's
help and its suggestions list them all. ``app`` (the whole command line, for tests) is built on first access.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Collection
from typing import Final

import typer

_HELP: Final = "settled: durable AI-agent conversations on Apache Kafka."

#: Every command: its name, then the module and attribute of its function (a command) or typer app (a group). Commands
#: come first, then groups, as typer lists them in ``settled --help``.
_COMMANDS: Final[tuple[tuple[str, str, str], ...]] = (
    ("worker", "settled.services._worker_service", "worker_command"),
    ("api", "settled.services._cli_api", "api_command"),
    ("submit", "settled.services._cli_client", "submit"),
    ("abort", "settled.services._cli_client", "abort"),
    ("signal", "settled.services._cli_client", "signal"),
    ("steer", "settled.services._cli_client", "steer"),
    ("approve", "settled.services._cli_client", "approve"),
    ("deny", "settled.services._cli_client", "deny"),
    ("retry", "settled.services._cli_client", "retry"),
    ("doctor", "settled.services._cli_doctor", "doctor"),
    ("dev", "settled.services._cli_dev", "dev_app"),
    ("topics", "settled.services._cli_topics", "topics_app"),
    ("quarantine", "settled.services._cli_quarantine", "quarantine_app"),
    ("demo", "settled.services._cli_demo", "demo_app"),
    ("tokens", "settled.services._cli_api", "tokens_app"),
    ("settlements", "settled.services._cli_client", "settlements_app"),
    ("projections", "settled.services._cli_projections", "projections_app"),
    ("runs", "settled.services._cli_runs", "runs_app"),
    ("unknown", "settled.services._cli_runs", "unknown_app"),
    ("submissions", "settled.services._cli_runs", "submissions_app"),
    ("conversations", "settled.services._cli_runs", "conversations_app"),
    ("approvals", "settled.services._cli_runs", "approvals_app"),
    ("access", "settled.services._cli_client", "access_app"),
    ("flows", "settled.services._cli_client", "flows_app"),
    ("lane", "settled.services._cli_client", "lane_app"),
)

_NAMES: Final = frozenset(name for name, _, _ in _COMMANDS)

#: The whole command line (every command), built on first access by the module's ``__getattr__``.
app: typer.Typer
_app: typer.Typer | None = None


def _root() -> None:
    """The root command: no options of its own (its help text is the Typer's); it keeps one command a group."""


def build_app(names: Collection[str] | None = None) -> typer.Typer:
    """Build the ``settled`` command line, importing only the modules of the commands it gets.

    Args:
        names: The commands to include (None: all of them). With one, it is still a subcommand
            (``settled worker --help`` shows ``settled worker``), as in the whole command line.

    Returns:
        The typer app.

    Raises:
        ValueError: A name is not a ``settled`` command.
    """
    unknown = sorted(set(names or ()) - _NAMES)
    if unknown:
        raise ValueError(f"names: not settled commands: {unknown}")
    cli = typer.Typer(no_args_is_help=True, help=_HELP)
    cli.callback()(_root)
    for name, module, attribute in _COMMANDS:
        if names is not None and name not in names:
            continue
        target = getattr(importlib.import_module(module), attribute)
        if isinstance(target, typer.Typer):
            cli.add_typer(target, name=name)
        else:
            cli.command(name)(target)
    return cli


def __getattr__(name: str) -> typer.Typer:
    """``app``: the whole command line, built (and every command's module imported) on first access."""
    global _app
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _app is None:
        _app = build_app()
    return _app


def main() -> None:
    """Run the ``settled`` command line: with only the command that ``sys.argv[1]`` names, if it names one."""
    args = sys.argv[1:]
    build_app({args[0]} if args and args[0] in _NAMES else None)()
