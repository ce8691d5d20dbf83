"""``settled runs|unknown|submissions|conversations``: read the Postgres projection (issue 7 item 5; docs/design.md §6).

* ``settled runs list [--incomplete] [--conversation C]`` and ``settled runs show SUBMISSION_ID [--conversation C]``
  (attempts, calls);
* ``settled unknown list``: the calls in doubt an operator must resolve, with their age (DUR-009);
  ``settled unknown resolve`` and ``settled unknown keygen`` (in `settled.services._cli_client`: they talk to Kafka,
  not to the projection) resolve one with a signed ``ResolveUnknown`` and make the resolver's key;
* ``settled submissions show SUBMISSION_ID [--conversation C]``: the ledger row of every conversation using the id
  (ids are unique per conversation, not per namespace), or of one;
* ``settled conversations show CONVERSATION_ID``: run state and the transcript in event order (requests to wait,
  signals, approval decisions with who decided, approved or denied, and why);
* ``settled approvals list [--all] [--conversation C] [--submission S]``: the approvals runs wait for, with the tool
  call and its arguments, title, description, when asked and the deadline, and the argument digest ``settled
  approve|deny`` must name (issue 16 item 7).

Every command takes ``--after RECEIPT_JSON`` (the receipt line ``settled submit`` prints) and waits, up to
``--after-timeout-s``, until the projection holds that receipt's request: read-your-writes (docs/design.md §4). Output
is a table, or JSON lines with ``--json``. Exit codes: 1 not found, 2 bad input (an id that breaks settled's input
contract, e.g. one that is not valid UTF-8; named on stderr) or no PostgreSQL (unreachable within
`CONNECT_TIMEOUT_S`), 3 the receipt was not projected in time. None of them prints a traceback.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import psycopg
import typer
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolTimeout
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from settled import protocol
from settled.projections import ProjectionReader, ReadYourWritesTimeoutError
from settled.schemas import Receipt
from settled.services._cli_client import keygen, pause_run, resolve_unknown, resume_run
from settled.services._cli_projections import SCHEMA_ENV_VAR, projection_names, projection_settings

__all__ = [
    "CONNECT_TIMEOUT_S",
    "EXIT_BAD_INPUT",
    "EXIT_NOT_FOUND",
    "EXIT_NOT_PROJECTED",
    "approvals_app",
    "conversations_app",
    "runs_app",
    "submissions_app",
    "unknown_app",
]

EXIT_NOT_FOUND = 1
"""Exit code: nothing projected under that id."""
EXIT_NOT_PROJECTED = 3
"""Exit code: ``--after``'s receipt was not projected in time."""
EXIT_BAD_INPUT = 2
"""Exit code: bad input (an invalid id, a malformed ``--after``), no projection, or PostgreSQL unreachable."""
CONNECT_TIMEOUT_S = 5.0
"""Longest wait for a PostgreSQL connection before a read command exits `EXIT_BAD_INPUT`, in seconds."""

runs_app = typer.Typer(no_args_is_help=True, help="Runs (one per submission) as the projection shows them.")
unknown_app = typer.Typer(no_args_is_help=True, help="Calls in doubt an operator must resolve (DUR-009).")
submissions_app = typer.Typer(no_args_is_help=True, help="The submissions ledger.")
conversations_app = typer.Typer(no_args_is_help=True, help="Conversations: run state and transcript.")
approvals_app = typer.Typer(no_args_is_help=True, help="Approvals runs wait for (decide them with approve|deny).")

_SCHEMA = typer.Option(None, "--schema", envvar=SCHEMA_ENV_VAR, help="Projection schema (default: the namespace).")
_AFTER = typer.Option(
    None,
    "--after",
    metavar="RECEIPT_JSON",
    help="Wait until the projection holds this receipt (as `settled submit` prints it): read-your-writes.",
)
_AFTER_TIMEOUT = typer.Option(10.0, "--after-timeout-s", help="Longest wait for --after, in seconds.")
_JSON = typer.Option(False, "--json", help="Print JSON lines instead of a table.")


def _fail(code: int, message: str) -> NoReturn:
    sys.stderr.write(f"settled: {message}\n")
    raise typer.Exit(code)


def _receipt(text: str | None) -> Receipt | None:
    if text is None:
        return None
    try:
        return Receipt.model_validate_json(text)
    except ValidationError as exc:
        fields = ", ".join(".".join(str(p) for p in err["loc"]) or "<root>" for err in exc.errors())
        _fail(EXIT_BAD_INPUT, f"--after is not a receipt (fields {fields}): {exc.errors()[0]['msg']}")


def _reader(schema: str | None) -> ProjectionReader:
    # The pool logs each failed connection attempt; the command reports the failure once, on stderr (`_query`).
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    settings = projection_settings()
    return ProjectionReader(
        settings.postgres_dsn, projection_names(settings, schema), connect_timeout_s=CONNECT_TIMEOUT_S
    )


def _id(argument: str, value: str | None) -> None:
    """Exit `EXIT_BAD_INPUT` naming ``argument`` when ``value`` breaks the input contract's id rules.

    No id that breaks them is ever admitted, so nothing is projected under it; an argument that is not valid UTF-8
    arrives as lone surrogates (Python's ``surrogateescape``) and is refused here instead of failing in the driver.
    """
    violation = None if value is None else protocol.check_id(argument, value)
    if violation is not None:
        hint = " (not valid UTF-8?)" if "surrogate" in violation.rule else ""
        _fail(EXIT_BAD_INPUT, f"{violation.detail}{hint}: not a valid id (docs/architecture.md, input contract)")


def _why_unreachable(dsn: str, exc: Exception) -> str:
    """The driver's reason a connection failed: ``exc``'s, or for a pool timeout one direct attempt's (at most 2 s)."""
    if not isinstance(exc, PoolTimeout):
        return str(exc).strip()
    try:
        psycopg.connect(dsn, connect_timeout=2).close()
    except psycopg.Error as direct:
        return str(direct).strip().splitlines()[0]
    return str(exc)


def _where(dsn: str) -> str:
    """``host:port/dbname`` of a DSN, without its password."""
    try:
        parts = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError:
        return "the configured DSN"
    return f"{parts.get('host', 'localhost')}:{parts.get('port', 5432)}/{parts.get('dbname', '')}"


def _dump(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        sys.stdout.write(json.dumps(row, default=str, sort_keys=True) + "\n")
    sys.stdout.flush()


def _table(title: str, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else _short(row[c]) for c in columns))
    Console().print(table)


def _record(title: str, row: dict[str, Any]) -> None:
    table = Table(title=title, show_header=False)
    for key, value in row.items():
        table.add_row(key, "" if value is None else _short(value, 120))
    Console().print(table)


def _short(value: Any, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_T = TypeVar("_T")


def _query(
    schema: str | None,
    after: str | None,
    after_timeout_s: float,
    query: Callable[[ProjectionReader, Receipt | None, float], _T],
) -> _T:
    """Run ``query(reader, receipt, timeout_s)`` on a fresh reader; a receipt not projected in time exits 3."""
    receipt = _receipt(after)
    with _reader(schema) as reader:
        try:
            return query(reader, receipt, after_timeout_s)
        except ReadYourWritesTimeoutError as exc:
            _fail(EXIT_NOT_PROJECTED, str(exc))
        except pg_errors.UndefinedTable as exc:
            _fail(
                EXIT_BAD_INPUT,
                f"no projection in schema {reader.names.live!r} ({exc.diag.message_primary}): "
                "start the projector (`settled projections run`) or pass --schema",
            )
        except (PoolTimeout, psycopg.OperationalError) as exc:
            _fail(
                EXIT_BAD_INPUT,
                f"PostgreSQL at {_where(reader.dsn)} did not answer within {CONNECT_TIMEOUT_S} s "
                f"({_why_unreachable(reader.dsn, exc)}): check SETTLED_POSTGRES_DSN, or start the local stack with "
                "`settled dev up`",
            )


def _found(row: _T | None, what: str) -> _T:
    if row is None:
        _fail(EXIT_NOT_FOUND, f"no {what} in the projection")
    return row


@runs_app.command("list")
def runs_list(
    incomplete: bool = typer.Option(False, "--incomplete", help="Only runs not settled yet."),
    conversation: str | None = typer.Option(None, "--conversation", help="Only this conversation's runs."),
    limit: int = typer.Option(50, "--limit", min=1, help="Most runs shown (newest admissions first)."),
    schema: str | None = _SCHEMA,
    after: str | None = _AFTER,
    after_timeout_s: float = _AFTER_TIMEOUT,
    as_json: bool = _JSON,
) -> None:
    """List runs: status (queued, running, waiting, recovery, terminalizing, or the outcome), what it waits for.

    A waiting run shows its kind (approval, signal or unknown), name, since and deadline. A workflow run also shows
    its workflow, task id, the step it is at of how many, and what it waits for (pause, approval, retry, ...).
    """
    _id("--conversation", conversation)
    rows = _query(
        schema,
        after,
        after_timeout_s,
        lambda reader, receipt, timeout_s: reader.runs(
            incomplete=incomplete,
            conversation_id=conversation,
            limit=limit,
            after=receipt,
            timeout_s=timeout_s,
            workflows=True,
        ),
    )
    if as_json:
        _dump(rows)
        return
    for row in rows:  # the step a workflow run is at, of how many: "2/4 validate"
        if row.get("total_steps") is not None:
            at = f"{row['step_number']}/{row['total_steps']}" if row.get("step_number") is not None else "-"
            row["step"] = f"{at} {row['step_name'] or ''}".strip()
    _table(
        f"runs ({'incomplete' if incomplete else 'all'})",
        rows,
        ("submission_id", "conversation_id", "submission_seq", "status", "state", "attempt_count", "workflow",
         "task_id", "step", "waits_for", "waiting_kind", "waiting_name", "waiting_since", "waiting_deadline",
         "current_step", "outcome", "admitted_at"),
    )  # fmt: skip


runs_app.command("pause")(pause_run)
runs_app.command("resume")(resume_run)

_CONVERSATION = typer.Option(
    None, "--conversation", help="Only this conversation's (a submission id is unique per conversation)."
)


@runs_app.command("show")
def runs_show(
    submission_id: str = typer.Argument(..., metavar="SUBMISSION_ID"),
    conversation: str | None = _CONVERSATION,
    schema: str | None = _SCHEMA,
    after: str | None = _AFTER,
    after_timeout_s: float = _AFTER_TIMEOUT,
    as_json: bool = _JSON,
) -> None:
    """Show the run of a submission id in every conversation using it, with attempts and tool calls."""
    _id("SUBMISSION_ID", submission_id)
    _id("--conversation", conversation)
    runs = _query(
        schema,
        after,
        after_timeout_s,
        lambda r, receipt, t: r.runs_of(submission_id, conversation_id=conversation, after=receipt, timeout_s=t),
    )
    _found(runs or None, f"run {submission_id!r}")
    if as_json:
        _dump(runs)
        return
    for run in runs:
        attempts, calls = run.pop("attempts"), run.pop("tool_calls")
        _record(f"run {submission_id} of conversation {run['conversation_id']}", run)
        _table("attempts", attempts, ("attempt", "attempt_id", "status", "waiting_kind", "waiting_name",
                                      "waiting_since", "waiting_deadline", "current_step", "end_reason",
                                      "started_at", "ended_at"))  # fmt: skip
        _table("tool calls", calls, ("call_id", "tool", "status", "idempotency_key", "prepared_at", "ended_at",
                                     "duration_ms", "error_type", "reason"))  # fmt: skip


@unknown_app.command("list")
def unknown_list(
    schema: str | None = _SCHEMA,
    after: str | None = _AFTER,
    after_timeout_s: float = _AFTER_TIMEOUT,
    as_json: bool = _JSON,
) -> None:
    """List the calls in doubt (Unknown), oldest first, with their age."""
    rows = _query(
        schema, after, after_timeout_s, lambda r, receipt, t: r.unknown_obligations(after=receipt, timeout_s=t)
    )
    if as_json:
        _dump(rows)
        return
    _table(
        f"unknown obligations: {len(rows)}",
        rows,
        ("conversation_id", "submission_id", "call_id", "tool", "idempotency_key", "submission_state", "reason",
         "unknown_since", "age"),
    )  # fmt: skip


unknown_app.command("resolve")(resolve_unknown)
unknown_app.command("keygen")(keygen)


@submissions_app.command("show")
def submissions_show(
    submission_id: str = typer.Argument(..., metavar="SUBMISSION_ID"),
    conversation: str | None = _CONVERSATION,
    schema: str | None = _SCHEMA,
    after: str | None = _AFTER,
    after_timeout_s: float = _AFTER_TIMEOUT,
    as_json: bool = _JSON,
) -> None:
    """Show the ledger row of a submission id in every conversation using it (a duplicate's id: its receipt)."""
    _id("SUBMISSION_ID", submission_id)
    _id("--conversation", conversation)
    rows = _query(
        schema,
        after,
        after_timeout_s,
        lambda r, receipt, t: (
            r.submissions(submission_id, conversation_id=conversation, after=receipt, timeout_s=t)
            or r.receipts(submission_id, conversation_id=conversation)
        ),
    )
    _found(rows or None, f"submission {submission_id!r}")
    if as_json:
        _dump(rows)
        return
    for row in rows:
        _record(f"submission {submission_id} of conversation {row['conversation_id']}", row)


@conversations_app.command("show")
def conversations_show(
    conversation_id: str = typer.Argument(..., metavar="CONVERSATION_ID"),
    schema: str | None = _SCHEMA,
    after: str | None = _AFTER,
    after_timeout_s: float = _AFTER_TIMEOUT,
    as_json: bool = _JSON,
) -> None:
    """Show a conversation's run state and its transcript (inputs, replies, tool calls and results)."""
    _id("CONVERSATION_ID", conversation_id)
    conv = _found(
        _query(
            schema,
            after,
            after_timeout_s,
            lambda r, receipt, t: r.conversation(conversation_id, after=receipt, timeout_s=t),
        ),
        f"conversation {conversation_id!r}",
    )
    if as_json:
        _dump([conv])
        return
    transcript = conv.pop("transcript")
    _record(f"conversation {conversation_id}", conv)
    _table("transcript", transcript, ("event_seq", "submission_id", "kind", "role", "name", "content", "recorded_at"))


@approvals_app.command("list")
def approvals_list(
    show_all: bool = typer.Option(False, "--all", help="Every approval, decided ones too (default: pending only)."),
    conversation: str | None = typer.Option(None, "--conversation", help="Only this conversation's approvals."),
    submission: str | None = typer.Option(None, "--submission", help="Only this run's (its submission id)."),
    limit: int = typer.Option(50, "--limit", min=1, help="Most approvals shown (oldest request first)."),
    schema: str | None = _SCHEMA,
    after: str | None = _AFTER,
    after_timeout_s: float = _AFTER_TIMEOUT,
    as_json: bool = _JSON,
) -> None:
    """List the approvals runs wait for: the tool call and its arguments, title, description, asked at, deadline."""
    _id("--conversation", conversation)
    _id("--submission", submission)
    rows = _query(
        schema,
        after,
        after_timeout_s,
        lambda reader, receipt, timeout_s: reader.approvals(
            pending=not show_all, conversation_id=conversation, submission_id=submission, limit=limit,
            after=receipt, timeout_s=timeout_s,
        ),
    )  # fmt: skip
    if as_json:
        _dump(rows)
        return
    _table(
        f"approvals ({'all' if show_all else 'pending'}): {len(rows)}",
        rows,
        ("conversation_id", "submission_id", "approval_id", "status", "tool", "args_json", "title", "description",
         "requested_at", "deadline", "args_digest", "decided_by", "reason"),
    )  # fmt: skip
