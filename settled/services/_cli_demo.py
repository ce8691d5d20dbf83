"""``settled demo``: the main job (issue 8) and the stack's round trip.

* ``settled demo`` / ``settled demo bfcl [--conversations N] [--category base|miss_func] [--chaos] [--seed S]
  [--workers 2] [--no-dedup] [--no-idempotency TradingBot,TravelAPI] [--adversarial]``: BFCL multi-turn
  conversations run durably through the real stack and judged in a fresh process (`settled.services.bfcl._demo`);
  exit code 0 only when every conversation passes.
* ``settled demo roundtrip``: starts the dev stack when no Kafka/Postgres is configured, commits one transaction to
  a namespaced topic, reads it back with a read_committed consumer, and stores the latency in PostgreSQL.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import typer
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from rich.console import Console

from settled._settings import Settings
from settled.producers import admin_config, producer_config, reader_config
from settled.services._cli_root import command, resolve_settings

if TYPE_CHECKING:
    from settled.services.bfcl._demo import DemoOptions

_console = Console()

__all__ = ["bfcl", "demo_app", "roundtrip"]

demo_app = typer.Typer(
    invoke_without_command=True,
    help="The main job: BFCL conversations through the real stack (default: `settled demo bfcl`).",
)


@demo_app.command("roundtrip")
@command
def roundtrip(timeout_s: float = typer.Option(30.0, help="Bound on each Kafka call, in seconds.")) -> None:
    """Start the stack if needed and run one transactional round trip through Kafka into PostgreSQL."""
    settings = resolve_settings(kafka=True, postgres=True, start=True)
    bootstrap, dsn = settings.kafka_bootstrap, settings.postgres_dsn
    _console.print(f"Kafka {bootstrap}, PostgreSQL {dsn}")
    topic = settings.topic("demo")
    admin = AdminClient(admin_config(settings))
    if topic not in admin.list_topics(timeout=timeout_s).topics:
        admin.create_topics([NewTopic(topic, 1, 1)], operation_timeout=timeout_s)[topic].result()
    producer = Producer(producer_config(settings, transactional_id=f"{settings.namespace}.{settings.app_id}.demo"))
    producer.init_transactions(timeout_s)
    marker = uuid.uuid4().hex.encode()
    started = time.monotonic()
    producer.begin_transaction()
    producer.produce(topic, key=b"demo", value=marker)
    producer.commit_transaction(timeout_s)
    consumer = Consumer(reader_config(settings, f"{settings.namespace}.demo-reader"))
    end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout_s)[1]
    consumer.assign([TopicPartition(topic, 0, max(end - 2, 0))])
    found = False
    deadline = time.monotonic() + timeout_s
    while not found and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            raise KafkaException(msg.error())
        found = msg.value() == marker
    consumer.close()
    if not found:
        _console.print(f"[red]the committed record was not read back within {timeout_s} s[/red]")
        raise typer.Exit(1)
    took_ms = (time.monotonic() - started) * 1000
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS settled_demo (at timestamptz DEFAULT now(), round_trip_ms float8)")
        conn.execute("INSERT INTO settled_demo (round_trip_ms) VALUES (%s)", (took_ms,))
        runs = conn.execute("SELECT count(*) FROM settled_demo").fetchone()
    stored = runs[0] if runs else 0
    _console.print(f"[green]OK[/green]: transactional round trip in {took_ms:.1f} ms; {stored} runs stored")


def _classes(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.split(",") if part.strip())


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
    from settled.services.bfcl._demo import render_demo, run_demo

    native_log = Settings().state_dir / "bfcl-demo" / "native-stderr.log"
    with _native_stderr_to(native_log):
        result = run_demo(options, console=_console)
    render_demo(result, _console)
    if not result.passed:
        raise typer.Exit(1)


@demo_app.command("bfcl")
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
    mode: str = typer.Option("random_chunks", "--mode", help="Replay mode: one_call, batch or random_chunks."),
    kills: int | None = typer.Option(None, "--kills", min=0, help="Worker kills under --chaos (default: N/8, >= 3)."),
    in_flight: int | None = typer.Option(
        None, "--in-flight", min=1, help="Conversations driven at once (default: 32, 12 under --chaos)."
    ),
    timeout_s: float = typer.Option(1800.0, "--timeout-s", help="Bound on the whole run, in seconds."),
) -> None:
    """Run BFCL multi-turn conversations through workers, a projector and the tool server; print the verdict."""
    from settled.services.bfcl._demo import DemoError, DemoOptions
    from settled.services.bfcl._replay import ReplayMode

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
            mode=replay_mode,
            kills=kills,
            in_flight=in_flight,
            timeout_s=timeout_s,
        )
    except DemoError as exc:
        _console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from exc
    _run_bfcl(options)


@demo_app.callback()
def demo(ctx: typer.Context) -> None:
    """The main job; without a subcommand, ``settled demo bfcl`` on the whole base set."""
    if ctx.invoked_subcommand is None:
        from settled.services.bfcl._demo import DemoOptions

        _run_bfcl(DemoOptions())
