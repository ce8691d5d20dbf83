"""``settled worker --app package.module:app``: the conversation worker process (issue 5; DESIGN.md §11)."""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import typer

from settled._settings import Settings
from settled.processors import Conductor, LedgerDecider, PartitionOwner, Worker, WorkerConfig, load_public_key
from settled.protocol import PartitionState
from settled.runtime import App, AppLoadError, load_app

__all__ = ["JsonFormatter", "build_worker", "worker_command"]

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every ``extra`` field (ids, epochs)."""

    def format(self, record: logging.LogRecord) -> str:
        """Format ``record`` as one JSON line."""
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def build_worker(
    settings: Settings, app: App, *, config: WorkerConfig | None = None, worker_id: str | None = None
) -> Worker[PartitionState]:
    """Assemble a worker: the ledger decider and a conductor running ``app``'s agent on each owned partition.

    Args:
        settings: Namespace and Kafka settings.
        app: The agent and its limits.
        config: Loop tuning.
        worker_id: This process's id (default: a random one).

    Returns:
        The worker (not yet running).

    Raises:
        ValueError: A resolver key is not a valid Ed25519 public key.
        UnsafeToolsError: A tool is neither idempotent nor reconcilable and no resolver key is configured (DUR-017).
    """
    app.check()
    keys = {key_id: load_public_key(text) for key_id, text in app.resolver_keys.items()}
    pool = ThreadPoolExecutor(max_workers=app.concurrency, thread_name_prefix="settled-run")
    holder: list[Worker[PartitionState]] = []

    def decider(partition: int) -> LedgerDecider:
        return LedgerDecider(partition=partition, partition_count=holder[0].partition_count, resolver_keys=keys)

    def conductor(owner: PartitionOwner[PartitionState]) -> Conductor:
        return Conductor(
            owner=owner,
            agent=app.runner(),
            pool=pool,
            clock=holder[0].clock,
            max_attempts=app.max_attempts,
            tools=app.tools,
            keep_history=app.history_enabled,
        )

    extra: dict[str, Any] = {} if worker_id is None else {"worker_id": worker_id}
    worker: Worker[PartitionState] = Worker(
        settings=settings,
        decider_factory=decider,
        config=config or WorkerConfig(),
        conductor_factory=conductor,
        **extra,
    )
    holder.append(worker)
    return worker


def worker_command(
    app: str = typer.Option(..., "--app", help="The app object, 'package.module:attribute' (required)."),
    worker_id: str = typer.Option("", help="This worker's id (default: random)."),
    log_level: str = typer.Option("INFO", help="Log level."),
) -> None:
    """Run a conversation worker until SIGTERM (a graceful revoke) or SIGINT; SIGUSR1 dumps every thread's stack.

    Exit codes: 0 after a graceful stop, 1 on an unhandled error, 2 when ``--app`` is missing or the app does not
    load, 75 when the turn watchdog ended a stalled worker (``SETTLED_WORKER_TURN_WATCHDOG_S``; restart it: README
    "Operating"). There is no default app: the echo app (``settled.testing.echo:app``) is a test app.
    """
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # diagnosing a stuck worker
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=log_level.upper(), handlers=[handler], force=True)
    try:
        loaded = load_app(app)
    except AppLoadError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    worker = build_worker(Settings(), loaded, worker_id=worker_id or None)
    worker.install_signal_handlers()
    worker.run()
