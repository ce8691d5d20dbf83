"""``settled worker --app package.module:app``: the conversation worker process (issue 5; docs/design.md §11)."""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import typer

from settled._metrics import WorkerMetrics, serve_metrics
from settled._settings import Settings
from settled.processors import (
    INSTANCE_FENCED_EXIT_CODE,
    MEMBERSHIP_LOST_EXIT_CODE,
    Conductor,
    InstanceFencedError,
    LedgerDecider,
    PartitionOwner,
    StaticMembershipLostError,
    Worker,
    WorkerConfig,
    load_public_key,
)
from settled.producers import StreamPublisher
from settled.protocol import PartitionState
from settled.runtime import App, load_app
from settled.services._cli_root import JsonFormatter, configure_logging, exits_on_error, resolve_settings

__all__ = ["JsonFormatter", "build_worker", "offset_clock", "worker_command"]

_log = logging.getLogger(__name__)


def build_worker(
    settings: Settings,
    app: App,
    *,
    config: WorkerConfig | None = None,
    worker_id: str | None = None,
    metrics: WorkerMetrics | None = None,
) -> Worker[PartitionState]:
    """Assemble a worker: the ledger decider and a conductor running ``app``'s agent on each owned partition.

    Args:
        settings: Namespace and Kafka settings.
        app: The agent and its limits.
        config: Loop tuning.
        worker_id: This process's id (default: a random one).
        metrics: Where the worker's metrics are kept (None: none are).

    Returns:
        The worker (not yet running).

    Raises:
        ValueError: A resolver, approver or API key is not a valid Ed25519 public key.
        UnsafeToolsError: A tool is neither idempotent nor reconcilable and no resolver key is configured (DUR-017).
    """
    app.check()
    keys = {key_id: load_public_key(text) for key_id, text in app.resolver_keys.items()}
    approvers = {key_id: load_public_key(text) for key_id, text in app.approver_keys.items()}
    apis = {key_id: load_public_key(text) for key_id, text in app.api_keys.items()}
    pool = ThreadPoolExecutor(max_workers=app.concurrency, thread_name_prefix="settled-run")
    holder: list[Worker[PartitionState]] = []

    def decider(partition: int) -> LedgerDecider:
        return LedgerDecider(
            partition=partition,
            partition_count=holder[0].partition_count,
            resolver_keys=keys,
            approver_keys=approvers,
            api_keys=apis,
            default_lane=app.lane,
        )

    if settings.clock_offset_s:  # ctx.now() and relative wait deadlines read the same offset clock (issue 16)
        app = dataclasses.replace(
            app, options=dataclasses.replace(app.options, clock=offset_clock(settings.clock_offset_s))
        )
    # ctx.emit parts and model text deltas go to the provisional <ns>.stream (issue 19; settled/producers/_stream.py).
    app = dataclasses.replace(app, options=dataclasses.replace(app.options, stream=StreamPublisher(settings)))

    def conductor(owner: PartitionOwner[PartitionState]) -> Conductor:
        return Conductor(
            owner=owner,
            agent=app.runner(),
            pool=pool,
            clock=holder[0].clock,
            max_attempts=app.max_attempts,
            attempt_backoff_base_ms=app.attempt_backoff_base_ms,
            attempt_backoff_max_ms=app.attempt_backoff_max_ms,
            tools=app.tools,
            keep_history=app.history_enabled,
        )

    extra: dict[str, Any] = {} if worker_id is None else {"worker_id": worker_id}
    if settings.clock_offset_s:
        extra["clock"] = offset_clock(settings.clock_offset_s)
    worker: Worker[PartitionState] = Worker(
        settings=settings,
        decider_factory=decider,
        config=config or WorkerConfig(),
        conductor_factory=conductor,
        metrics=metrics,
        **extra,
    )
    holder.append(worker)
    return worker


def offset_clock(offset_s: float) -> Callable[[], datetime]:
    """Return a clock (aware UTC) ``offset_s`` seconds ahead of the system's (`Settings.clock_offset_s`).

    Args:
        offset_s: The offset, in seconds (negative: behind).

    Returns:
        The clock.
    """
    offset = timedelta(seconds=offset_s)

    def now() -> datetime:
        return datetime.now(UTC) + offset

    return now


def _exit_now(code: int) -> NoReturn:
    """Flush stdout and stderr, then end the process with ``code`` at once.

    ``os._exit``: no interpreter shutdown, which would join run threads still inside a tool or a model call.
    """
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def worker_command(
    app: str = typer.Option(..., "--app", help="The app object, 'package.module:attribute' (required)."),
    worker_id: str = typer.Option("", help="This worker's id (default: random)."),
    log_level: str = typer.Option("INFO", help="Log level."),
) -> None:
    """Run a conversation worker until SIGTERM (a graceful revoke) or SIGINT; SIGUSR1 dumps every thread's stack.

    Exit codes: 0 after a graceful stop, 1 on an unhandled error, 2 when ``--app`` is missing or the app does not
    load, 75 when the turn watchdog ended a stalled worker (``SETTLED_WORKER_TURN_WATCHDOG_S``; restart it: README
    "Operating"), 78 when another worker with its ``SETTLED_WORKER_INSTANCE_ID`` fenced it (do not restart it as
    is: give each worker its own instance id), and also 75 when the broker fenced that instance id with no other
    worker holding it (a broker restart can; restart it). There is no default app: the echo app
    (``settled.testing.echo:app``) is a test app.
    """
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # diagnosing a stuck worker
    configure_logging(log_level)
    with exits_on_error():  # set-up errors by category (an app that does not load: exit 2); run()'s are unhandled
        loaded = load_app(app)
        settings = resolve_settings()
        metrics = None
        if settings.metrics_port is not None:
            metrics = WorkerMetrics()
            served = serve_metrics(metrics.registry, settings.metrics_host, settings.metrics_port)
            _log.info("metrics served", extra={"url": f"http://{settings.metrics_host}:{served.port}/metrics"})
        worker = build_worker(settings, loaded, worker_id=worker_id or None, metrics=metrics)
    worker.install_signal_handlers()
    try:
        worker.run()
    except InstanceFencedError as exc:
        # Two workers run with one SETTLED_WORKER_INSTANCE_ID: a configuration error. Exit with EX_CONFIG, which a
        # supervisor must not restart as is (the restarted one would fence the other: a crash loop between them).
        _log.critical(
            "worker fenced by another with its instance id: exiting",
            extra={"instance_id": settings.worker_instance_id, "error": str(exc)},
        )
        _exit_now(INSTANCE_FENCED_EXIT_CODE)
    except StaticMembershipLostError as exc:
        # No twin holds the instance id: the broker lost this member's join. A restart rejoins with the same id.
        _log.error(
            "worker's static membership lost, no other worker holds its instance id: exiting to be restarted",
            extra={"instance_id": settings.worker_instance_id, "error": str(exc)},
        )
        _exit_now(MEMBERSHIP_LOST_EXIT_CODE)
    except Exception:  # noqa: BLE001 - logged with its traceback, then the process exits 1
        # Exit 1 now, never a hang: run threads still inside a tool or a model call would keep the interpreter
        # from exiting (it joins the run pool's threads). The loop dropped every partition, appending nothing;
        # the next owner's claim recovers what was in flight, and a supervisor restarts this process.
        _log.exception("worker failed: exiting with 1")
        _exit_now(1)
