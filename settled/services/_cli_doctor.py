"""``settled doctor``: one command that says whether a deployment is healthy, check by check (issue 21 item 3).

The checks and what each looks at are in `settled.services._doctor`. The command prints one line per check (name,
ok/failed/skipped, what it saw) and exits 1 when any check failed, 0 otherwise, so a script or a readiness probe can
run it.
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

from settled.runtime import load_app
from settled.services._cli_root import command, resolve_settings
from settled.services._doctor import CHECK_NAMES, CheckStatus, DoctorOptions, run_checks

__all__ = ["doctor"]

_STYLE = {CheckStatus.OK: "green", CheckStatus.FAILED: "red", CheckStatus.SKIPPED: "yellow"}


_APP_OPTION = typer.Option(None, "--app", help="The workers' app, 'package.module:attribute': checks its resolver key.")
_POSTGRES_OPTION = typer.Option(True, "--postgres/--no-postgres", help="Check the projection schema.")
_SCHEMA_OPTION = typer.Option(None, "--schema", help="The projection schema (default: the namespace's).")
_ONLY_OPTION = typer.Option([], "--only", help="Run only this check (repeatable), of " + ", ".join(CHECK_NAMES) + ".")
_TIMEOUT_OPTION = typer.Option(10.0, "--timeout-s", help="Bound on each Kafka or PostgreSQL call, in seconds.")
_UNKNOWN_OPTION = typer.Option(900.0, "--overdue-unknown-s", help="An open Unknown older than this is overdue, in s.")
_APPROVAL_OPTION = typer.Option(86_400.0, "--overdue-approval-s", help="A pending approval older than this, in s.")
_SUBMISSION_OPTION = typer.Option(3_600.0, "--overdue-submission-s", help="An unsettled submission older, in s.")
_SKEW_OPTION = typer.Option(1.0, "--max-clock-skew-s", help="Largest accepted clock difference to the broker, in s.")


@command
def doctor(
    app: str | None = _APP_OPTION,
    postgres: bool = _POSTGRES_OPTION,
    schema: str | None = _SCHEMA_OPTION,
    only: list[str] = _ONLY_OPTION,
    timeout_s: float = _TIMEOUT_OPTION,
    max_clock_skew_s: float = _SKEW_OPTION,
    overdue_unknown_s: float = _UNKNOWN_OPTION,
    overdue_approval_s: float = _APPROVAL_OPTION,
    overdue_submission_s: float = _SUBMISSION_OPTION,
) -> None:
    """Check the deployment: broker, topics, projection schema, transactional settings, resolver key, clock, overdue.

    Exit code 1 naming each failed check; 0 when none failed (skipped checks do not fail).
    """
    settings = resolve_settings(postgres=postgres)
    options = DoctorOptions(
        timeout_s=timeout_s,
        max_clock_skew_s=max_clock_skew_s,
        app=load_app(app) if app else None,
        postgres=postgres,
        projection_schema=schema,
        overdue_after_s={
            "unknown": overdue_unknown_s,
            "approval": overdue_approval_s,
            "submission": overdue_submission_s,
        },
    )
    try:
        results = run_checks(settings, options, only)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--only") from exc
    table = Table(title=f"settled doctor (namespace {settings.namespace!r})")
    for column in ("check", "status", "detail"):
        table.add_column(column)
    for result in results:
        style = _STYLE[result.status]
        table.add_row(result.name, f"[{style}]{result.status.value}[/{style}]", result.detail)
    Console().print(table)
    failed = [r.name for r in results if r.status is CheckStatus.FAILED]
    if failed:
        Console(stderr=True).print(f"[red]settled doctor: failed checks: {', '.join(failed)}[/red]")
        raise typer.Exit(1)
