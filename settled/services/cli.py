"""The ``settled`` command line (typer). Each command group lives in its own private module."""

from __future__ import annotations

import typer

from settled.services._cli_api import api_command, tokens_app
from settled.services._cli_client import (
    abort,
    access_app,
    approve,
    deny,
    flows_app,
    lane_app,
    retry,
    settlements_app,
    signal,
    steer,
    submit,
)
from settled.services._cli_demo import demo_app
from settled.services._cli_dev import dev_app
from settled.services._cli_doctor import doctor
from settled.services._cli_projections import projections_app
from settled.services._cli_quarantine import quarantine_app
from settled.services._cli_runs import approvals_app, conversations_app, runs_app, submissions_app, unknown_app
from settled.services._cli_topics import topics_app
from settled.services._worker_service import worker_command

app = typer.Typer(no_args_is_help=True, help="settled: durable AI-agent conversations on Apache Kafka.")
app.add_typer(dev_app, name="dev")
app.add_typer(topics_app, name="topics")
app.add_typer(quarantine_app, name="quarantine")
app.add_typer(demo_app, name="demo")
app.command("worker")(worker_command)
app.command("api")(api_command)
app.add_typer(tokens_app, name="tokens")
app.command("submit")(submit)
app.command("abort")(abort)
app.command("signal")(signal)
app.command("steer")(steer)
app.command("approve")(approve)
app.command("deny")(deny)
app.command("retry")(retry)
app.command("doctor")(doctor)
app.add_typer(settlements_app, name="settlements")
app.add_typer(projections_app, name="projections")
app.add_typer(runs_app, name="runs")
app.add_typer(unknown_app, name="unknown")
app.add_typer(submissions_app, name="submissions")
app.add_typer(conversations_app, name="conversations")
app.add_typer(approvals_app, name="approvals")
app.add_typer(access_app, name="access")
app.add_typer(flows_app, name="flows")
app.add_typer(lane_app, name="lane")


def main() -> None:
    """Run the ``settled`` command line."""
    app()
