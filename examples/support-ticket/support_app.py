"""The seed's support-e-mail workflow on settled: parse → classify (a model) → create a ticket → reply (approved).

The model is settled's `ScriptedProvider` answering like a classifier would (offline, deterministic); the outside
world is a SQLite file (path in ``SUPPORT_EXAMPLE_DB``): ``tickets`` (a ticket system that gives every call a new
ticket: it does not deduplicate, so a ticket created twice would show), ``replies`` (the auto-replies sent) and
``step_runs`` (every execution of a step body). The ``reply`` step requires approval: ``on_approval_needed`` (the
reply policy) approves it; without it, or when it returns None, the run waits for a person (``settled approve``).
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from typing import Any

from settled.runtime import (
    App,
    Message,
    ModelRequest,
    ModelResponse,
    ScriptedProvider,
    Step,
    StepContext,
    Workflow,
)

#: The environment variable naming the SQLite file of the outside world.
DB_ENV = "SUPPORT_EXAMPLE_DB"

#: The mailbox the parse step fetches from, by e-mail id.
MAILBOX: dict[str, dict[str, str]] = {
    "e-1": {
        "from": "dana@example.com",
        "subject": "Charged twice for invoice 7",
        "body": "Hi, my card was charged twice for invoice 7. Can you refund one charge?",
    },
    "e-2": {
        "from": "lee@example.com",
        "subject": "Data request",
        "body": "Under GDPR I ask for my data; legal please.",
    },
}

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS tickets (ticket_id TEXT PRIMARY KEY, title TEXT, category TEXT, priority TEXT)",
    "CREATE TABLE IF NOT EXISTS replies (recipient TEXT, body TEXT)",
    "CREATE TABLE IF NOT EXISTS step_runs (task_id TEXT, step TEXT, attempt INTEGER)",
)


def world(path: str | None = None) -> sqlite3.Connection:
    """Open the outside world's SQLite file (created with its tables when missing).

    Args:
        path: The file (default: ``$SUPPORT_EXAMPLE_DB``).

    Returns:
        An autocommit connection.
    """
    db = sqlite3.connect(path or os.environ[DB_ENV], timeout=30, isolation_level=None)
    for statement in _SCHEMA:
        db.execute(statement)
    return db


def _classify(request: ModelRequest) -> list[Any]:
    """The scripted model: a category for the e-mail in the prompt."""
    text = request.messages[-1].text.lower()
    category = "legal" if "gdpr" in text or "legal" in text else "billing" if "charge" in text else "general"
    return [ModelResponse(text=category, model="scripted-classifier")]


model = ScriptedProvider(_classify)


def _ran(ctx: StepContext) -> None:
    with world() as db:
        db.execute("INSERT INTO step_runs VALUES (?, ?, ?)", (ctx.task_id, ctx.step, ctx.get_state().attempt))


def parse_email(ctx: StepContext) -> dict[str, str]:
    """Fetch the e-mail named by the run's input."""
    _ran(ctx)
    email = MAILBOX[ctx.input["email_id"]]
    return {"from": email["from"], "subject": email["subject"], "body": email["body"]}


async def classify(ctx: StepContext) -> dict[str, str]:
    """Ask the model for a category; its answer is recorded once as this step's result."""
    _ran(ctx)
    request = ModelRequest(
        operation_id=f"{ctx.run_id}:classify",
        model="scripted-classifier",
        messages=(
            Message("system", "Answer with one word: billing, legal or general."),
            Message("user", f"Classify this email: {ctx.previous['parse-email']['body']}"),
        ),
    )
    category = ""
    async for event in model.stream(request):
        if isinstance(event, ModelResponse):
            category = event.text.strip()
    return {"category": category, "priority": "medium"}


def create_ticket(ctx: StepContext) -> dict[str, str]:
    """Open a ticket (the ticket system gives each call a new id: it must not be called twice)."""
    _ran(ctx)
    ticket_id = f"T-{uuid.uuid4().hex[:6]}"
    with world() as db:
        db.execute(
            "INSERT INTO tickets VALUES (?, ?, ?, ?)",
            (
                ticket_id,
                ctx.previous["parse-email"]["subject"],
                ctx.previous["classify"]["category"],
                ctx.previous["classify"]["priority"],
            ),
        )
    return {"ticketId": ticket_id}


def reply(ctx: StepContext) -> dict[str, bool]:
    """Send the auto-reply (runs only once approved)."""
    _ran(ctx)
    with world() as db:
        db.execute(
            "INSERT INTO replies VALUES (?, ?)",
            (
                ctx.previous["parse-email"]["from"],
                f"We received your request. Ticket #{ctx.previous['create-ticket']['ticketId']}",
            ),
        )
    return {"replied": True}


def on_approval_needed(step: Step) -> bool | None:
    """The reply policy: auto-replies are approved; return None instead to leave a step to a person."""
    print(f"Approval needed: {step.description}", flush=True)
    return True


support_workflow = Workflow(
    "process-support-email",
    steps=[
        Step("parse-email", parse_email, description="Fetch and parse the e-mail"),
        Step("classify", classify, description="Classify it with the model"),
        Step("create-ticket", create_ticket, description="Open a ticket"),
        Step("reply", reply, description="Send auto-reply to customer", requires_approval=True),
    ],
    on_approval_needed=on_approval_needed,
)

app = App(agent=None)
app.workflow(support_workflow)
