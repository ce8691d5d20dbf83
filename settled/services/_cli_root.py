"""The command line's composition root: settings with their services resolved, logging, and errors as exit codes.

Every ``settled`` command gets its `Settings` from `resolve_settings` — the environment's, where an empty
``SETTLED_KAFKA_BOOTSTRAP`` or ``SETTLED_POSTGRES_DSN`` means the local dev stack's service (running, or started when
the command asks to) — configures logging with `configure_logging`, and turns a `settled.SettledError` into its
message on stderr and the exit code of its category (`settled.EXIT_CODES`) with `exits_on_error`.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn, ParamSpec, TypeVar

import typer
from pydantic import BaseModel

from settled._errors import ErrorCategory, SettledError, exit_code
from settled._settings import Settings
from settled.services._devstack import DevStack

__all__ = [
    "JsonFormatter",
    "ServiceUnavailableError",
    "command",
    "configure_logging",
    "exits_on_error",
    "fail",
    "resolve_settings",
    "stack_from_settings",
]

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

P = ParamSpec("P")
R = TypeVar("R")


class ServiceUnavailableError(SettledError):
    """No Kafka broker or PostgreSQL is configured and the dev stack's is not running."""

    category = ErrorCategory.UNAVAILABLE


def stack_from_settings(settings: Settings) -> DevStack:
    """Build the dev stack that ``settings`` describes.

    Args:
        settings: The process settings (state folder, versions, ports, heap).

    Returns:
        The (not started) ``DevStack``.
    """
    return DevStack(
        state_dir=settings.state_dir,
        jar_cache_dir=settings.jar_cache_dir,
        kafka_version=settings.kafka_version,
        log4j2_version=settings.log4j2_version,
        kafka_port=settings.kafka_port,
        kafka_controller_port=settings.kafka_controller_port,
        postgres_port=settings.postgres_port,
        kafka_heap_mb=settings.kafka_heap_mb,
    )


def resolve_settings(*, kafka: bool = True, postgres: bool = False, start: bool = False) -> Settings:
    """Return the environment's settings with the services a command needs resolved.

    An empty ``kafka_bootstrap`` (``postgres_dsn``) means the local dev stack's broker (PostgreSQL).

    Args:
        kafka: The command talks to Kafka.
        postgres: The command talks to PostgreSQL.
        start: Start the dev stack when a needed service is not configured (``settled demo``); otherwise it must
            be running already.

    Returns:
        ``Settings()`` with ``kafka_bootstrap`` / ``postgres_dsn`` filled in where needed.

    Raises:
        ServiceUnavailableError: A needed service is not configured and the dev stack's is not running (and
            ``start`` is false).
        StackError: ``start`` is true and the dev stack did not start.
    """
    settings = Settings()
    need_kafka = kafka and not settings.kafka_bootstrap
    need_postgres = postgres and not settings.postgres_dsn
    if not (need_kafka or need_postgres):
        return settings
    stack = stack_from_settings(settings)
    update: dict[str, str] = {}
    if start:
        bootstrap, dsn = stack.up()
        update["kafka_bootstrap"] = settings.kafka_bootstrap or bootstrap
        update["postgres_dsn"] = settings.postgres_dsn or dsn
        return settings.model_copy(update=update)
    if need_kafka:
        broker = stack.broker()
        if not broker.is_running():
            raise ServiceUnavailableError(
                "no Kafka broker: set SETTLED_KAFKA_BOOTSTRAP, or start the local one with `settled dev up`"
            )
        update["kafka_bootstrap"] = broker.bootstrap
    if need_postgres:
        postgres_server = stack.postgres()
        if not postgres_server.is_running():
            raise ServiceUnavailableError(
                "no PostgreSQL: set SETTLED_POSTGRES_DSN, or start the local one with `settled dev up`"
            )
        update["postgres_dsn"] = postgres_server.dsn
    return settings.model_copy(update=update)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and every ``extra`` field (ids, epochs)."""

    def format(self, record: logging.LogRecord) -> str:
        """Format ``record`` as one JSON line.

        Args:
            record: The log record.

        Returns:
            The JSON text.
        """
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


def configure_logging(level: str = "INFO") -> None:
    """Send every log record to stderr as one JSON line (`JsonFormatter`), replacing any earlier handler.

    Args:
        level: The root logger's level name (``DEBUG``, ``INFO``, ...; any case).

    Raises:
        ValueError: ``level`` is not a logging level name.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def fail(error: SettledError) -> NoReturn:
    """End the command for ``error``: its receipt (if it carries one) on stdout, its message on stderr.

    Args:
        error: The error.

    Raises:
        typer.Exit: Always, with ``exit_code(error)``.
    """
    receipt = getattr(error, "receipt", None)
    if isinstance(receipt, BaseModel):  # a rejection's receipt is still the command's output
        sys.stdout.write(receipt.model_dump_json() + "\n")
        sys.stdout.flush()
    sys.stderr.write(f"settled: {error}\n")
    raise typer.Exit(exit_code(error)) from error


@contextmanager
def exits_on_error() -> Iterator[None]:
    """Turn a `SettledError` raised in the block into `fail`.

    Yields:
        Nothing.

    Raises:
        typer.Exit: A `SettledError` was raised in the block.
    """
    try:
        yield
    except SettledError as error:
        fail(error)


def command(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap a typer command so that a `SettledError` it raises ends it through `fail`.

    Args:
        fn: The command function (typer reads its signature through ``functools.wraps``).

    Returns:
        The wrapped command.
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with exits_on_error():
            return fn(*args, **kwargs)
        raise AssertionError("unreachable")  # pragma: no cover - exits_on_error re-raises as typer.Exit

    return wrapper
