"""``settled dev up|down|status``: the local Kafka + PostgreSQL stack (docs/design.md §8)."""

from __future__ import annotations

import time

import typer
from rich.console import Console

from settled._settings import DEV_TIMEOUTS, Settings
from settled.services._cli_root import stack_from_settings
from settled.services._devstack import StackError, broker_ready_timeout_s

__all__ = ["dev_app", "stack_from_settings"]

dev_app = typer.Typer(no_args_is_help=True, help="Run a real Kafka broker and PostgreSQL locally, without Docker.")
_console = Console(stderr=True)
#: From how many partition folders ``up`` says that the broker's start-up will take a while.
_MANY_PARTITION_FOLDERS = 2000


@dev_app.command("up")
def up() -> None:
    """Start the broker and PostgreSQL (idempotent) and print their addresses and short timeouts as shell exports.

    The timeouts are `settled._settings.DEV_TIMEOUTS`, which the dev broker allows: a developer's shell that evals
    the exports runs workers and tests with them.
    """
    stack = stack_from_settings(Settings())
    before = stack.status()
    folders = stack.broker().partition_folders()
    ready_timeout_s = broker_ready_timeout_s(folders)
    if folders >= _MANY_PARTITION_FOLDERS:
        _console.print(
            f"the broker holds {folders} partition folders and loads each before it answers: start-up may take up "
            f"to {ready_timeout_s:.0f} s (`settled dev down --wipe` empties the stack)"
        )
    started = time.monotonic()
    try:
        bootstrap, dsn = stack.up(ready_timeout_s)
    except StackError as exc:
        _console.print(f"[red]settled dev up failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    took_s = time.monotonic() - started
    for name, was_running in before.items():
        _console.print(f"{name}: {'already running' if was_running else 'started'}")
    _console.print(f"ready in {took_s:.1f} s; state in {stack.state_dir}")
    typer.echo(f"export SETTLED_KAFKA_BOOTSTRAP={bootstrap}")
    typer.echo(f"export SETTLED_POSTGRES_DSN={dsn}")
    for name, value in DEV_TIMEOUTS.items():
        typer.echo(f"export SETTLED_{name.upper()}={value}")


@dev_app.command("down")
def down(
    wipe: bool = typer.Option(
        False, "--wipe", help="Also delete the broker's and PostgreSQL's data: the next `up` starts empty."
    ),
) -> None:
    """Stop the broker and PostgreSQL; their data stays for the next ``up`` unless ``--wipe`` is given."""
    stack = stack_from_settings(Settings())
    try:
        if wipe:
            stack.wipe()
        else:
            stack.down()
    except StackError as exc:
        _console.print(f"[red]settled dev down failed:[/red] {exc}")
        raise typer.Exit(1) from exc
    _console.print(f"stopped; data deleted from {stack.state_dir}" if wipe else "stopped")


@dev_app.command("status")
def status() -> None:
    """Print whether each service is running; exit 1 when one is not."""
    stack = stack_from_settings(Settings())
    state = stack.status()
    for name, running in state.items():
        typer.echo(f"{name}: {'running' if running else 'stopped'}")
    if not all(state.values()):
        raise typer.Exit(1)
