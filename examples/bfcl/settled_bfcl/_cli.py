"""``settled demo bfcl``: the BFCL main job's command line, found by ``settled demo`` through an entry point.

``settled demo [bfcl] [--conversations N] [--category base|miss_func] [--chaos] [--seed S] [--workers 2]
[--no-dedup] [--no-idempotency TradingBot,TravelAPI] [--adversarial] [--approvals] [--provider openai
[--base-url URL] [--model M]] ...``: BFCL multi-turn
conversations run durably through the real stack and judged in a fresh process (`settled_bfcl._demo`); exit code 0
only when every conversation passes, 2 on bad options. This package declares it in the ``settled.demo`` entry-point
group (``examples/bfcl/pyproject.toml``); ``settled`` itself holds no BFCL code.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import typer
from rich.console import Console

from settled._settings import Settings
from settled_bfcl._demo import DemoError, DemoOptions, render_demo, run_demo
from settled_bfcl._replay import ReplayMode

__all__ = ["bfcl", "main"]

_console = Console()


@contextlib.contextmanager
def _native_stderr_to(path: Path) -> Iterator[None]:
    """Send file descriptor 2 to ``path`` meanwhile.

    librdkafka's own log lines (e.g. "Connection refused" during the chaos broker restart) would bury the progress bar.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def _run_bfcl(options: DemoOptions) -> None:
    native_log = Settings().state_dir / "bfcl-demo" / "native-stderr.log"
    with _native_stderr_to(native_log):
        result = run_demo(options, console=_console)
    render_demo(result, _console)
    if not result.passed:
        raise typer.Exit(1)


def bfcl(
    conversations: int | None = typer.Option(None, "--conversations", min=1, help="How many (default: all)."),
    category: str = typer.Option("base", "--category", help="base or miss_func."),
    chaos: bool = typer.Option(False, "--chaos", help="SIGKILL workers at seeded failpoints; restart broker, tools."),
    seed: int | None = typer.Option(None, "--seed", help="Seed of the chaos schedule and chunking (default: drawn)."),
    workers: int = typer.Option(2, "--workers", min=1, help="Worker processes sharing the partitions."),
    no_dedup: bool = typer.Option(False, "--no-dedup", help="Negative control: the tool server runs repeated keys."),
    no_idempotency: str = typer.Option(
        "", "--no-idempotency", help="Backend classes that are not idempotent, e.g. TradingBot,TravelAPI."
    ),
    adversarial: bool = typer.Option(False, "--adversarial", help="The model calls a not-offered tool (miss_func)."),
    approvals: bool = typer.Option(
        False, "--approvals", help="State-changing calls wait for an approver, who decides by a seeded rule."
    ),
    mode: str = typer.Option("random_chunks", "--mode", help="Replay mode: one_call, batch or random_chunks."),
    provider: str = typer.Option(
        "replay", "--provider", help="replay (the replay model in process) or openai (OpenAIChat, issue 19)."
    ),
    base_url: str | None = typer.Option(
        None, "--base-url", help="With --provider openai: the endpoint (default: a local replay-model server)."
    ),
    model: str = typer.Option(
        "bfcl-replay-openai", "--model", help="With --provider openai: the model name (key: SETTLED_MODEL_API_KEY)."
    ),
    kills: int | None = typer.Option(None, "--kills", min=0, help="Worker kills under --chaos (default: N/8, >= 3)."),
    in_flight: int | None = typer.Option(
        None, "--in-flight", min=1, help="Conversations driven at once (default: 32, 12 under --chaos)."
    ),
    timeout_s: float = typer.Option(1800.0, "--timeout-s", help="Bound on the whole run, in seconds."),
) -> None:
    """Run BFCL multi-turn conversations through workers, a projector and the tool server; print the verdict."""
    try:
        replay_mode = ReplayMode(mode)
    except ValueError as exc:
        _console.print(f"[red]--mode {mode!r}: expected one of {', '.join(m.value for m in ReplayMode)}[/red]")
        raise typer.Exit(2) from exc
    try:
        options = DemoOptions(
            category=category,
            conversations=conversations,
            chaos=chaos,
            seed=seed,
            workers=workers,
            dedup=not no_dedup,
            no_idempotency=frozenset(part.strip() for part in no_idempotency.split(",") if part.strip()),
            adversarial=adversarial,
            approvals=approvals,
            provider=provider,
            base_url=base_url,
            model_name=model,
            mode=replay_mode,
            kills=kills,
            in_flight=in_flight,
            timeout_s=timeout_s,
        )
    except DemoError as exc:
        _console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    _run_bfcl(options)


def main(args: Sequence[str], prog_name: str = "settled demo bfcl") -> int:
    """Run ``settled demo bfcl`` with ``args`` (the ``settled.demo`` entry point's callable).

    Args:
        args: The command-line arguments after ``bfcl`` (empty: the whole base set, no chaos).
        prog_name: The command's name in help and usage messages.

    Returns:
        The exit code: 0 when every conversation passed, 1 when one did not, 2 on bad options.
    """
    cli = typer.Typer(add_completion=False)
    cli.command()(bfcl)
    command = typer.main.get_command(cli)
    try:
        command.main(args=list(args), prog_name=prog_name, standalone_mode=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0
