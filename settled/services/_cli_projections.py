"""``settled projections run|rebuild|check``: the Postgres projections of the log (issue 7; docs/design.md §6).

* ``run`` projects ``<namespace>.log`` into the live schema until SIGTERM/SIGINT; JSON-lines logs on stderr.
* ``rebuild`` replays the log from offset 0 into a new schema version with a progress bar (events/s, ETA), catches up
  to the live position and switches atomically.
* ``check`` compares live, a fresh rebuild and the reference fold at identical offsets; exit code 1 on any difference,
  else 4 while the projection has quarantined records (rows PostgreSQL refused: listed, and left out of the
  comparison), else 0.
* Either exits with code 3 when another rebuild or check of the same projection is running (`RebuildInProgressError`, a
  conflict: `settled.EXIT_CODES`).

Settings come from the environment (``SETTLED_NAMESPACE``, ``SETTLED_KAFKA_BOOTSTRAP``, ``SETTLED_POSTGRES_DSN``);
without them the running dev stack's broker and PostgreSQL are used. The projection schema defaults to the namespace
(``--schema`` or ``SETTLED_PROJECTION_SCHEMA`` to change it).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from settled._metrics import serve_metrics
from settled._settings import Settings
from settled.projections import (
    ProjectionMetrics,
    ProjectionNames,
    Projector,
    ProjectorConfig,
    RebuildProgress,
    check,
    default_schema,
    rebuild,
)
from settled.services._cli_root import command, configure_logging, exits_on_error, resolve_settings

__all__ = ["SCHEMA_ENV_VAR", "projection_names", "projection_settings", "projections_app"]

SCHEMA_ENV_VAR = "SETTLED_PROJECTION_SCHEMA"

EXIT_QUARANTINED = 4
"""Exit code of ``settled projections check``: everything else agrees, but records are quarantined (listed)."""

projections_app = typer.Typer(
    no_args_is_help=True, help="Postgres projections of the log: run the projector, rebuild, check."
)

_SCHEMA_HELP = "Projection schema (default: the namespace, e.g. 'settled')."


def projection_settings() -> Settings:
    """Return the environment's settings with Kafka and PostgreSQL resolved (`resolve_settings`).

    Returns:
        ``Settings()``; an empty ``SETTLED_KAFKA_BOOTSTRAP`` / ``SETTLED_POSTGRES_DSN`` means the running dev stack's.

    Raises:
        typer.Exit: No broker or no PostgreSQL is configured and the dev stack's is not running (exit code 2).
    """
    with exits_on_error():
        return resolve_settings(kafka=True, postgres=True)
    raise AssertionError("unreachable")  # pragma: no cover - exits_on_error re-raises as typer.Exit


def projection_names(settings: Settings, schema: str | None) -> ProjectionNames:
    """Return the projection's schema names.

    Args:
        settings: The namespace.
        schema: ``--schema`` (None: derived from the namespace).

    Returns:
        The names.

    Raises:
        typer.Exit: The schema name is invalid (exit code 2).
    """
    try:
        return ProjectionNames(schema if schema else default_schema(settings.namespace))
    except ValueError as exc:
        Console(stderr=True).print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc


def _parse_partitions(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        return tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError as exc:
        Console(stderr=True).print(f"[red]--partitions {text!r}: expected comma-separated partition numbers[/red]")
        raise typer.Exit(2) from exc


@projections_app.command("run")
def run_command(
    schema: str | None = typer.Option(None, "--schema", envvar=SCHEMA_ENV_VAR, help=_SCHEMA_HELP),
    partitions: str | None = typer.Option(None, "--partitions", help="Only these log partitions, e.g. '0,3'."),
    advisory_lock: bool = typer.Option(
        True,
        "--advisory-lock/--no-advisory-lock",
        help="One writer per partition (pg_try_advisory_lock). Without it, concurrent projectors rely on the offset "
        "row's lock and the expected-offset check alone.",
    ),
    max_records: int = typer.Option(1000, "--max-records", min=1, help="Records consumed per poll."),
) -> None:
    """Project the log into the live schema until SIGTERM or SIGINT (one transaction per partition chunk)."""
    settings = projection_settings()
    names = projection_names(settings, schema)
    configure_logging("INFO")
    log = logging.getLogger("settled.projections")
    metrics = None
    if settings.metrics_port is not None:
        metrics = ProjectionMetrics(dsn=settings.postgres_dsn, schema=names.live)
        served = serve_metrics(metrics.registry, settings.metrics_host, settings.metrics_port)
        log.info("metrics served", extra={"url": f"http://{settings.metrics_host}:{served.port}/metrics"})
    projector = Projector(
        settings,
        ProjectorConfig(
            names=names, partitions=_parse_partitions(partitions), advisory_lock=advisory_lock, max_records=max_records
        ),
        metrics=metrics,
    )

    def _stop(signum: int, frame: FrameType | None) -> None:
        projector.stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    log.info("projector starting", extra={"schema": names.live, "topic": settings.topic("log")})
    try:
        projector.run()
    except Exception as exc:  # the process ends here: log it as one JSON line, then exit non-zero
        log.exception("projector halted", extra={"error": repr(exc)})
        raise typer.Exit(1) from exc


@projections_app.command("rebuild")
@command
def rebuild_command(
    schema: str | None = typer.Option(None, "--schema", envvar=SCHEMA_ENV_VAR, help=_SCHEMA_HELP),
    keep_retired: bool = typer.Option(
        True, "--keep-retired/--drop-retired", help="Keep the replaced version as <schema>__retired."
    ),
    timeout_s: float = typer.Option(3600.0, "--timeout-s", help="Bound on the whole rebuild, in seconds."),
) -> None:
    """Replay the log from offset 0 into a new version, catch up to the live position, switch atomically."""
    settings = projection_settings()
    names = projection_names(settings, schema)
    with _maintenance(f"rebuilding {names.live}") as report:
        result = rebuild(settings, names, progress=report, keep_retired=keep_retired, timeout_s=timeout_s)
    Console().print(
        f"switched {result.schema} to generation {result.generation}: {result.batches} batches, {result.events} events "
        f"in {result.elapsed_s:.1f} s ({result.events / max(result.elapsed_s, 1e-9):,.0f} events/s), offsets "
        f"{result.offsets}, {result.switch_attempts} switch attempt(s)"
    )


@projections_app.command("check")
@command
def check_command(
    schema: str | None = typer.Option(None, "--schema", envvar=SCHEMA_ENV_VAR, help=_SCHEMA_HELP),
    keep_scratch: bool = typer.Option(False, "--keep-scratch", help="Keep the fresh rebuild in <schema>__check."),
    show: int = typer.Option(50, "--show", min=1, help="Print at most this many differences."),
    timeout_s: float = typer.Option(3600.0, "--timeout-s", help="Bound on the whole check, in seconds."),
) -> None:
    """Compare live, a fresh rebuild and the reference fold at identical offsets; exit 1 on a difference.

    Quarantined records (rows PostgreSQL refused) are left out of the comparison and listed; exit 4 while any exist.
    """
    settings = projection_settings()
    names = projection_names(settings, schema)
    with _maintenance(f"rebuilding {names.scratch}") as report:
        report_ = check(settings, names, progress=report, keep_scratch=keep_scratch, timeout_s=timeout_s)
    out = Console()
    out.print(f"compared at offsets {report_.offsets}; rows (live): {report_.rows}")
    if report_.quarantined:
        quarantine = Table(title=f"{len(report_.quarantined)} quarantined record(s), left out of the comparison")
        for column in ("(partition, offset)", "event types", "sqlstate", "error"):
            quarantine.add_column(column)
        for q in report_.quarantined[:show]:
            quarantine.add_row(f"({q.partition}, {q.log_offset})", q.event_types, q.sqlstate or "", q.error)
        out.print(quarantine)
    if report_.ok:
        out.print("[green]live, rebuild and reference fold agree[/green]")
        if report_.quarantined:
            raise typer.Exit(EXIT_QUARANTINED)
        return
    table = Table(title=f"{len(report_.differences)} difference(s)")
    for column in ("table", "key", "column", "live", "rebuild", "reference"):
        table.add_column(column)
    for d in report_.differences[:show]:
        table.add_row(d.table, repr(d.key), d.column, repr(d.live), repr(d.rebuild), repr(d.reference))
    out.print(table)
    raise typer.Exit(1)


@contextmanager
def _maintenance(description: str) -> Iterator[Callable[[RebuildProgress], None]]:
    """Show a rebuild's or check's progress bar on stderr while the block runs; yields its progress callback.

    Raises:
        RebuildInProgressError: Another rebuild or check of the projection is running (exit code 3).
    """
    console = Console(stderr=True)
    with _progress(console) as bar:
        task = bar.add_task(description, total=None, eps=0.0, events=0)

        def report(p: RebuildProgress) -> None:
            bar.update(task, completed=p.done_offsets, total=p.total_offsets, eps=p.events_per_s, events=p.events)

        yield report  # a RebuildInProgressError (a conflict) ends the command with exit code 3 through `command`


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("offsets"),
        TextColumn("{task.fields[events]:,} events"),
        TextColumn("{task.fields[eps]:,.0f} events/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )
