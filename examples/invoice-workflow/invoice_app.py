"""The seed's invoice workflow on settled: extract → validate → save → notify (``README.md`` beside this file).

The outside world is a SQLite file (path in ``INVOICE_EXAMPLE_DB``): ``invoices`` (the "database" the save step
writes, keyed by the task id so a save that runs again after a crash writes one row), ``emails`` (what the notify step
"sends") and ``step_runs`` (every execution of a step body, so ``run.py`` can show what ran how often).
"""

from __future__ import annotations

import os
import sqlite3
from datetime import timedelta
from typing import Any

from settled.runtime import App, Step, StepContext, Workflow

#: The environment variable naming the SQLite file of the outside world.
DB_ENV = "INVOICE_EXAMPLE_DB"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS invoices (task_id TEXT PRIMARY KEY, vendor TEXT, total_cents INTEGER)",
    "CREATE TABLE IF NOT EXISTS emails (task_id TEXT, recipient TEXT, subject TEXT)",
    "CREATE TABLE IF NOT EXISTS step_runs (task_id TEXT, step TEXT, attempt INTEGER)",
)


def world(path: str | None = None) -> sqlite3.Connection:
    """Open the outside world's SQLite file (created with its tables when missing).

    Args:
        path: The file (default: ``$INVOICE_EXAMPLE_DB``).

    Returns:
        An autocommit connection.
    """
    db = sqlite3.connect(path or os.environ[DB_ENV], timeout=30, isolation_level=None)
    for statement in _SCHEMA:
        db.execute(statement)
    return db


def _ran(ctx: StepContext) -> None:
    with world() as db:
        db.execute("INSERT INTO step_runs VALUES (?, ?, ?)", (ctx.task_id, ctx.step, ctx.get_state().attempt))


async def extract(ctx: StepContext) -> dict[str, Any]:
    """Read the invoice (the "PDF" is the run's input: vendor, lines of cents)."""
    _ran(ctx)
    ctx.log("Extracting invoice data...")
    document = ctx.input
    total = sum(int(line["cents"]) for line in document["lines"])
    await ctx.checkpoint({"lines": len(document["lines"])})  # canonical once it returns
    return {"vendor": document["vendor"], "total_cents": total, "recipient": document["recipient"]}


def validate(ctx: StepContext) -> dict[str, Any]:
    """Check what ``extract`` read; a failure is retried (``max_retries``), then fails the run."""
    _ran(ctx)
    invoice = ctx.previous["extract"]
    if not invoice["vendor"] or invoice["total_cents"] <= 0:
        raise ValueError(f"Invalid invoice: {invoice}")
    return {"valid": True}


def save(ctx: StepContext) -> dict[str, Any]:
    """Write the invoice to the database, keyed by the task id (a body may run again after a crash)."""
    _ran(ctx)
    invoice = ctx.previous["extract"]
    with world() as db:
        db.execute(
            "INSERT OR IGNORE INTO invoices VALUES (?, ?, ?)", (ctx.task_id, invoice["vendor"], invoice["total_cents"])
        )
    return {"saved": True, "id": f"inv_{ctx.task_id}"}


def notify(ctx: StepContext) -> dict[str, Any]:
    """Send the e-mail saying the invoice was processed."""
    _ran(ctx)
    with world() as db:
        db.execute(
            "INSERT INTO emails VALUES (?, ?, ?)",
            (ctx.task_id, "finance@company.com", f"Invoice {ctx.previous['save']['id']} processed"),
        )
    return {"notified": True}


invoice = Workflow(
    "process-invoice",
    steps=[
        Step("extract", extract, description="Extract the invoice data"),
        Step("validate", validate, description="Validate the data"),
        Step("save", save, description="Save to the database"),
        Step("notify", notify, description="Notify finance"),
    ],
    max_retries=3,
    step_timeout=timedelta(seconds=60),
)

app = App(agent=None)
app.workflow(invoice)
